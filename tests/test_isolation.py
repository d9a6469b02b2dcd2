"""Fault injection: a campaign survives native crashes, hangs and garbage,
classifies each, and loses no repro."""

import json
from pathlib import Path

import pytest

from etprop import flows
from etprop.oracles.sets import SINGLE_FLOW
from etprop.verdicts.outcomes import Outcome
from etprop.verdicts.session import Session

FAULTY = str(Path(__file__).parent / "fixtures" / "faulty_flows.py")


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    flows.load_flow_module(FAULTY)
    session = Session(tmp_path_factory.mktemp("isolation"), isolated=True, flow_modules=[FAULTY])
    yield session
    session.close()


@pytest.mark.parametrize(
    "fault, outcome, message",
    [
        ("test-fault-segfault", Outcome.CRASH, "crash: SIGSEGV in lowering (test-fault-segfault)"),
        ("test-fault-abort", Outcome.CRASH, "crash: SIGABRT in lowering (test-fault-abort)"),
        ("test-fault-hang", Outcome.TIMEOUT, "timeout: after 8 s in lowering (test-fault-hang)"),
        ("test-fault-raise", Outcome.LOWERING_ERROR, "RuntimeError: injected"),
        ("test-fault-runtime-segfault", Outcome.CRASH, "crash: SIGSEGV in runtime execution of 'forward'"),
        ("test-fault-garbage", Outcome.MISMATCH, "elements differ"),
        ("test-fault-flaky", Outcome.NONDETERMINISTIC, "identical runs disagree"),
    ],
)
def test_campaign_survives_and_classifies(session, tiny_spec, monkeypatch, fault, outcome, message):
    monkeypatch.setenv("ETPROP_EXAMPLE_TIMEOUT", "8")
    with pytest.raises(AssertionError) as failure:
        session.check(tiny_spec, [flows.get(fault)], "mixed", SINGLE_FLOW)
    assert failure.value.verdict.outcome is outcome
    assert message in str(failure.value)
    repro = session.artifacts.repro_path("mixed", fault, outcome)
    record = json.loads(repro.read_text())
    assert record["spec"] == tiny_spec and record["outcome"] == outcome.value
    assert not list((session.artifacts.root / "pending").glob("*.json")) or outcome in (Outcome.CRASH, Outcome.TIMEOUT)
    # the same session goes on working after the fault
    assert session.check(tiny_spec, [flows.get("portable")], "mixed", SINGLE_FLOW).results[0].outcome is Outcome.PASS


def test_flows_the_worker_died_before_judging_are_not_run(session, tiny_spec):
    """portable was lowered and judged in the worker, but its verdict died with it."""
    result = session.run(
        tiny_spec, [flows.get("portable"), flows.get("test-fault-runtime-segfault")], "mixed", SINGLE_FLOW
    )
    assert [r.outcome for r in result.results] == [Outcome.NOT_RUN, Outcome.CRASH]
    assert "not run" in result.results[0].message


UNGUARDED_SCRIPT = """
from pathlib import Path
from etprop import flows
from etprop.oracles.sets import SINGLE_FLOW
from etprop.verdicts.session import Session

spec = {"format": "etprop-spec/1", "state": {}, "methods": {"forward": {
    "inputs": [{"name": "x", "shape": [2, 8], "dtype": "float32"}],
    "nodes": [{"id": "a", "op": "relu", "args": ["x"]}], "outputs": ["a"]}}}
session = Session(Path(ARTIFACTS))
try:
    session.run(spec, [flows.get("portable")], "mixed", SINGLE_FLOW)
finally:
    session.close()
"""


def test_a_worker_that_cannot_start_is_etprops_error_naming_the_fix_not_a_crash_verdict(tmp_path):
    """A script without a ``__main__`` guard makes the forkserver re-run it,
    and the worker dies before its first job: that says nothing about the flow."""
    import subprocess
    import sys

    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED_SCRIPT.replace("ARTIFACTS", repr(str(tmp_path / "artifacts"))))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode != 0
    assert "WorkerStartFailed" in result.stderr and 'if __name__ == "__main__":' in result.stderr
    recorded = [
        json.loads(line)
        for path in (tmp_path / "artifacts" / "results").glob("*.jsonl")
        for line in path.read_text().splitlines()
    ]
    # The parent records it; so may the re-run script in the failing child.
    assert {f["outcome"] for r in recorded for f in r["flows"]} == {"etprop internal error"}
