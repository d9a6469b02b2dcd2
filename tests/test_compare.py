"""What the gate counts: a candidate's result against its baseline's on one program."""

import pytest

from etprop.commands.compare import compare, improved, mismatch_facts


def _mismatch(method="forward", output=0, elements=3, eager=1.0, got=1.5, allowed=0.1):
    return (
        f"[eager equivalence] FAILED (mismatch): method '{method}', normal inputs: output {output} (2, 4): "
        f"{elements} / 8 elements differ; worst at (0, 1): eager {eager}, got {got}, allowed difference "
        f"{allowed} (jitter spread 1e-06, float64 {eager})"
    )


def _record(base, candidate):
    def flow(name, result):
        outcome, known, message = result
        return {"flow": name, "outcome": outcome, "known": known, "message": message}

    return {"property": "differential", "flows": [flow("xnnpack", base), flow("xnnpack+fold", candidate)]}


PASS = ("pass", None, "")
LOWERING = ("lowering error", None, "[lowering] FAILED (lowering error): RuntimeError: no kernel for 'x'")


@pytest.mark.parametrize(
    "base, candidate, kind",
    [
        (PASS, ("mismatch", None, _mismatch()), "newly failing"),
        (PASS, ("unsupported by ExecuTorch", None, "while_loop"), "newly unsupported"),
        (PASS, ("mismatch", "XNN-001", _mismatch()), "known finding XNN-001 newly hit"),
        (("mismatch", "XNN-001", _mismatch()), ("mismatch", "XNN-010", _mismatch()), "known finding XNN-010 newly hit"),
        (("mismatch", "XNN-001", _mismatch()), ("mismatch", None, _mismatch()), "changed failure"),
        (("mismatch", None, _mismatch()), LOWERING, "changed failure"),
        (
            LOWERING,
            ("lowering error", None, "[lowering] FAILED (lowering error): KeyError: 'weight'"),
            "changed failure",
        ),
        (("mismatch", None, _mismatch()), ("mismatch", None, _mismatch(output=1)), "changed failure"),
        (("mismatch", None, _mismatch()), ("mismatch", None, _mismatch(got=3.0)), "worse mismatch"),
        (("mismatch", None, _mismatch()), ("mismatch", None, _mismatch(elements=8)), "worse mismatch"),
    ],
)
def test_a_candidate_doing_worse_than_its_baseline_is_a_regression(base, candidate, kind):
    change = compare(_record(base, candidate))
    assert change is not None and change["kind"] == kind, change


@pytest.mark.parametrize(
    "base, candidate",
    [
        (PASS, PASS),
        (("mismatch", None, _mismatch()), PASS),
        (("mismatch", None, _mismatch()), ("mismatch", None, _mismatch(got=1.6, elements=4))),
        (("mismatch", "XNN-001", _mismatch()), ("mismatch", "XNN-001", _mismatch())),
        (LOWERING, LOWERING),
        (("crash", None, "[isolation] FAILED (crash): SIGSEGV"), ("not run", None, "not run: the worker died")),
    ],
)
def test_a_candidate_no_worse_than_its_baseline_is_not(base, candidate):
    assert compare(_record(base, candidate)) is None


def test_a_fix_is_an_improvement_and_facts_are_read_from_the_message():
    assert improved(_record(("mismatch", None, _mismatch()), PASS))
    assert not improved(_record(PASS, PASS))
    facts = mismatch_facts(_mismatch(output=2, elements=5, eager=1.0, got=1.3, allowed=0.1))
    assert facts["where"] == ("forward", 2) and facts["elements"] == 5 and facts["excess"] == pytest.approx(3.0)


def test_a_failure_naming_its_own_flow_is_the_same_failure_on_both_flows():
    """A crash message names the flow it happened in; the same crash on the
    baseline and the candidate is not a changed failure."""
    crash = "[isolation] FAILED (crash): crash: SIGABRT in runtime execution of 'forward' ({})"
    record = {
        "property": "mixed",
        "flows": [
            {"flow": "xnnpack", "outcome": "crash", "known": None, "message": crash.format("xnnpack")},
            {
                "flow": "xnnpack+fold-pkg",
                "outcome": "crash",
                "known": None,
                "message": crash.format("xnnpack+fold-pkg"),
            },
        ],
    }
    assert compare(record) is None
    record["flows"][1]["message"] = crash.format("xnnpack+fold-pkg").replace("SIGABRT", "SIGSEGV")
    assert compare(record)["kind"] == "changed failure"
