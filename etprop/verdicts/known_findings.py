"""Known ExecuTorch / coreai-torch defects that etprop found.

Each finding has a repro (a spec JSON under findings/repros/, shipped as package data) and a signature
(flow, outcome, message pattern). A property that meets a failure matching a
signature records it as known instead of failing, so the suite stays green;
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

# Package data (the ``etprop.findings`` package), so an installed wheel carries it.
FINDINGS_DIR = Path(str(importlib.resources.files("etprop.findings")))
INDEX = FINDINGS_DIR / "index.json"


@dataclass(frozen=True)
class Finding:
    id: str
    title: str
    flows: tuple[str, ...]
    outcome: str
    pattern: str            # regex searched in the failure message
    repro: str              # path relative to findings/
    upstream: str = "executorch==1.5.1"
    note: str = ""          # the write-up, relative to findings/
    # The program must contain one of these ops, with one of these attributes
    # when given: a mismatch message alone does not say which op caused it.
    ops: tuple[str, ...] = ()
    attrs: tuple[str, ...] = ()
    # Or: the program computes a tensor of this rank with this parametrization.
    parametrization: str = ""
    param_rank: int = 0

    def matches(self, flow: str, outcome: str, message: str, spec: Optional[dict] = None) -> bool:
        if flow not in self.flows or outcome != self.outcome or not re.search(self.pattern, message, re.S):
            return False
        if self.parametrization:
            return spec is not None and any(
                p["type"] == self.parametrization and _rank(entry, p) == self.param_rank
                for entry in spec["state"].values() for p in entry.get("parametrizations", []))
        if not self.ops:
            return True
        from etprop.program.spec import all_nodes

        return spec is not None and any(
            node["op"] in self.ops and (not self.attrs or any(a in node.get("attrs", {}) for a in self.attrs))
            for _, node in all_nodes(spec))

    @property
    def repro_path(self) -> Path:
        return FINDINGS_DIR / self.repro


def _rank(entry: dict, parametrization: dict) -> int:
    if entry["kind"] == "layer":
        return 1 if parametrization.get("on") == "bias" else 2
    return len(entry.get("shape", []))


def load() -> list[Finding]:
    if not INDEX.exists():
        return []
    entries = json.loads(INDEX.read_text())
    return [Finding(**{**entry, **{k: tuple(entry[k]) for k in ("flows", "ops", "attrs") if k in entry}})
            for entry in entries]


def match(flow: str, outcome: str, message: str, spec: Optional[dict] = None) -> Optional[Finding]:
    for finding in load():
        if finding.matches(flow, outcome, message, spec):
            return finding
    return None
