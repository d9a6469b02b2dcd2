"""The structural mutants (benchmarks/structural_mutant_flows.py) lower right
in numbers and wrong in structure; each is killed, by the oracle that guards
that structure, on a program that shows it, where stock XNNPACK passes."""

from pathlib import Path

import pytest

from etprop import flows
from etprop.oracles.sets import MULTI_METHOD, SINGLE_FLOW
from etprop.program.spec import FORMAT
from etprop.verdicts.check import Artifacts, run_example

MUTANT_FLOWS = Path(__file__).parents[1] / "benchmarks" / "structural_mutant_flows.py"


def _program(nodes, outputs, methods=("forward",)):
    body = {"inputs": [{"name": "x", "shape": [4, 16], "dtype": "float32"}], "nodes": nodes, "outputs": outputs}
    return {
        "format": FORMAT,
        "state": {"w": {"kind": "weight", "shape": [16, 16], "seed": 3, "scale": 0.3}},
        "methods": {method: body for method in methods},
    }


TWO_LINEARS = [
    {"id": "v1", "op": "linear", "args": ["x"], "state": "w"},
    {"id": "v2", "op": "tanh", "args": ["v1"]},
    {"id": "v3", "op": "linear", "args": ["v2"], "state": "w"},
]
# var stays on portable kernels, between two XNNPACK partitions.
PORTABLE_BETWEEN = [
    {"id": "v1", "op": "linear", "args": ["x"], "state": "w"},
    {"id": "v2", "op": "var", "args": ["v1"], "attrs": {"dim": -1, "keepdim": True}},
    {"id": "v3", "op": "add", "args": ["v1", "v2"]},
    {"id": "v4", "op": "linear", "args": ["v3"], "state": "w"},
]


@pytest.mark.parametrize(
    "mutant, spec, prop, oracle, words",
    [
        (
            "mutant-gemm-on-portable",
            _program(TWO_LINEARS, ["v3"]),
            "mixed",
            "delegation coverage",
            "(mm, static weight)",
        ),
        (
            "mutant-weight-twice",
            _program(TWO_LINEARS, ["v3"], ("forward", "other")),
            "multi_method",
            "no program growth",
            "stored 2 times",
        ),
        ("mutant-cyclic-partition", _program(PORTABLE_BETWEEN, ["v4"]), "mixed", "lowering", "cycles"),
    ],
)
def test_each_structural_mutant_is_killed_where_stock_xnnpack_passes(tmp_path, mutant, spec, prop, oracle, words):
    flows.load_flow_module(str(MUTANT_FLOWS))
    oracles = MULTI_METHOD if prop == "multi_method" else SINGLE_FLOW
    stock = run_example(spec, [flows.get("xnnpack")], prop, oracles, Artifacts(tmp_path / "stock"))
    assert stock.results[0].outcome.value == "pass", stock.results[0].message
    broken = run_example(spec, [flows.get(mutant)], prop, oracles, Artifacts(tmp_path / "mutant")).results[0]
    assert broken.outcome.value == "property violation", broken.message
    failed = [verdict for verdict in broken.verdicts if not verdict.ok]
    assert oracle in [verdict.oracle for verdict in failed] and words in broken.message
