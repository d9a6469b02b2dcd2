"""How one example ended. Every report and exit code is built from these."""

from __future__ import annotations

from enum import Enum


class Outcome(str, Enum):
    PASS = "pass"
    NOT_RUN = "not run"  # no verdict: another flow's crash ended the example
    EXPORT_ERROR = "export error"  # torch.export rejected a drawn program: a generator defect, or a torch finding
    INTERNAL_ERROR = "etprop internal error"  # etprop itself failed: no verdict on the lowering
    QUANTIZATION_ERROR = "quantization error"  # PT2E (prepare/calibrate/convert) failed on an exported program
    LOWERING_ERROR = "lowering error"
    SERIALIZATION_ERROR = "serialization error"
    LOAD_ERROR = "load error"
    RUN_ERROR = "run error"
    MISMATCH = "mismatch"
    VIOLATION = "property violation"  # a structural oracle failed
    UNSUPPORTED = "unsupported by ExecuTorch"  # e.g. the 1.5.1 emitter and while_loop
    CRASH = "crash"
    TIMEOUT = "timeout"
    NONDETERMINISTIC = "nondeterministic"

    @property
    def is_failure(self) -> bool:
        return self not in (Outcome.PASS, Outcome.UNSUPPORTED, Outcome.NOT_RUN)
