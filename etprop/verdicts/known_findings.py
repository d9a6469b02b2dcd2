"""Known ExecuTorch / coreai-torch defects that etprop found.

Each finding has a repro (under findings/, shipped as package data), a
signature (flows, outcome, a specific message pattern, the ops or
parametrization involved) and a neutralization: how to remove its cause from a
spec (etprop/program/neutralize.py). A signature match only nominates a
finding; the session attributes a failure to it only when the neutralized
spec no longer fails (intervention, not resemblance). A lead (``"status":
"lead"``, a symptom not yet understood) never turns a failure into a pass.
tests/test_findings.py replays every repro as a strict expected failure, so
the day ExecuTorch fixes a defect the suite says so.
"""

from __future__ import annotations

import importlib.resources
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from etprop.program.neutralize import neutralize, parametrized_rank

# Package data (the ``etprop.findings`` package), so an installed wheel carries it.
FINDINGS_DIR = Path(str(importlib.resources.files("etprop.findings")))
INDEX = FINDINGS_DIR / "index.json"


@dataclass(frozen=True)
class Finding:
    id: str
    title: str
    flows: tuple[str, ...]
    outcome: str
    pattern: str  # regex searched in the failure message
    repro: str  # path relative to findings/
    upstream: str = "executorch==1.5.1"
    note: str = ""  # the write-up, relative to findings/
    # The program must contain one of these ops, with one of these attributes
    # when given: a mismatch message alone does not say which op caused it.
    ops: tuple[str, ...] = ()
    attrs: tuple[str, ...] = ()
    # Or: the program computes a tensor of this rank with this parametrization.
    parametrization: str = ""
    param_rank: int = 0
    # The program is quantized and computes a weight from parameters.
    quantized_computed_weight: bool = False
    # "confirmed" (a shrunk, understood defect) or "lead" (never matches).
    status: str = "confirmed"
    # Rewrites that remove the cause (etprop.program.neutralize).
    neutralize: tuple = ()

    def matches(self, flow: str, outcome: str, message: str, spec: Optional[dict] = None) -> bool:
        """Whether the failure looks like this finding: a nomination, to be
        proven by neutralizing the cause. Leads nominate nothing."""
        if (
            self.status != "confirmed"
            or flow not in self.flows
            or outcome != self.outcome
            or not re.search(self.pattern, message, re.S)
        ):
            return False
        return self.holds_conditions(spec)

    def holds_conditions(self, spec: Optional[dict]) -> bool:
        """Whether ``spec`` has what the signature asks of a program (the ops,
        attributes, parametrization or quantized computed weight), whatever it fails with."""
        if self.quantized_computed_weight and not (
            spec is not None
            and spec.get("quantization")
            and any(entry.get("parametrizations") for entry in spec["state"].values())
        ):
            return False
        if self.parametrization:
            return spec is not None and any(
                p["type"] == self.parametrization and parametrized_rank(entry, p) == self.param_rank
                for entry in spec["state"].values()
                for p in entry.get("parametrizations", [])
            )
        if not self.ops:
            return True
        from etprop.program.spec import all_nodes

        return spec is not None and any(
            node["op"] in self.ops and (not self.attrs or any(a in node.get("attrs", {}) for a in self.attrs))
            for _, node in all_nodes(spec)
        )

    @property
    def specificity(self) -> tuple:
        """How narrowly the finding's conditions pick programs: attribution
        tries the most specific cause first (a quantized computed weight
        before any program with a weight_norm)."""
        return (
            bool(self.quantized_computed_weight or self.parametrization),
            bool(self.attrs),
            bool(self.ops),
            -len(self.ops),
        )

    @property
    def repro_path(self) -> Path:
        return FINDINGS_DIR / self.repro


def load() -> list[Finding]:
    if not INDEX.exists():
        return []
    entries = json.loads(INDEX.read_text())
    return [
        Finding(**{**entry, **{k: tuple(entry[k]) for k in ("flows", "ops", "attrs", "neutralize") if k in entry}})
        for entry in entries
    ]


def lineage(flow: str) -> list[str]:
    """The flow and the flows it is built on (its baseline, that one's, ...):
    a candidate built on a backend inherits that backend's defects, whatever
    the candidate is called."""
    from etprop import flows

    names = [flow]
    while True:
        try:
            base = flows.get(names[-1]).baseline
        except Exception:
            return names
        if not base or base in names or base == "portable":
            return names
        names.append(base)


def nominate(flow: str, outcome: str, message: str, spec: Optional[dict] = None) -> list[Finding]:
    """Every confirmed finding whose signature the failure matches on the
    flow; for a flow no finding names (an outside package's), on the flows it
    is built on (nominated only: attribution still proves each by
    neutralizing its cause)."""
    findings = load()
    names = _flows_named_for(flow, findings)
    return [finding for finding in findings if any(finding.matches(name, outcome, message, spec) for name in names)]


def _flows_named_for(flow: str, findings: list[Finding]) -> list[str]:
    """The flow itself when some finding names it; else the flows it is built on."""
    named = {name for finding in findings for name in finding.flows}
    return [flow] if flow in named else lineage(flow)


def neutralized(spec: dict, findings: list[Finding]) -> tuple[dict, int]:
    """``spec`` with every nominated finding's cause removed, and how many
    places changed (0: none of their causes is in the program)."""
    rules = [rule for finding in findings for rule in finding.neutralize]
    return neutralize(spec, rules)


def causes_on(flow: str, spec: dict) -> list[Finding]:
    """Confirmed findings of ``flow`` (or the flows it is built on) whose cause
    ``spec`` holds, judged before it runs: the signature's program conditions
    hold and neutralizing the finding changes the program. A program that
    holds none can only fail in a way no finding explains."""
    findings = load()
    names = _flows_named_for(flow, findings)
    return [
        finding
        for finding in findings
        if finding.status == "confirmed"
        and finding.neutralize
        and any(name in finding.flows for name in names)
        and finding.holds_conditions(spec)
        and neutralize(spec, list(finding.neutralize))[1]
    ]


def campaign_neutralization(spec: dict, flows: list[str]) -> tuple[dict, list[str]]:
    """``spec`` with the causes of the flows' recorded findings removed, and
    the findings so neutralized: what a campaign runs instead of a drawn
    program holding a known cause, whose failure would stop the lowering and
    hide whatever else the program holds. Every rewrite where the rewritten
    program still computes (an argument reset can change a shape a later op
    needs); otherwise the equivalent forms alone."""
    from etprop.program.builder import computes

    found = {finding.id: finding for flow in flows for finding in causes_on(flow, spec)}
    if not found:
        return spec, []
    rewritten, _ = neutralize(spec, [rule for finding in found.values() for rule in finding.neutralize])
    if computes(rewritten, float_only=True):
        return rewritten, list(found)
    return equivalent_neutralization(spec, flows)


def equivalent_neutralization(spec: dict, flows: list[str]) -> tuple[dict, list[str]]:
    """``spec`` with the causes of the flows' recorded findings removed where
    the rewrite keeps every coverage combination (an equivalent form of the
    same program, such as a batch norm written by hand), and the findings so
    neutralized. A rewrite that would drop a combination (control flow
    inlined, an argument reset) is left out: that program still runs as drawn."""
    from etprop.program import coverage_space

    keys = coverage_space.keys(spec)
    found = {finding.id: finding for flow in flows for finding in causes_on(flow, spec)}
    rules, applied = [], []
    for finding in found.values():
        rewritten, changed = neutralize(spec, rules + list(finding.neutralize))
        if changed and coverage_space.keys(rewritten) == keys:
            rules += list(finding.neutralize)
            applied.append(finding.id)
    return (neutralize(spec, rules)[0], applied) if rules else (spec, [])
