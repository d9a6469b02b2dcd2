"""Nothing found is lost: crash repros replay as crashes, a campaign killed with
SIGKILL leaves every failure replayable, version drift is reported."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from etprop.verdicts import repro

ROOT = Path(__file__).resolve().parent.parent
BROKEN = str(ROOT / "tests" / "fixtures" / "broken_flows.py")
FAULTY = str(ROOT / "tests" / "fixtures" / "faulty_flows.py")


def _etprop(*args, timeout=900):
    return subprocess.run(
        [sys.executable, "-m", "etprop.commands.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


@pytest.mark.parametrize(
    "fault, stage", [("test-fault-segfault", "in lowering"), ("test-fault-runtime-segfault", "in runtime execution")]
)
def test_repro_of_a_crash_replays_in_the_worker(tmp_path, make_linear_relu_spec, fault, stage):
    """The command survives the segfault it replays and reports it as a crash."""
    path = repro.write(tmp_path / "crash.json", make_linear_relu_spec(), [fault], "mixed", "crash", script=False)
    result = _etprop("repro", "--flow-module", FAULTY, str(path), "--artifacts", str(tmp_path / "a"))
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"crash: SIGSEGV {stage}" in result.stdout and "verdict: still failing" in result.stdout


def test_repro_from_other_versions_says_so(tmp_path, make_linear_relu_spec):
    path = repro.write(tmp_path / "old.json", make_linear_relu_spec(), ["portable"], "mixed", "mismatch", script=False)
    record = json.loads(path.read_text())
    record["versions"]["executorch"] = "0.0.1"
    path.write_text(json.dumps(record))
    result = _etprop("repro", str(path), "--artifacts", str(tmp_path / "a"))
    assert "made with other versions: executorch 0.0.1 (repro) vs 1.5.1 (here)" in result.stdout, result.stdout


def test_campaign_killed_with_sigkill_leaves_every_failure_replayable(tmp_path):
    artifacts = tmp_path / "artifacts"
    campaign = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "etprop.commands.cli",
            "fuzz",
            "--reach-every",
            "0",
            "--seed",
            "0",
            "--flow-module",
            BROKEN,
            "--flows",
            "test-broken-weights",
            "--properties",
            "mixed_programs",
            "--minutes",
            "10",
            "--no-shrink",
            "--workers",
            "1",
            "--artifacts",
            str(artifacts),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and not list((artifacts / "repros").glob("*.json")):
            assert campaign.poll() is None, "the campaign ended before finding its failure"
            time.sleep(0.2)
    finally:
        os.killpg(campaign.pid, signal.SIGKILL)
        campaign.wait(timeout=30)
    found = [p for p in artifacts.rglob("*.json") if p.parent.name in ("repros", "history", "pending")]
    assert found, "no repro on disk when the campaign was killed"
    for path in found:
        repro.read(path)  # complete, valid files only: writes are atomic
    replay = _etprop("replay", "--flow-module", BROKEN, str(artifacts / "repros"), "--artifacts", str(tmp_path / "r"))
    assert replay.returncode == 1 and "still failing" in replay.stdout, replay.stdout[-2000:]


DRAW_TWICE = """
import sys
from contextlib import nullcontext
from hypothesis import given, settings, strategies as st
from etprop.strategies.reproducible import draws_independent_of_imported_source

def draws():
    seen = []
    @settings(max_examples=300, derandomize=True, database=None)
    @given(st.lists(st.integers(0, 10**6), min_size=5, max_size=5))
    def record(values):
        seen.append(values)
    record()
    return seen

context = draws_independent_of_imported_source() if sys.argv[1] == "guarded" else nullcontext()
with context:
    before = draws()
    sys.path.insert(0, sys.argv[2])
    import probe_constants
    after = draws()
print("same" if before == after else "different")
"""


@pytest.mark.parametrize("mode, expected", [("guarded", "same"), ("unguarded", "different")])
def test_draws_do_not_depend_on_which_local_modules_are_imported(tmp_path, mode, expected):
    """A module imported between two derandomized runs (as another test's
    import would be in the same worker) leaves the second run's draws equal
    to the first's; without the guard its literals change them."""
    literals = ", ".join(str(7919 * k) for k in range(1, 120))
    (tmp_path / "probe_constants.py").write_text(f"VALUES = [{literals}]\n")
    result = subprocess.run(
        [sys.executable, "-c", DRAW_TWICE, mode, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.stdout.strip() == expected, result.stdout + result.stderr
