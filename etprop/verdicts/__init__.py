"""Verdicts: one example checked on its flows with every oracle (``check``,
``session``), how it ended (``outcomes``), whether a failure is a recorded
finding (``known_findings``) and the repro files that keep it (``repro``).

Imports: program, lowering, flows and oracles; never commands, strategies or
properties. ``outcomes`` is a leaf every layer may import.
"""
