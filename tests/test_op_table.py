"""The op table: one record per op holds every fact about it, each record
has every facet, every op is drawn and builds, and every op of ExecuTorch's
backend suite is drawn or skipped with a reason."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from etprop.program import builder, vocabulary
from etprop.program.semantic_mutants import catalogue
from etprop.program.spec import all_nodes
from etprop.program.vocabulary import OP_TABLE, ROUNDING_CLASSES
from etprop.strategies.graph import GraphDraft, ProgramDraft
from etprop.strategies.ops import DRAWERS, NOT_DRAWN
from etprop.strategies.programs import _spec, finish_method, input_values
from etprop.strategies.reproducible import draws_independent_of_imported_source

FAMILIES = {
    "gemm",
    "activation",
    "elementwise",
    "dtype",
    "binary",
    "reduction",
    "softmax",
    "view",
    "pool",
    "resample",
    "state",
    "attention",
    "index",
    "compare",
}
# Ops drawn by drawers of other names: a layer by the Linear, convolution and
# normalization drawers, pixel_unshuffle by pixel_shuffle's.
DRAWN_ELSEWHERE = {"layer": "linear", "pixel_unshuffle": "pixel_shuffle"}
DRAWER_NAMES = {name for name, _ in DRAWERS}


def _check_record(name: str, op: vocabulary.Op) -> None:
    """Every facet of ``op``, recorded as ``name``, present and consistent."""
    assert op.family in FAMILIES
    assert callable(op.render)
    assert op.rounding in ROUNDING_CLASSES
    assert (op.terms is not None) == (op.rounding == "terms"), "a terms op renders its terms' size, no other op does"
    assert op.arguments is not None or name in ("layer", "buffer_update"), "list the arguments the drawer draws"
    assert op.relative is None or (op.relative in OP_TABLE and op.relative != name)
    assert not (op.bias or op.gemm) or op.state_operand, "a GEMM reads a weight a mutant can swap"
    assert all(isinstance(attr, str) for attr in op.neutralizations)
    assert name in DRAWER_NAMES or name in DRAWN_ELSEWHERE, f"{name} has no drawer in strategies/ops.py"
    if name not in ("layer", "buffer_update"):
        assert any(mutant.op == name for mutant in catalogue()), f"{name} has no semantic mutant"


@pytest.mark.parametrize("name", sorted(OP_TABLE))
def test_every_record_has_every_facet(name):
    _check_record(name, OP_TABLE[name])


def test_the_derived_tables_follow_the_records():
    assert set(builder._EXACT) == {n for n, op in OP_TABLE.items() if op.rounding == "exact"}
    assert set(builder._SUMS) == {n for n, op in OP_TABLE.items() if op.rounding == "sums"}
    assert set(builder._TERMS) == {n for n, op in OP_TABLE.items() if op.rounding == "terms"}
    assert vocabulary.OPS == {n: (op.family, op.render) for n, op in OP_TABLE.items()}


@pytest.mark.parametrize(
    "name, broken",
    [
        ("relu", replace(OP_TABLE["relu"], rounding="terms")),  # claims cancelling terms, renders none
        ("relu", replace(OP_TABLE["relu"], relative="frobnicate")),  # a relative that is no op
        ("frobnicate", OP_TABLE["relu"]),  # no drawer, no mutant
        ("linear", replace(OP_TABLE["linear"], state_operand=False)),  # a GEMM whose weight no mutant swaps
    ],
)
def test_a_record_missing_a_facet_fails_the_record_check(name, broken):
    with pytest.raises(AssertionError):
        _check_record(name, broken)


@st.composite
def program_with(draw, op: str):
    """A small program holding ``op`` (drawn by its own drawer after a few others)."""
    drawer = dict(DRAWERS)[op]
    program = ProgramDraft()
    graph = GraphDraft(program, draw(input_values(program)), takes_new_inputs=True)
    for _ in range(draw(st.integers(0, 2))):
        name, other = draw(st.sampled_from(DRAWERS[:8]))
        other(draw, graph)
    if drawer(draw, graph) is None:
        from hypothesis import reject

        reject()
    return _spec(program, {"forward": finish_method(graph)})


@pytest.mark.parametrize("op", sorted(DRAWER_NAMES - {"parallel_twins"}))
def test_every_drawer_draws_a_program_that_builds_and_runs(op):
    seen = []

    @settings(max_examples=4, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(spec=program_with(op))
    def check(spec):
        built = builder.build(spec)
        inputs = built.inputs("forward")
        outputs = built.eager("forward", inputs)
        assert all(isinstance(value, torch.Tensor) for value in outputs)
        seen.extend(node["op"] for _, node in all_nodes(spec))

    with draws_independent_of_imported_source():
        check()
    if op in OP_TABLE:
        # What this drawer draws: its op, the ops drawn through it, a layer for a GEMM.
        accepted = {op} | {other for other, via in DRAWN_ELSEWHERE.items() if via == op}
        accepted |= {"layer"} if OP_TABLE[op].gemm else set()
        assert accepted & set(seen), seen


def _suite_operators() -> list[str]:
    spec = importlib.util.find_spec("executorch.backends.test.suite.operators")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("executorch's backend suite is not installed")
    folder = Path(list(spec.submodule_search_locations)[0])
    return sorted(path.stem[len("test_") :] for path in folder.glob("test_*.py"))


# The suite's module names for ops the vocabulary names otherwise.
SUITE_NAMES = {
    "adaptive_avgpool1d": "adaptive_avg_pool1d",
    "adaptive_avgpool2d": "adaptive_avg_pool2d",
    "adaptive_avgpool3d": "adaptive_avg_pool3d",
    "adaptive_maxpool1d": "adaptive_max_pool1d",
    "adaptive_maxpool2d": "adaptive_max_pool2d",
    "adaptive_maxpool3d": "adaptive_max_pool3d",
    "avgpool1d": "avg_pool1d",
    "avgpool2d": "avg_pool2d",
    "avgpool3d": "avg_pool3d",
    "maxpool1d": "max_pool1d",
    "maxpool2d": "max_pool2d",
    "maxpool3d": "max_pool3d",
    "convtranspose1d": "conv_transpose1d",
    "convtranspose2d": "conv_transpose2d",
    "convtranspose3d": "conv_transpose3d",
    "exp": "exp_bounded",
    "sqrt": "sqrt_abs",
    "upsample_bilinear2d": "interpolate",
    "upsample_nearest2d": "interpolate",
    "view": "reshape",
}


def test_every_op_of_executorchs_backend_suite_is_drawn_or_skipped_with_a_reason():
    operators = _suite_operators()
    assert len(operators) >= 70, operators
    missing = [
        name
        for name in operators
        if SUITE_NAMES.get(name, name) not in DRAWER_NAMES | set(DRAWN_ELSEWHERE) and name not in NOT_DRAWN
    ]
    assert not missing, f"ops of ExecuTorch's backend suite that are neither drawn nor skipped: {missing}"
    stale = [name for name in NOT_DRAWN if SUITE_NAMES.get(name, name) in DRAWER_NAMES or name not in operators]
    assert not stale, f"skips of ops that are drawn or no longer in the suite: {stale}"
    assert all(reason.strip() for reason in NOT_DRAWN.values())
