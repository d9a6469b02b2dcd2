"""Stage reporting: risky steps announce themselves before they run, so a
worker that dies can be said to have died *there* (see etprop/lowering/isolation.py).
In-process runs report to nobody."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import Callable, Optional

# Wall seconds spent per kind of work in this process: "executorch" (lowering,
# serialization, runtime), "torch" (export, eager references). The benchmark
# reads it to split an example's time between ExecuTorch, torch and etprop.
SPENT: defaultdict = defaultdict(float)


@contextlib.contextmanager
def timed(kind: str):
    started = time.perf_counter()
    try:
        yield
    finally:
        SPENT[kind] += time.perf_counter() - started


_reporter: Optional[Callable[[dict], None]] = None


def set_reporter(reporter: Optional[Callable[[dict], None]]) -> None:
    global _reporter
    _reporter = reporter


def enter(stage: str, flow: Optional[str] = None) -> None:
    if _reporter is not None:
        _reporter({"stage": stage, "flow": flow})


def describe(stage: dict) -> str:
    return stage.get("stage", "?") + (f" ({stage['flow']})" if stage.get("flow") else "")
