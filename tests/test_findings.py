"""Every recorded finding still reproduces: its standalone repro is run as a
strict expected failure, so the day ExecuTorch (or coreai) fixes a defect,
this suite reports XPASS and the finding can be retired."""

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
@pytest.mark.xfail(strict=True, reason="a recorded defect: its repro exits non-zero while it is present")
def test_finding_is_fixed(finding, tmp_path):
    """A finding with a spec repro (``.json`` beside the script) replays through
    ``etprop repro``, which runs every oracle of its property (a coverage
    finding has no numbers to compare); the others run their script."""
    spec_repro = finding.repro_path.with_suffix(".json")
    command = ([sys.executable, "-m", "etprop.commands.cli", "repro", str(spec_repro), "--artifacts", str(tmp_path)]
               if spec_repro.exists() else [sys.executable, str(finding.repro_path)])
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, f"{finding.id} still reproduces: {completed.stdout[-500:]}"


def test_signature_matches_its_own_kind_of_program():
    spec = {"state": {}, "methods": {"forward": {"nodes": [
        {"id": "v0", "op": "addmm", "args": ["x"], "attrs": {"alpha": 2.0}, "state": "w"}]}}}
    assert known_findings.match("xnnpack", "mismatch", "anything", spec).id == "XNN-001"
    assert known_findings.match("xnnpack+fold", "mismatch", "anything", spec) is None
    spec["methods"]["forward"]["nodes"][0]["attrs"] = {}
    assert known_findings.match("xnnpack", "mismatch", "anything", spec) is None
