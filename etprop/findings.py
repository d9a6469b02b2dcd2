"""Known ExecuTorch / coreai-torch defects that etprop found.

Each finding has a repro (a spec JSON under findings/repros/) and a signature
(flow, outcome, message pattern). A property that meets a failure matching a
signature records it as known instead of failing, so the suite stays green;
tests/test_findings.py replays every repro as a strict expected failure, so
the day ExecuTorch fixes a defect the suite says so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

FINDINGS_DIR = Path(__file__).resolve().parent.parent / "findings"
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

    def matches(self, flow: str, outcome: str, message: str) -> bool:
        return (flow in self.flows and outcome == self.outcome
                and re.search(self.pattern, message, re.S) is not None)

    @property
    def repro_path(self) -> Path:
        return FINDINGS_DIR / self.repro


def load() -> list[Finding]:
    if not INDEX.exists():
        return []
    return [Finding(**{**entry, "flows": tuple(entry["flows"])})
            for entry in json.loads(INDEX.read_text())]


def match(flow: str, outcome: str, message: str) -> Optional[Finding]:
    for finding in load():
        if finding.matches(flow, outcome, message):
            return finding
    return None
