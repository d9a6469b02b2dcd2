"""Integer and bool values (format etprop-spec/3): inputs that are ids,
indices and masks, intermediates that are indices and comparisons, integer
outputs judged exactly, and the shrinker keeping indices in range."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from etprop import flows
from etprop.commands import shrink
from etprop.lowering import pipeline
from etprop.lowering.executorch_runtime import runner_for
from etprop.oracles import equivalence
from etprop.program import builder
from etprop.program import spec as specmod
from etprop.strategies.graph import GraphDraft, ProgramDraft, Value
from etprop.verdicts.outcomes import Outcome


def _spec(inputs: list[dict], nodes: list[dict], outputs: list[str], state: dict | None = None) -> dict:
    spec = {"state": state or {}, "methods": {"forward": {"inputs": inputs, "nodes": nodes, "outputs": outputs}}}
    spec["format"] = specmod.format_for(spec)
    return spec


LOOKUP = _spec(
    [{"name": "x", "shape": [3, 5], "dtype": "float32"}, {"name": "ids", "shape": [4], "dtype": "int64", "high": 3}],
    [
        {"id": "v0", "op": "argmax", "args": ["x"], "attrs": {"dim": -1}},
        {"id": "v1", "op": "index_select", "args": ["x"] + ["ids"], "attrs": {"dim": 0}},
        {"id": "v2", "op": "gt", "args": ["v1"], "attrs": {"scalar": 0.0}},
        {"id": "v3", "op": "masked_fill", "args": ["v1", "v2"], "attrs": {"value": -1.0}},
        {"id": "v4", "op": "embedding", "args": ["v0"], "state": "w0"},
    ],
    ["v0", "v3", "v4"],
    {"w0": {"kind": "weight", "shape": [5, 2], "seed": 1}},
)


def test_the_format_is_the_oldest_that_describes_the_program():
    assert LOOKUP["format"] == specmod.INTEGER_FORMAT
    specmod.validate(LOOKUP)
    floats_only = _spec([{"name": "x", "shape": [2], "dtype": "float32"}], [], ["x"])
    assert floats_only["format"] == specmod.FORMAT
    assert specmod.format_for({**floats_only, "quantization": {"scheme": "static_per_tensor"}}) == (
        specmod.QUANTIZED_FORMAT
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: s.update(format=specmod.FORMAT), "schema etprop-spec-1"),
        (lambda s: s["methods"]["forward"]["inputs"][1].pop("high"), "schema etprop-spec-3"),
        (lambda s: s["methods"]["forward"]["inputs"][1].update(high=0), "schema etprop-spec-3"),
        (lambda s: s["methods"]["forward"]["inputs"][1].update(dtype="int8"), "schema etprop-spec-3"),
    ],
    ids=["integer input in a /1 spec", "no bound", "empty range", "unknown dtype"],
)
def test_an_integer_input_the_format_cannot_describe_is_one_error(change, message):
    spec = copy.deepcopy(LOOKUP)
    change(spec)
    with pytest.raises(specmod.SpecError, match=message):
        specmod.validate(spec)


def test_integer_inputs_stay_in_their_range_and_reach_its_edges():
    built = builder.build(LOOKUP)
    ids = {kind: built.inputs("forward", kind)[1] for kind in builder.INPUT_KINDS_DEFAULT}
    assert all(value.dtype == torch.int64 and 0 <= int(value.min()) and int(value.max()) < 3 for value in ids.values())
    assert ids["zeros"].eq(0).all() and ids["large"].eq(2).all()
    mask = builder.build(_spec([{"name": "m", "shape": [64], "dtype": "bool"}], [], ["m"])).inputs("forward")[0]
    assert mask.dtype == torch.bool and 0 < int(mask.sum()) < 64


@settings(max_examples=1, database=None, deadline=None)
@given(st.data())
def test_a_method_draws_integer_inputs_and_values_and_float_ops_never_read_them(data):
    program = ProgramDraft()
    graph = GraphDraft(program, [Value("x0", (3, 4))], takes_new_inputs=True)
    index = graph.add("argmax", [graph.values[0]], {"dim": 1}, high=4)
    assert (index.dtype, index.high, index.shape) == ("int64", 4, (3,))
    ids = graph.new_input((2,), "int32", high=3)
    assert ids.name in {v.name for v in graph.inputs} and ids.high == 3
    for _ in range(3):
        assert graph.pick(data.draw).name == "x0", "a float op reads the one float value, not the integer ones"
        assert graph.pick(data.draw, dtypes=("int64", "int32")).name in (index.name, ids.name)
    assert graph.leaves() == [index.name], "an integer result nobody reads is an output"
    body = GraphDraft(program, [Value("a0", (3, 4))])
    assert body.new_input((2,), "int64", high=3) is None, "a control-flow body's parameters are fixed"


def _lowered(flow: str):
    lowering = pipeline.lower(builder.build(LOOKUP), flows.get(flow))
    assert lowering.ok, lowering.error
    return lowering


class _Altered:
    def __init__(self, lowering, change):
        self.inner, self.change = runner_for(lowering), change

    def run(self, method, inputs):
        return self.change(list(self.inner.run(method, inputs)))


def _off_by_one(outputs):
    outputs[0] = (outputs[0] + 1) % 5
    return outputs


def _mask_inverted(outputs):
    # The fill where the comparison is false: the values of the other branch.
    outputs[1] = torch.where(outputs[1] == -1.0, torch.full_like(outputs[1], 0.5), torch.full_like(outputs[1], -1.0))
    return outputs


@pytest.mark.parametrize("change", [_off_by_one, _mask_inverted], ids=["argmax off by one", "mask inverted"])
def test_integer_values_lowered_wrong_are_a_mismatch(change):
    lowering = _lowered("portable")
    assert equivalence.check(lowering).ok
    verdict = equivalence.check(lowering, runner=_Altered(lowering, change))
    assert verdict.outcome is Outcome.MISMATCH, verdict.message


def test_an_argmax_among_ties_may_pick_any_of_them():
    """On all-zero inputs every index is the largest: a backend that picks the
    last where eager picks the first is right."""
    spec = _spec(
        [{"name": "x", "shape": [2, 6], "dtype": "float32"}],
        [{"id": "v0", "op": "argmax", "args": ["x"], "attrs": {"dim": 1}}],
        ["v0"],
    )
    lowering = pipeline.lower(builder.build(spec), flows.get("portable"))
    assert lowering.ok, lowering.error
    last = _Altered(lowering, lambda outputs: [torch.full_like(outputs[0], 5)])
    assert equivalence.check(lowering, runner=last, kinds=("zeros",)).ok
    assert not equivalence.check(lowering, runner=last, kinds=("normal",)).ok


def test_a_cut_integer_value_becomes_an_input_within_its_range():
    """The shrinker reads a node's value from a new input instead: an index
    gets the bound its values had, so what it indexes stays in range."""
    spec = _spec(
        [{"name": "x", "shape": [3, 5], "dtype": "float32"}],
        [
            {"id": "v0", "op": "argmax", "args": ["x"], "attrs": {"dim": 0}},
            {"id": "v1", "op": "index_select", "args": ["x", "v0"], "attrs": {"dim": 0}},
        ],
        ["v1"],
    )
    assert spec["format"] == specmod.FORMAT
    cuts = dict(shrink._cuts(spec))
    cut = next(spec for description, spec in cuts.items() if description.startswith("read argmax"))
    assert cut["format"] == specmod.INTEGER_FORMAT
    specmod.validate(cut)
    (entry,) = [inp for inp in cut["methods"]["forward"]["inputs"] if inp["name"] == "cut_v0"]
    assert entry["dtype"] == "int64" and 1 <= entry["high"] <= 3
    built = builder.build(cut)
    for kind in builder.INPUT_KINDS_DEFAULT:
        built.eager("forward", built.inputs("forward", kind))


def test_an_index_input_is_read_for_another_only_within_its_bound():
    spec = _spec(
        [
            {"name": "x", "shape": [3], "dtype": "float32"},
            {"name": "wide", "shape": [2], "dtype": "int64", "high": 3},
            {"name": "narrow", "shape": [2], "dtype": "int64", "high": 2},
        ],
        [
            {"id": "v0", "op": "index_select", "args": ["x", "wide"], "attrs": {"dim": 0}},
            {"id": "v1", "op": "index_select", "args": ["v0", "narrow"], "attrs": {"dim": 0}},
        ],
        ["v1"],
    )
    merges = [description for description, _ in shrink._simplifications(spec) if description.startswith("read input")]
    assert merges == ["read input narrow for wide in forward"]


def test_a_standalone_repro_of_an_integer_program_reaches_the_suites_verdict(tmp_path, script_runner):
    """The standalone script regenerates the integer inputs (ids in range,
    masks) and judges the integer outputs as the suite does."""
    from etprop.verdicts import repro

    script = tmp_path / "standalone.py"
    script.write_text(repro.standalone_script(LOOKUP, "portable"))
    completed = script_runner.run(script, tmp_path)
    assert completed.returncode == 0 and "VERDICT: pass" in completed.stdout, completed.stdout + completed.stderr


def test_a_repro_of_an_integer_program_is_written_and_read_back(tmp_path):
    from etprop.verdicts import repro

    path = repro.write(tmp_path / "lookup.json", LOOKUP, ["portable"], "mixed", "mismatch", "planted", script=False)
    assert repro.read(path)["spec"] == LOOKUP
