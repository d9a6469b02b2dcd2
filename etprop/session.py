"""What a property talks to: check a spec on flows, fail with a useful message."""

from __future__ import annotations

import os
import time
from pathlib import Path

from hypothesis import event, note

from etprop.check import Artifacts, ExampleResult, Oracle, run_example
from etprop.oracles import OracleFailure
from etprop.outcomes import Outcome

_FAILURE_TYPES: dict[Outcome, type] = {}


def failure_type(outcome: Outcome) -> type:
    """One exception class per outcome, so Hypothesis keeps a mismatch and a
    lowering error apart as distinct failures (and shrinks each separately)."""
    if outcome not in _FAILURE_TYPES:
        name = "".join(part.capitalize() for part in outcome.value.replace("-", " ").split()) + "Failure"
        _FAILURE_TYPES[outcome] = type(name, (OracleFailure,), {})
    return _FAILURE_TYPES[outcome]


class Session:
    def __init__(self, artifacts_dir: Path):
        self.artifacts = Artifacts(artifacts_dir)
        self.failed: set[tuple] = set()

    def check(self, spec: dict, flows: list, prop: str, oracles: list[Oracle]) -> ExampleResult | None:
        deadline = os.environ.get("ETPROP_DEADLINE")
        key = (prop, tuple(f.name for f in flows))
        # Past the budget, new exploration stops; a property that has failed in
        # this process keeps running so Hypothesis can finish shrinking it.
        if deadline and time.time() > float(deadline) and key not in self.failed:
            event("not run: past the campaign's budget")
            return None
        result = run_example(spec, flows, prop, oracles, self.artifacts)
        for flow_result in result.results:
            event(f"{flow_result.flow}: {flow_result.outcome.value}"
                  + (f" (known {flow_result.known})" if flow_result.known else ""))
        failures = result.new_failures
        if failures:
            self.failed.add(key)
            first = failures[0]
            note(f"repro written to {result.repro}")
            failed = next(v for v in first.verdicts if not v.ok)
            raise failure_type(first.outcome)(failed) from None
        return result
