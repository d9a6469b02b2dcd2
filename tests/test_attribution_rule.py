"""Known means one cause: the attribution rule, on programs modelled as the causes they hold.

A model program is the set of recorded causes it holds plus, optionally, a
planted fault that only the joint rewrite of every cause happens to remove
(many rewrites at once change so much of a program that almost any failure
goes). Each model run stands for one lowering; the rule is Session._which's.
"""

from __future__ import annotations

import re

import pytest

from etprop.oracles import Verdict
from etprop.verdicts import known_findings
from etprop.verdicts.check import ExampleResult, FlowResult
from etprop.verdicts.outcomes import Outcome
from etprop.verdicts.session import JOINT_ONLY, ONE_CAUSE, TWO_CAUSES, Session

FLOW = "xnnpack"


def _finding(name: str) -> known_findings.Finding:
    return known_findings.Finding(
        id=name, title="", flows=(FLOW,), outcome="mismatch", pattern="elements differ", repro=""
    )


def _mismatch(output: int, got: str) -> FlowResult:
    message = (
        f"[eager equivalence] FAILED (mismatch): method 'forward', default inputs: output {output} (3, 8): "
        f"5 / 24 elements differ; worst at (0, 1): eager 1.5, got {got}, allowed difference 0.01"
    )
    return FlowResult(FLOW, Outcome.MISMATCH, [Verdict.failed("eager equivalence", message, Outcome.MISMATCH)])


class Model:
    """Programs as the causes they hold. ``wrong`` maps a cause to the output it
    spoils; the planted fault spoils output 0 until every cause is rewritten."""

    def __init__(self, monkeypatch, session: Session, findings: list, wrong: dict, planted: bool, masks=()):
        self.findings = {f.id: f for f in findings}
        self.wrong, self.planted, self.masks, self.runs = wrong, planted, set(masks), []
        monkeypatch.setattr(known_findings, "nominate", self.nominate)
        monkeypatch.setattr(known_findings, "neutralized", self.neutralized)
        monkeypatch.setattr(session, "_run", self.run)

    def spec(self) -> dict:
        return {"causes": sorted(self.findings), "planted": self.planted}

    def nominate(self, flow, outcome, message, spec=None):
        return [
            f
            for name, f in self.findings.items()
            if name in spec["causes"] and outcome == f.outcome and re.search(f.pattern, message)
        ]

    def neutralized(self, spec, chosen):
        causes = [c for c in spec["causes"] if c not in {f.id for f in chosen}]
        every_one_gone = not causes and len(chosen) == len(self.findings)
        return {"causes": causes, "planted": spec["planted"] and not every_one_gone}, len(spec["causes"]) - len(causes)

    def result(self, spec) -> ExampleResult:
        """The first spoiled output's mismatch; its worst value says what
        spoils it (a masking cause first: ``masks`` hides the others there)."""
        at: dict[int, list[str]] = {}
        for cause in spec["causes"]:
            if cause in self.wrong:
                at.setdefault(self.wrong[cause], []).append(cause)
        if spec["planted"]:
            at.setdefault(0, []).append("planted")
        if not at:
            return ExampleResult("mixed", spec, [FlowResult(FLOW, Outcome.PASS, [])])
        output = min(at)
        masking = [c for c in at[output] if c in self.masks]
        return ExampleResult("mixed", spec, [_mismatch(output, "+".join(masking or sorted(at[output])))])

    def run(self, spec, flows, prop, oracles, worker=None, record_export_failure=True):
        self.runs.append(spec["causes"])
        return self.result(spec)

    def attribute(self, session: Session) -> ExampleResult:
        spec = self.spec()
        return session._attribute(spec, [], "mixed", [], self.result(spec))


@pytest.fixture
def session(tmp_path):
    session = Session(tmp_path / "artifacts", isolated=False)
    yield session
    session.close()


@pytest.mark.parametrize("causes", [3, 10])
def test_a_new_fault_beside_several_causes_that_only_their_joint_rewrite_removes_is_new(causes, session, monkeypatch):
    """Every cause is in the program but spoils nothing the oracle reports
    first; the planted fault goes only when all are rewritten at once."""
    findings = [_finding(f"F{i}") for i in range(causes)]
    model = Model(monkeypatch, session, findings, wrong={}, planted=True)
    result = model.attribute(session)
    (flow,) = result.results
    assert flow.outcome is Outcome.MISMATCH and flow.known is None, f"filed under {flow.known}"
    assert flow.attribution == JOINT_ONLY
    assert result.new_failures == [flow]


def test_one_cause_of_many_that_alone_removes_the_failure_is_named(session, monkeypatch):
    findings = [_finding(f"F{i}") for i in range(10)]
    model = Model(monkeypatch, session, findings, wrong={"F7": 0}, planted=False)
    (flow,) = model.attribute(session).results
    assert (flow.known, flow.attribution) == ("F7", ONE_CAUSE)


def test_a_failure_two_causes_explain_together_names_both(session, monkeypatch):
    """A spoils output 0 and B output 1: either removed alone leaves the
    other's mismatch, each a different failure the other explains. A third
    nominated cause, C, changes nothing the oracle sees."""
    findings = [_finding(name) for name in ("A", "B", "C")]
    model = Model(monkeypatch, session, findings, wrong={"A": 0, "B": 1}, planted=False)
    (flow,) = model.attribute(session).results
    assert (flow.known, flow.attribution) == ("A+B", TWO_CAUSES)
    assert ["C"] in model.runs, "the pair was not lowered on its own"


def test_two_causes_that_each_leave_the_same_failure_do_not_explain_it(session, monkeypatch):
    """Removing either of two causes leaves one and the same failure (the
    planted fault): that failure is a third thing, new."""
    findings = [_finding(name) for name in ("A", "B")]
    model = Model(monkeypatch, session, findings, wrong={"A": 1, "B": 2}, planted=True)
    (flow,) = model.attribute(session).results
    assert flow.known is None and flow.attribution == JOINT_ONLY


def test_a_cause_masking_another_on_the_same_output_names_both(session, monkeypatch):
    """A zeroes output 0, hiding B's small error there (a wrong quantized GEMM
    before a GELU computed another way): removing B changes nothing visible,
    removing A leaves B's error, removing both clears it."""
    findings = [_finding(name) for name in ("A", "B")]
    model = Model(monkeypatch, session, findings, wrong={"A": 0, "B": 0}, planted=False, masks={"A"})
    (flow,) = model.attribute(session).results
    assert (flow.known, flow.attribution) == ("A+B", TWO_CAUSES)


def test_the_summary_counts_how_attribution_ended():
    from etprop.commands.report import Summary

    def record(*attributions):
        return {
            "property": "mixed",
            "digest": "d",
            "flows": [
                {"flow": FLOW, "outcome": "mismatch", "known": None, "message": "m", "attribution": a}
                for a in attributions
            ],
        }

    summary = Summary([record(ONE_CAUSE, TWO_CAUSES), record(JOINT_ONLY, ONE_CAUSE), record()])
    line = summary.attribution_text()
    assert "4 failing flow results attributed" in line and "more than one cause needed in 2 (50%)" in line
    assert "2 one cause" in line and "1 two causes" in line and f"1 {JOINT_ONLY}" in line
    assert line in summary.text()
    assert Summary([record()]).attribution_text() == ""
