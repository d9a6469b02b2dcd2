"""Oracles: each reads one lowering's artifacts and returns a Verdict.

An oracle never lowers again (the differential checks in oracles/differential.py
compare two lowerings the caller made). A failed verdict names what is wrong:
the method, input, output, node, tensor or bytes concerned.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from etprop.verdicts.outcomes import Outcome


@dataclass
class Verdict:
    oracle: str
    ok: bool
    message: str = ""
    outcome: Outcome = Outcome.PASS
    details: dict = field(default_factory=dict)

    @classmethod
    def passed(cls, oracle: str, message: str = "", **details) -> "Verdict":
        return cls(oracle, True, message, Outcome.PASS, details)

    @classmethod
    def failed(cls, oracle: str, message: str, outcome: Outcome = Outcome.VIOLATION, **details) -> "Verdict":
        return cls(oracle, False, message, outcome, details)

    def __str__(self) -> str:
        status = "ok" if self.ok else f"FAILED ({self.outcome.value})"
        return f"[{self.oracle}] {status}" + (f": {self.message}" if self.message else "")


class OracleFailure(AssertionError):
    """Raised by properties so pytest and Hypothesis see a failed verdict."""

    def __init__(self, verdict: Verdict):
        super().__init__(str(verdict))
        self.verdict = verdict
