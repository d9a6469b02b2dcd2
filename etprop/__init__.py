"""etprop: property-based verification of ExecuTorch lowering.

Layers, each importing only those before it: ``program`` (spec, vocabulary,
builder) → ``lowering`` with ``flows`` and ``candidates`` → ``oracles`` →
``verdicts`` → ``commands``. ``strategies`` draw specs from the program model;
``properties`` are the pytest modules a campaign runs; ``findings`` is data.
See ARCHITECTURE.md.
"""
