"""Mutants (etprop.program.mutants) are real faults: each changes what it names
and nothing else, an invisible change is not counted, and the equivalence
policy catches every kind on a small program whose unmutated outputs pass."""

import random

import pytest
import torch

from etprop.oracles import tolerance
from etprop.program import builder, mutants
from etprop.program.spec import FORMAT


def mutant_target_spec() -> dict:
    """Linear(8, 6) -> gelu(tanh) -> add(alpha=2) with the Linear's output ->
    softmax over dim 1, and a functional linear with a bias on the side."""
    return {
        "format": FORMAT,
        "state": {
            "l0": {
                "kind": "layer",
                "type": "Linear",
                "seed": 1,
                "kwargs": {"in_features": 8, "out_features": 6, "bias": True},
            },
            "w1": {"kind": "weight", "shape": [3, 8], "seed": 2},
            "b1": {"kind": "weight", "shape": [3], "seed": 3},
        },
        "methods": {
            "forward": {
                "inputs": [{"name": "x", "shape": [2, 8], "dtype": "float32"}],
                "nodes": [
                    {"id": "v0", "op": "layer", "args": ["x"], "state": "l0"},
                    {"id": "v1", "op": "gelu", "args": ["v0"], "attrs": {"approximate": "tanh"}},
                    {"id": "v2", "op": "add", "args": ["v1", "v0"], "attrs": {"alpha": 2.0}},
                    {"id": "v3", "op": "softmax", "args": ["v2"], "attrs": {"dim": 1}},
                    {"id": "v4", "op": "linear", "args": ["x"], "state": "w1", "attrs": {"bias_state": "b1"}},
                ],
                "outputs": ["v3", "v4"],
            }
        },
    }


def _wide(spec, state, inputs):
    built = builder.build(spec)
    built.module.load_state_dict(state, strict=False)
    built.__post_init__()
    return built._wide("forward", inputs, True)


@pytest.fixture(scope="module")
def original():
    built = builder.build(mutant_target_spec())
    inputs = built.inputs("forward", "normal")
    reference = built.reference("forward", inputs, True, tolerance.op_ulps("executorch", "float32"))
    return built, inputs, reference


def test_unmutated_outputs_pass(original):
    _, _, reference = original
    assert tolerance.judge(reference, reference.expected).problem is None


@pytest.mark.parametrize("kind", mutants.SPEC_MUTANTS)
def test_every_spec_mutant_is_caught(original, kind):
    built, inputs, reference = original
    options = mutants.mutate_spec(kind, built.spec, random.Random(0))
    assert options, f"no {kind} mutant of the target program"
    caught = []
    for mutated, description in options:
        try:
            wide = _wide(mutated, built.module.state_dict(), inputs)
        except Exception:
            continue
        changed = mutants.apply_delta(reference.expected, reference.wide, wide)
        if changed is None:
            continue
        caught.append((description, tolerance.judge(reference, changed).problem))
    assert caught, f"no {kind} mutant changes the result"
    assert all(problem for _, problem in caught), caught


def test_spec_mutants_change_only_what_they_name():
    spec = mutant_target_spec()
    rng = random.Random(0)
    descriptions = {kind: [d for _, d in mutants.mutate_spec(kind, spec, rng)] for kind in mutants.SPEC_MUTANTS}
    assert sorted(descriptions["drop_bias"]) == ["layer l0 without its bias", "linear v4 without its bias"]
    assert descriptions["switch_approximation"] == ["gelu v1 approximate='none'"]
    assert sorted(descriptions["reset_argument"]) == [
        "add v2 with alpha back to its default",
        "gelu v1 with approximate back to its default",
    ]
    for mutated, description in mutants.mutate_spec("reset_argument", spec, rng):
        changed = [
            (a, b)
            for a, b in zip(spec["methods"]["forward"]["nodes"], mutated["methods"]["forward"]["nodes"])
            if a != b
        ]
        assert len(changed) == 1 and mutated["state"] == spec["state"], description
    assert spec == mutant_target_spec(), "mutate_spec changed its argument"


def test_output_mutants():
    rng = random.Random(0)
    value = torch.arange(12, dtype=torch.float32).reshape(2, 3, 2) + 1
    scaled = mutants.mutate_outputs("scale_element", [value], rng)[0]
    differs = (scaled != value).nonzero()
    assert len(differs) == 1
    at = tuple(differs[0].tolist())
    assert scaled[at] == pytest.approx(float(value[at]) * (1 + 3e-4))
    swapped = mutants.mutate_outputs("swap_channels", [value], rng)[0]
    assert sorted(swapped.sum((0, 2)).tolist()) == sorted(value.sum((0, 2)).tolist())
    assert not torch.equal(swapped, value)
    assert mutants.mutate_outputs("scale_element", [torch.zeros(4)], rng) is None
    assert mutants.mutate_outputs("swap_channels", [torch.ones(2, 3)], rng) is None


def test_invisible_changes_do_not_count():
    before = torch.tensor([1.0, 2.0, 0.0], dtype=torch.float64)
    assert mutants.apply_delta([before.float()], [before], [before * (1 + 1e-12)]) is None
    moved = mutants.apply_delta([before.float()], [before], [before + torch.tensor([0.0, 0.5, 0.0])])
    assert moved[0].tolist() == [1.0, 2.5, 0.0]
    assert mutants.apply_delta([before.half()], [before], [before * (1 + 1e-4)]) is None
