"""Differential checks: a candidate flow against its baseline on the same program.

Both lowerings come from one export (etprop.check lowers every flow of an
example from the same exported programs). The candidate must lower whenever
the baseline does, must not be larger (beyond SIZE_SLACK_BYTES), and must not
delegate less; each flow's own eager equivalence is checked by its own oracle.
"""

from __future__ import annotations

from etprop.oracles import Verdict
from etprop.outcomes import Outcome

NAME = "differential"
# Metadata that legitimately differs between two lowerings of one program
# (delegate names, debug handles, alignment padding of one segment).
SIZE_SLACK_BYTES = 256


def check(lowering, lowerings) -> Verdict:
    """``lowerings`` lists the baseline first; the candidate is any later one."""
    base = next(iter(lowerings.values()))
    if base is lowering:
        return Verdict.passed(NAME, "baseline flow: nothing to compare")
    if not base.ok:
        return Verdict.passed(NAME, f"baseline {base.flow.name} did not lower ({base.outcome.value})")
    if not lowering.ok:
        return Verdict.failed(NAME, f"{base.flow.name} lowers this program but {lowering.flow.name} "
                                    f"fails: {lowering.error.splitlines()[0]}", lowering.outcome)
    grown = len(lowering.pte) - len(base.pte)
    if grown > SIZE_SLACK_BYTES:
        return Verdict.failed(NAME, f".pte grew: {lowering.flow.name} {len(lowering.pte)} bytes vs "
                                    f"{base.flow.name} {len(base.pte)} bytes (+{grown}, slack {SIZE_SLACK_BYTES})",
                              Outcome.VIOLATION, candidate_bytes=len(lowering.pte), baseline_bytes=len(base.pte))
    from etprop.oracles import coverage

    worse = coverage.regressions(base, lowering)
    if worse:
        return Verdict.failed(NAME, f"{lowering.flow.name} leaves more ops outside delegates than "
                                    f"{base.flow.name}: {worse}", Outcome.VIOLATION)
    return Verdict.passed(NAME, f"{len(lowering.pte)} vs {len(base.pte)} bytes; coverage not worse")
