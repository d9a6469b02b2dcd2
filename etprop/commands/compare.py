"""Baseline against candidate on one program: what the gate counts.

A recorded example of a gate holds the baseline's result first and the
candidate's last. The candidate regresses when it fails, or is unsupported,
where the baseline did not; when both fail but differently (another outcome,
another oracle or kind of failure, another method or output, or a mismatch
more than ``WORSE_FACTOR`` times further past its bound or on more elements);
and when a known finding appears on the candidate that the baseline did not
hit. A known finding does not excuse a candidate: it only names the cause.
The baseline failing where the candidate passes is an improvement.
"""

from __future__ import annotations

import re
from typing import Optional

from etprop.verdicts.outcomes import Outcome
from etprop.verdicts.signature import signature

# A mismatch counts as worse when it is this many times further past its bound.
WORSE_FACTOR = 2.0

_WHERE = re.compile(r"method '([^']*)'.*?output (\d+)")
_COUNT = re.compile(r"(\d+) / (\d+) elements")
_WORST = re.compile(r"eager (\S+), got (\S+), allowed difference (\S+?)[ ;,)]")


def _number(text: str) -> float:
    try:
        return float(text.rstrip(",;"))
    except ValueError:
        return float("inf")


def mismatch_facts(message: str) -> dict:
    """Where a mismatch is and how bad: method, output, elements off, worst excess over the bound."""
    facts: dict = {}
    where = _WHERE.search(message)
    if where:
        facts["where"] = (where.group(1), int(where.group(2)))
    count = _COUNT.search(message)
    if count:
        facts["elements"] = int(count.group(1))
    worst = _WORST.search(message)
    if worst:
        eager, got, allowed = (_number(value) for value in worst.groups())
        difference = abs(got - eager) if got == got and eager == eager else float("inf")
        facts["excess"] = difference / allowed if allowed > 0 else float("inf")
    return facts


def _unnamed(result: dict) -> str:
    """The message without its own flow's name (a crash names the flow it was
    in), where it stands as a name of its own: ``xnnpack`` inside a module path
    (``executorch.backends.xnnpack.operators``) is not the flow."""
    alone = re.compile(rf"(?<![\w.+-]){re.escape(result['flow'])}(?![\w.+-])")
    return alone.sub("<flow>", result["message"])


def _is_failing(result: dict) -> bool:
    return Outcome(result["outcome"]).is_failure or result["outcome"] == Outcome.UNSUPPORTED.value


def compare(record: dict) -> Optional[dict]:
    """None when the candidate did no worse; else what changed (``kind`` and why)."""
    if len(record["flows"]) < 2:
        return None
    base, candidate = record["flows"][0], record["flows"][-1]
    if candidate["outcome"] in (Outcome.NOT_RUN.value,) or not _is_failing(candidate):
        return None
    if not _is_failing(base) or base["outcome"] == Outcome.NOT_RUN.value:
        kind = (
            "newly unsupported"
            if candidate["outcome"] == Outcome.UNSUPPORTED.value
            else f"known finding {candidate['known']} newly hit"
            if candidate.get("known")
            else "newly failing"
        )
        return {"kind": kind, "why": f"the baseline {base['outcome'] if base['outcome'] != 'pass' else 'passed'}"}
    if candidate.get("known") and candidate["known"] != base.get("known"):
        return {
            "kind": f"known finding {candidate['known']} newly hit",
            "why": f"the baseline failed as {base.get('known') or 'a new failure'}",
        }
    if base.get("known") and not candidate.get("known"):
        return {
            "kind": "changed failure",
            "why": f"the baseline's failure is known finding {base['known']}; the candidate's is not explained by it",
        }
    if candidate["outcome"] != base["outcome"]:
        return {"kind": "changed failure", "why": f"the baseline failed as {base['outcome']}"}
    if signature("", base["outcome"], _unnamed(base)) != signature("", candidate["outcome"], _unnamed(candidate)):
        return {"kind": "changed failure", "why": "the baseline failed with another oracle or message"}
    if candidate["outcome"] == Outcome.MISMATCH.value:
        before, after = mismatch_facts(base["message"]), mismatch_facts(candidate["message"])
        if before.get("where") != after.get("where"):
            return {"kind": "changed failure", "why": f"the baseline's mismatch is at {before.get('where')}"}
        if after.get("excess", 0) > WORSE_FACTOR * before.get("excess", float("inf")) or after.get(
            "elements", 0
        ) > WORSE_FACTOR * before.get("elements", float("inf")):
            return {
                "kind": "worse mismatch",
                "why": f"{after.get('elements')} elements, {after.get('excess', 0):.3g}x past the bound; the "
                f"baseline {before.get('elements')} elements, {before.get('excess', 0):.3g}x",
            }
    return None


def improved(record: dict) -> bool:
    """The baseline failed and the candidate passed."""
    return (
        len(record["flows"]) >= 2
        and _is_failing(record["flows"][0])
        and record["flows"][-1]["outcome"] == Outcome.PASS.value
    )
