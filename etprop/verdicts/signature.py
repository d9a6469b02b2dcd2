"""Failure signatures: what two failures of one defect share, whatever program showed it.

The flow, the outcome, the oracle, and the message with values, names,
positions and the flow's own name blanked; for a mismatch, only the kind of difference (elements that
differ, or non-finite where eager is finite), since the numbers, the output and
the input class change with the program. Campaign triage groups failures by it,
and a campaign marks each signature as a Hypothesis target so the database
keeps one example of each.
"""

from __future__ import annotations

import re

from etprop.verdicts.outcomes import Outcome

_ADDRESS = re.compile(r"\b0x[0-9a-f]+\b", re.I)
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|\binf\b|\bnan\b", re.I)
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_NAME_WITH_DIGITS = re.compile(r"\b[A-Za-z_]\w*\d\w*\b")
_FUNCTION = re.compile(r", line \d+, in (\w+)")
_DIFFERENCE = re.compile(r"elements (differ|are [^;]*?)(;|$)")
_ORACLE = re.compile(r"^\[([^\]]+)\] FAILED \(([^)]+)\)")


def signature(flow: str, outcome: str, message: str) -> str:
    """What two failures of one defect share, whatever program showed it."""
    head = _ORACLE.match(message)
    oracle = head.group(1) if head else "?"
    if outcome == Outcome.MISMATCH.value:
        kind = _DIFFERENCE.search(message)
        detail = kind.group(1) if kind else "differ"
    else:
        verdict = message.split("; [")[0][head.end() if head else 0 :]
        # The exception's line and the innermost function the message names.
        lines = verdict.strip(" :").splitlines() or [""]
        # The frame that raised: the last one before the traceback's closing
        # "<Type>: ..." line. Frames after it belong to tracebacks the
        # exception's text quotes (torch.fx's "Original traceback").
        closing = verdict.rfind("\n" + lines[0].split(":")[0] + ":")
        functions = _FUNCTION.findall(verdict[:closing] if closing > 0 else verdict)
        first = lines[0] + (f" (in {functions[-1]})" if functions else "")
        # A message naming its own flow ("GEMMs that xnnpack+fold promises to
        # delegate") is the same failure as on another flow naming itself.
        if flow:
            first = re.sub(rf"(?<![\w.+/-]){re.escape(flow)}(?![\w.+/-])", "<flow>", first)
        blanked = _NAME_WITH_DIGITS.sub("…", _ADDRESS.sub("0x…", _QUOTED.sub("'…'", first)))
        detail = _NUMBER.sub("#", blanked)[:200]
    return f"{flow} | {outcome} | {oracle} | {detail}"
