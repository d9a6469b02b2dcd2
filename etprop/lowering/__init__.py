"""Lowering and execution: export once, lower once per flow and serialize
(``pipeline``), run a ``.pte`` on the ExecuTorch runtime
(``executorch_runtime``) or a Core AI program on coreai-core
(``coreai_runtime``), in a crash- and hang-isolated worker (``isolation``),
reporting which stage is running (``stages``).

Imports: ``etprop.program``, ``etprop.flows``, ``etprop.errors`` and the leaf
``etprop.verdicts.outcomes`` (how a stage ended); never oracles, verdicts or commands.
"""
