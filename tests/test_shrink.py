"""Shrinking saved repros (etprop shrink)."""

import json
import subprocess
import sys
from pathlib import Path

from etprop.commands import shrink
from etprop.program import spec as specmod
from etprop.program.spec import FORMAT
from etprop.verdicts import repro

ROOT = Path(__file__).resolve().parent.parent
BROKEN = str(ROOT / "tests" / "fixtures" / "broken_flows.py")


def _big_spec() -> dict:
    """Two methods, dead code, an unused input and state, a parametrized weight."""
    return {
        "format": FORMAT,
        "state": {
            "w": {
                "kind": "weight",
                "shape": [8, 8],
                "seed": 1,
                "scale": 0.3,
                "parametrizations": [{"type": "weight_norm", "dim": 0}, {"type": "scale", "factor": 2.0}],
            },
            "unused": {"kind": "weight", "shape": [3, 3], "seed": 2},
        },
        "methods": {
            "forward": {
                "inputs": [
                    {"name": "x", "shape": [2, 8], "dtype": "float32"},
                    {"name": "y", "shape": [2, 8], "dtype": "float32"},
                ],
                "nodes": [
                    {"id": "a", "op": "relu", "args": ["x"]},
                    {"id": "b", "op": "tanh", "args": ["a"]},
                    {"id": "c", "op": "linear", "args": ["b"], "state": "w"},
                    {"id": "d", "op": "sigmoid", "args": ["c"]},
                    {"id": "dead", "op": "exp_bounded", "args": ["x"]},
                ],
                "outputs": ["d", "a"],
            },
            "prefill": {
                "inputs": [{"name": "x", "shape": [4, 8], "dtype": "float32"}],
                "nodes": [{"id": "a", "op": "gelu", "args": ["x"]}],
                "outputs": ["a"],
            },
        },
    }


def test_prune_removes_dead_nodes_unused_inputs_and_state():
    pruned = shrink.prune(_big_spec())
    forward = pruned["methods"]["forward"]
    assert [n["id"] for n in forward["nodes"]] == ["a", "b", "c", "d"]
    assert [i["name"] for i in forward["inputs"]] == ["x"]
    assert set(pruned["state"]) == {"w"}
    specmod.validate(pruned)


def test_shrink_reaches_the_smallest_program_that_keeps_the_failure():
    """The 'defect' needs a linear on a weight_norm weight: everything else goes."""

    def still_fails(spec):
        linear = any(n["op"] == "linear" for _, n in specmod.all_nodes(spec))
        normed = any(p["type"] == "weight_norm" for e in spec["state"].values() for p in e.get("parametrizations", []))
        return linear and normed

    smallest = shrink.shrink(_big_spec(), still_fails, log=lambda line: None)
    assert list(smallest["methods"]) == ["forward"]
    assert [n["op"] for _, n in specmod.all_nodes(smallest)] == ["linear"]
    assert smallest["state"]["w"]["parametrizations"] == [{"type": "weight_norm", "dim": 0}]
    assert still_fails(smallest)


def test_a_node_whose_producers_no_bypass_can_remove_is_read_from_a_new_input():
    """The 'defect' needs an addmm whose bias is its weight; the amax feeding
    it changes the rank, so no argument can stand in for it: a new input of
    the amax's shape does, and the repro is the one addmm."""
    spec = {
        "format": FORMAT,
        "state": {"w": {"kind": "weight", "shape": [1, 9], "seed": 2}},
        "methods": {
            "forward": {
                "inputs": [{"name": "x", "shape": [1, 1, 1], "dtype": "float32"}],
                "nodes": [
                    {"id": "a", "op": "amax", "args": ["x"], "attrs": {"dim": 1}},
                    {"id": "b", "op": "addmm", "args": ["a"], "state": "w", "attrs": {"bias_state": "w"}},
                ],
                "outputs": ["b"],
            }
        },
    }

    def still_fails(candidate):
        return any(
            n["op"] == "addmm" and n.get("attrs", {}).get("bias_state") == n.get("state")
            for _, n in specmod.all_nodes(candidate)
        )

    smallest = shrink.shrink(spec, still_fails, log=lambda line: None)
    forward = smallest["methods"]["forward"]
    assert [n["op"] for n in forward["nodes"]] == ["addmm"]
    assert [i["shape"] for i in forward["inputs"]] == [[1, 1]]
    specmod.validate(smallest)


def test_a_shrink_cut_off_midway_has_already_handed_over_its_smallest_failing_spec():
    """A check that crashes the shrinker (an out-of-memory kill, a native
    abort) must not take the progress made before it with it."""

    def still_fails(spec):
        return any(n["op"] == "linear" for _, n in specmod.all_nodes(spec))

    checks = {"n": 0}

    def crashes_on_the_fourth_check(spec):
        checks["n"] += 1
        if checks["n"] == 4:
            raise MemoryError("the worker died")
        return still_fails(spec)

    seen = []
    try:
        shrink.shrink_to(_big_spec(), crashes_on_the_fourth_check, log=lambda line: None, on_kept=seen.append)
    except MemoryError:
        pass
    assert seen, "no progress was handed over before the crash"
    assert specmod.count_ops(seen[-1].spec) < specmod.count_ops(shrink.prune(_big_spec()))
    assert still_fails(seen[-1].spec) and not seen[-1].one_minimal


def test_shrink_keeps_the_original_when_nothing_smaller_fails():
    spec = shrink.prune(_big_spec())
    assert shrink.shrink(spec, lambda candidate: candidate == spec, log=lambda line: None) == spec


def _etprop(*args, timeout=900):
    return subprocess.run(
        [sys.executable, "-m", "etprop.commands.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def test_shrink_command_writes_a_smaller_repro_that_still_fails(tmp_path, broken_flow):
    path = repro.write(tmp_path / "r.json", _big_spec(), ["test-broken-weights"], "mixed", "mismatch")
    result = _etprop("shrink", "--flow-module", BROKEN, str(path), "--max-checks", "30")
    assert result.returncode == 0, result.stdout + result.stderr
    shrunk = json.loads((tmp_path / "r.shrunk.json").read_text())
    assert specmod.count_ops(shrunk["spec"]) < specmod.count_ops(_big_spec())
    assert len(shrunk["spec"]["methods"]) == 1 and shrunk["outcome"] == "mismatch"
    assert (tmp_path / "r.shrunk.py").exists()
    replayed = _etprop(
        "repro", "--flow-module", BROKEN, str(tmp_path / "r.shrunk.json"), "--artifacts", str(tmp_path / "a")
    )
    assert replayed.returncode == 1 and "verdict: still failing" in replayed.stdout


def test_shrink_refuses_a_repro_that_passes(tmp_path, make_linear_relu_spec):
    path = repro.write(tmp_path / "ok.json", make_linear_relu_spec(), ["portable"], "mixed", "mismatch")
    result = _etprop("shrink", str(path))
    assert result.returncode == 2 and "nothing to shrink" in result.stderr


def _quantized_spec() -> dict:
    """Two quantized layers and a tanh; the 'defect' is chosen per test."""
    layer = lambda seed, n: {
        "kind": "layer",
        "type": "Linear",
        "seed": seed,
        "kwargs": {"in_features": 8, "out_features": n, "bias": True},
    }
    return {
        "format": specmod.QUANTIZED_FORMAT,
        "quantization": {"scheme": "static_per_channel", "modules": None, "calibration": 3},
        "state": {"l0": layer(1, 8), "l1": layer(2, 4)},
        "methods": {
            "forward": {
                "inputs": [{"name": "x", "shape": [2, 8], "dtype": "float32"}],
                "nodes": [
                    {"id": "a", "op": "layer", "args": ["x"], "state": "l0"},
                    {"id": "b", "op": "tanh", "args": ["a"]},
                    {"id": "c", "op": "layer", "args": ["b"], "state": "l1"},
                ],
                "outputs": ["c"],
            }
        },
    }


def test_shrinking_drops_a_quantization_the_failure_does_not_need():
    shrunk = shrink.shrink_to(
        _quantized_spec(), lambda s: any(n["op"] == "tanh" for _, n in specmod.all_nodes(s)), log=lambda _: None
    )
    assert "quantization" not in shrunk.spec and shrunk.spec["format"] == FORMAT
    specmod.validate(shrunk.spec)


def test_shrinking_narrows_quantization_to_the_layer_that_matters():
    """Both layers stay (the 'defect' needs the program), only l1 needs quantizing."""

    def still_fails(spec):
        quantization = spec.get("quantization")
        return (
            bool(quantization)
            and "l1" in (quantization.get("modules") or spec["state"])
            and set(spec["state"]) == {"l0", "l1"}
        )

    shrunk = shrink.shrink_to(_quantized_spec(), still_fails, log=lambda _: None)
    assert shrunk.spec["quantization"] == {"scheme": "static_per_channel", "modules": ["l1"], "calibration": 1}
    specmod.validate(shrunk.spec)


def test_a_program_pt2e_cannot_quantize_is_still_a_valid_candidate(monkeypatch):
    """Shrinking a quantization error must not discard every candidate as invalid."""
    from etprop.program import quantize

    def fail(built):
        raise quantize.QuantizationFailed("pt2e", "PT2E quantization failed")

    monkeypatch.setattr(quantize, "quantized", fail)
    assert shrink._is_valid(_quantized_spec())
    monkeypatch.setattr(
        quantize, "quantized", lambda built: (_ for _ in ()).throw(quantize.QuantizationFailed("export", "rejected"))
    )
    assert not shrink._is_valid(_quantized_spec())


def test_a_candidate_a_known_finding_explains_does_not_keep_a_new_failure():
    """A new failure shrunk into a recorded finding's program would be that
    finding's repro, not this one's: such a candidate does not reproduce."""
    from etprop.oracles import Verdict
    from etprop.verdicts.check import ExampleResult, FlowResult
    from etprop.verdicts.outcomes import Outcome

    failure = shrink.Failure("xnnpack", "mismatch", "eager equivalence", None)

    def result(known):
        verdict = Verdict.failed("eager equivalence", "2 / 8 elements differ", Outcome.MISMATCH)
        return ExampleResult("mixed", {}, [FlowResult("xnnpack", Outcome.MISMATCH, [verdict], known=known)])

    assert shrink.reproduces(result(None), failure)
    assert not shrink.reproduces(result("XNN-014"), failure)
