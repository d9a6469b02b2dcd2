"""Every recorded finding still reproduces: its standalone repro is run as a
strict expected failure, so the day ExecuTorch (or coreai) fixes a defect,
this suite reports XPASS and the finding can be retired."""

import re
import subprocess
import sys

import pytest

from etprop.verdicts import known_findings

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


@pytest.mark.parametrize("finding", [f for f in FINDINGS if f.id not in REPLAYED_ELSEWHERE],
                         ids=lambda f: f.id)
def test_finding_still_reproduces_its_own_symptom(finding, tmp_path):
    """A strict known failure: the repro must fail with the finding's own
    outcome and message (any other failure, an import error or a missing name,
    fails this test), and once the defect is fixed this test fails too, so the
    finding gets retired. A spec repro replays through ``etprop repro``, which
    runs every oracle of its property and attributes the failure by
    neutralizing the finding's cause; a script repro must exit 1, with no
    exception but the AssertionError that shows the symptom."""
    spec_repro = finding.repro_path.with_suffix(".json")
    command = ([sys.executable, "-m", "etprop.commands.cli", "repro", str(spec_repro), "--artifacts", str(tmp_path)]
               if spec_repro.exists() else [sys.executable, str(finding.repro_path)])
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if completed.returncode == 0:
        pytest.fail(f"{finding.id} no longer reproduces (fixed upstream?): {completed.stdout[-500:]}")
    raised = re.findall(r"^([A-Za-z_][\w.]*(?:Error|Exception))\b", completed.stderr, re.M)
    assert completed.returncode == 1 and raised in ([], ["AssertionError"]), \
        f"{finding.id}'s repro failed for another reason:\n{completed.stderr[-1500:]}"
    if spec_repro.exists():
        assert f"now: {finding.outcome})" in completed.stdout, completed.stdout[-1500:]
        assert re.search(finding.pattern, completed.stdout, re.S), completed.stdout[-1500:]
        if finding.status == "confirmed":
            assert f"(known finding {finding.id})" in completed.stdout, \
                f"neutralizing {finding.id}'s cause did not make its own repro pass:\n{completed.stdout[-1500:]}"
    pytest.xfail(f"{finding.id} reproduces: {finding.outcome}, /{finding.pattern}/")


def test_signature_nominates_only_its_own_kind_of_program():
    message = "output 0 (3, 4): 12 / 12 elements differ"
    spec = {"state": {}, "methods": {"forward": {"nodes": [
        {"id": "v0", "op": "addmm", "args": ["x"], "attrs": {"alpha": 2.0}, "state": "w"}]}}}
    assert [f.id for f in known_findings.nominate("xnnpack", "mismatch", message, spec)] == ["XNN-001"]
    assert known_findings.nominate("xnnpack", "mismatch", "NaN positions differ", spec) == []
    assert known_findings.nominate("xnnpack+fold", "mismatch", message, spec) == []
    spec["methods"]["forward"]["nodes"][0]["attrs"] = {}
    assert known_findings.nominate("xnnpack", "mismatch", message, spec) == []


def test_a_standalone_script_is_generated_on_demand_and_reproduces(tmp_path):
    """``etprop repro --standalone`` writes a script that needs only torch and
    executorch and reaches the same verdict as the suite on a finding's spec."""
    finding = next(f for f in FINDINGS if f.id == "EXIR-001")
    script = tmp_path / "exir_001.py"
    written = subprocess.run([sys.executable, "-m", "etprop.commands.cli", "repro", str(finding.repro_path),
                              "--standalone", str(script), "--flow", "portable"],
                             capture_output=True, text=True, timeout=120)
    assert written.returncode == 0, written.stderr[-1500:]
    ran = subprocess.run([sys.executable, "-I", str(script)], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path)
    assert ran.returncode == 1, ran.stderr[-1500:]
    assert "VERDICT: mismatch" in ran.stdout
