"""Every recorded finding still reproduces: its standalone repro is run as a
strict expected failure, so the day ExecuTorch (or coreai) fixes a defect,
this suite reports XPASS and the finding can be retired."""

import re
import subprocess
import sys

import pytest

from etprop.commands.replay import replay_record
from etprop.verdicts import known_findings, repro
from etprop.verdicts.session import Session

FINDINGS = known_findings.load()
# Repros that other tests already replay as strict xfails (tests/test_coreai_flow.py).
REPLAYED_ELSEWHERE = {"COREAI-004", "COREAI-004b", "COREAI-005"}


def test_index_is_consistent():
    assert FINDINGS, "findings/index.json lists no findings"
    ids = [f.id for f in FINDINGS]
    assert len(ids) == len(set(ids))
    for finding in FINDINGS:
        assert finding.repro_path.is_file(), finding.repro
        if finding.note:
            assert (known_findings.FINDINGS_DIR / finding.note).is_file(), finding.note


def test_the_repro_command_writes_both_scripts(tmp_path):
    """The scripts `etprop repro --script/--standalone` write are the ones the
    per-finding test makes in-process (the standalone one embeds values computed
    where it is written, so it is compared by what it decides), and both run."""
    finding = next(f for f in FINDINGS if f.id == "KERNELS-001")
    spec_repro = finding.repro_path
    record = repro.read(spec_repro)
    for kind in ("--script", "--standalone"):
        written = _cli("repro", str(spec_repro), kind, str(tmp_path / f"{kind[2:]}.py"))
        assert written.returncode == 0, written.stderr[-1500:]
    assert (tmp_path / "script.py").read_text() == repro.etprop_script(record, spec_repro.name)
    completed = _run_script(tmp_path / "script.py", tmp_path)
    assert completed.returncode == 1 and "still failing" in completed.stdout, completed.stdout + completed.stderr
    alone = _run_script(tmp_path / "standalone.py", tmp_path)
    assert alone.returncode == 1 and f"VERDICT: {finding.outcome}" in alone.stdout, alone.stdout + alone.stderr


# Outcomes a standalone script judges (equivalence and the stages before it);
# structural oracles (storage, cycles, coverage) need etprop.
STANDALONE_JUDGES = {
    "mismatch",
    "lowering error",
    "load error",
    "run error",
    "export error",
    "crash",
    "quantization error",
}


def _cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "etprop.commands.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def _run_script(path, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", str(path)], capture_output=True, text=True, timeout=600, cwd=cwd)


@pytest.mark.parametrize(
    "body",
    [
        "print('judged'); sys.exit(3)",
        "raise ValueError('no verdict')",
        "import os; os.abort()",
        "import os; print(os.getcwd(), sys.flags.isolated, sys.argv[0].endswith('script.py'), __name__)",
        "print(sys.stdin.read() == '')",
    ],
    ids=["exit code", "uncaught exception", "killed by a signal", "cwd, flags, argv, name", "stdin"],
)
def test_the_warm_script_runner_reports_what_a_fresh_interpreter_reports(script_runner, tmp_path, body):
    """The standalone scripts run in forks of a warm interpreter: each must end
    with the return code, output and surroundings ``python -I`` gives it."""
    script = tmp_path / "script.py"
    script.write_text(f"import sys\n{body}\n")
    fresh = subprocess.run(
        [sys.executable, "-I", str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    warm = script_runner.run(script, tmp_path)
    assert (warm.returncode, warm.stdout) == (fresh.returncode, fresh.stdout)
    assert warm.stderr.splitlines()[-1:] == fresh.stderr.splitlines()[-1:]


def test_the_warm_script_runner_stops_a_script_at_its_timeout(script_runner, tmp_path):
    script = tmp_path / "slow.py"
    script.write_text("import time\ntime.sleep(30)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        script_runner.run(script, tmp_path, timeout=1)
    quick = tmp_path / "quick.py"
    quick.write_text("print('after')\n")
    assert script_runner.run(quick, tmp_path).stdout == "after\n", "the runner serves on after a timeout"


@pytest.fixture(scope="module")
def replay_session(tmp_path_factory):
    """One isolated worker per test process replays every spec repro, as the
    ``--script`` script does in a process of its own (the same replay_record)."""
    session = Session(tmp_path_factory.mktemp("replay"))
    yield session
    session.close()


@pytest.mark.parametrize("finding", [f for f in FINDINGS if f.id not in REPLAYED_ELSEWHERE], ids=lambda f: f.id)
def test_finding_still_reproduces_its_own_symptom(finding, tmp_path, replay_session, script_runner, capsys):
    """A strict known failure: the repro must fail with the finding's own
    outcome and message (any other failure, an import error or a missing name,
    fails this test), and once the defect is fixed this test fails too, so the
    finding gets retired. A spec repro is replayed as its ``--script`` script
    replays it (through etprop: every oracle of its property, attribution by
    neutralizing the finding's cause) and by the ``--standalone`` script made
    from it (torch and executorch, expected values embedded; run in a fork of
    a warm interpreter, see tests/script_server.py), which must reach the
    same verdict. A script repro must exit 1, with no exception but the
    AssertionError that shows the symptom."""
    spec_repro = finding.repro_path.with_suffix(".json")
    if spec_repro.exists():
        record = repro.read(spec_repro)
        standalone = tmp_path / "standalone.py"
        standalone.write_text(repro.standalone_script(record["spec"], record["flows"][-1]))
        replayed = replay_record(record, spec_repro.name, tmp_path, verbose=True, session=replay_session)
        completed = subprocess.CompletedProcess([], 1 if replayed.still_failing else 0, capsys.readouterr().out, "")
    else:
        completed = _run_script(finding.repro_path, tmp_path)
    if completed.returncode == 0:
        pytest.fail(f"{finding.id} no longer reproduces (fixed upstream?): {completed.stdout[-500:]}")
    raised = re.findall(r"^([A-Za-z_][\w.]*(?:Error|Exception))\b", completed.stderr, re.M)
    assert completed.returncode == 1 and raised in ([], ["AssertionError"]), (
        f"{finding.id}'s repro failed for another reason:\n{completed.stderr[-1500:]}"
    )
    if spec_repro.exists():
        assert f"now: {finding.outcome})" in completed.stdout, completed.stdout[-1500:]
        assert re.search(finding.pattern, completed.stdout, re.S), completed.stdout[-1500:]
        if finding.status == "confirmed":
            assert f"(known finding {finding.id})" in completed.stdout, (
                f"neutralizing {finding.id}'s cause did not make its own repro pass:\n{completed.stdout[-1500:]}"
            )
        alone = script_runner.run(standalone, tmp_path)
        verdict = (
            "crash"
            if alone.returncode < 0
            else next(
                (line.split(":")[1].strip() for line in alone.stdout.splitlines() if line.startswith("VERDICT:")), None
            )
        )
        if finding.outcome in STANDALONE_JUDGES:
            assert verdict == finding.outcome and alone.returncode != 0, (
                f"the standalone script says {verdict!r}, the suite {finding.outcome!r}:\n"
                f"{alone.stdout[-1500:]}\n{alone.stderr[-1500:]}"
            )
            if verdict != "crash":
                assert re.search(finding.pattern, alone.stdout + alone.stderr, re.S), alone.stdout[-1500:]
        else:
            assert verdict is not None, alone.stderr[-1500:]
    pytest.xfail(f"{finding.id} reproduces: {finding.outcome}, /{finding.pattern}/")


def test_signature_nominates_only_its_own_kind_of_program():
    message = "output 0 (3, 4): 12 / 12 elements differ"
    spec = {
        "state": {},
        "methods": {
            "forward": {"nodes": [{"id": "v0", "op": "addmm", "args": ["x"], "attrs": {"alpha": 2.0}, "state": "w"}]}
        },
    }
    assert [f.id for f in known_findings.nominate("xnnpack", "mismatch", message, spec)] == ["XNN-001"]
    assert known_findings.nominate("xnnpack", "mismatch", "NaN positions differ", spec) == []
    assert known_findings.nominate("xnnpack+fold", "mismatch", message, spec) == []
    spec["methods"]["forward"]["nodes"][0]["attrs"] = {}
    assert known_findings.nominate("xnnpack", "mismatch", message, spec) == []
