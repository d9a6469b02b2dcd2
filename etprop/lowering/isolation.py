"""Crash and hang isolation: examples run in a warm worker process.

ExecuTorch, XNNPACK, flatc and the Core AI runtime are native code; a drawn
program can segfault, abort or hang them. Each example therefore runs in a
worker process forked from a forkserver that imported torch and executorch
once (so a worker starts in tens of milliseconds, not seconds), and the worker
serves example after example until it dies. The worker reports the stage it
enters ("lowering", "runtime execution", ...) before each risky step, so a
death is classified where it happened: ``crash: SIGSEGV in runtime execution
(xnnpack)`` or ``timeout after 300 s in lowering (xnnpack)``. The example's
spec is on disk (pending/) before the worker touches it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import traceback
from typing import Any, Optional

from etprop.lowering import stages

DEFAULT_TIMEOUT_SECONDS = 600.0
# A worker imports the flow modules before it is ready; a flow module's import can be slow.
START_TIMEOUT_SECONDS = 300.0


def memory_limit() -> float:
    """Bytes a worker may hold: native code can grow without bound (finding
    COREAI-004) and would take the machine down before any timeout."""
    return float(os.environ.get("ETPROP_WORKER_MEMORY_GB", 8)) * 2**30


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def example_timeout() -> float:
    return float(os.environ.get("ETPROP_EXAMPLE_TIMEOUT", DEFAULT_TIMEOUT_SECONDS))


def _context(preload: list[str]):
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(preload)
    return ctx


def _serve(conn, flow_modules: list[str]) -> None:
    """The worker loop: run jobs, report stages, send results back."""
    from etprop import flows

    try:
        for target in flow_modules:
            flows.load_flow_module(target)
    except BaseException as exc:
        conn.send(("start-error", f"{type(exc).__name__}: {exc}"))
        return
    stages.set_reporter(lambda stage: conn.send(("stage", stage)))
    conn.send(("ready",))
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        function, kwargs = job
        try:
            conn.send(("result", function(**kwargs)))
        except BaseException as exc:  # sent to the parent, which re-raises it
            conn.send(("error", type(exc).__name__, str(exc), traceback.format_exc(limit=8)))


class WorkerDied(Exception):
    def __init__(self, kind: str, detail: str, stage: dict):
        super().__init__(f"{kind}: {detail} in {stages.describe(stage)}")
        self.kind, self.detail, self.stage = kind, detail, stage


class WorkerError(Exception):
    """An exception raised inside the worker, re-raised in the parent."""

    def __init__(self, type_name: str, message: str, formatted: str):
        super().__init__(f"{type_name}: {message}")
        self.type_name, self.formatted = type_name, formatted


class WorkerStartFailed(RuntimeError):
    """The worker died before it could take a job: etprop's problem or the
    caller's, never a verdict on a lowering."""


class Worker:
    def __init__(self, flow_modules: Optional[list[str]] = None, preload: Optional[list[str]] = None):
        """``preload``: modules the forkserver imports once, so workers start warm."""
        self.flow_modules = list(flow_modules or [])
        self.preload = list(preload or [])
        self._process = None
        self._conn = None

    def _start(self) -> None:
        ctx = _context(self.preload)
        parent, child = ctx.Pipe()
        self._process = ctx.Process(target=_serve, args=(child, self.flow_modules), daemon=True)
        self._process.start()
        child.close()
        self._conn = parent
        try:
            first = parent.recv() if parent.poll(START_TIMEOUT_SECONDS) else None
        except (EOFError, ConnectionResetError, OSError):
            first = None
        if first and first[0] == "start-error":
            self.close()
            raise WorkerStartFailed(f"etprop's worker could not load the flow modules: {first[1]}")
        if first != ("ready",):
            self._process.join(timeout=5)
            code = self._process.exitcode
            self.close()
            raise WorkerStartFailed(
                f"etprop's worker process ended before it was ready ({_describe_exit(code)}); when etprop is "
                'called from a script, put the calls under `if __name__ == "__main__":` (the worker\'s '
                "forkserver imports the main module again), or set ETPROP_ISOLATION=0"
            )

    def close(self) -> None:
        if self._process is not None:
            if self._process.is_alive():
                self._process.kill()
            self._process.join(timeout=10)
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None

    def call(self, function, timeout: Optional[float] = None, **kwargs) -> Any:
        """Run ``function(**kwargs)`` in the worker; WorkerDied on crash or hang."""
        if self._process is None or not self._process.is_alive():
            self.close()
            self._start()
        timeout = example_timeout() if timeout is None else timeout
        stage: dict = {"stage": "starting the example"}
        started = time.monotonic()
        self._conn.send((function, kwargs))
        while True:
            remaining = started + timeout - time.monotonic()
            if remaining <= 0:
                self.close()
                raise WorkerDied("timeout", f"after {timeout:g} s", stage)
            try:
                ready = self._conn.poll(min(remaining, 0.5))
                message = self._conn.recv() if ready else None
            except (EOFError, ConnectionResetError, OSError):
                message = None
                ready = True
            if message is None:
                if _rss_bytes(self._process.pid) > memory_limit():
                    self.close()
                    raise WorkerDied("crash", f"memory limit of {memory_limit() / 2**30:g} GiB exceeded", stage)
                if ready or not self._process.is_alive():
                    self._process.join(timeout=5)
                    code = self._process.exitcode
                    self.close()
                    raise WorkerDied("crash", _describe_exit(code), stage)
                continue
            if message[0] == "stage":
                stage = message[1]
                continue
            if message[0] == "error":
                raise WorkerError(*message[1:])
            return message[1]


def _describe_exit(code: Optional[int]) -> str:
    if code is None:
        return "worker vanished"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"
