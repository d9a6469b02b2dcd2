"""Other Python environments: create one cheaply, talk to etprop's worker in it.

A gate across environments compares two installations (another ExecuTorch
build, a new backend package release, an outside partitioner package). Each
runs ``python -m etprop.commands.env_worker`` (see that module for the
protocol); this module starts it, checks the environment can serve, and
exchanges one JSON line per request.

``create`` makes a *layered* environment: a new virtual environment whose
``.pth`` file adds an existing environment's site-packages after its own, so
every package of the base is visible and only the changed ones (installed
``--no-deps``) are new. etprop itself is installed into it from its own
source, so the layer never reads etprop's code from the base.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from etprop.errors import UsageError

FORMAT = 2
START_SECONDS = 300.0
# A request answers within the example's own timeout (the worker's isolation
# stops a hang there) plus start-up of a fresh isolated worker.
REQUEST_SECONDS = float(os.environ.get("ETPROP_EXAMPLE_TIMEOUT", 600)) + 120.0
LAYER_FILE = "etprop-layer.pth"


class EnvironmentFailed(RuntimeError):
    """The environment's worker died or broke the protocol: no verdict from it."""


class OutOfTime(Exception):
    """The budget ended while the environment worked on a request; its worker
    was stopped (and starts again on the next request)."""


def _site_packages(python: str) -> str:
    return subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def project_source() -> Path:
    """etprop's source tree (for installing etprop into a new environment)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file():
        raise UsageError(
            "etprop's source tree is not beside this installation; pass --etprop WHEEL_OR_DIR "
            "(a built etprop wheel or a checkout) to install into the new environment"
        )
    return root


def create(
    directory: Path,
    over: str = sys.executable,
    install: tuple[str, ...] = (),
    etprop_source: Optional[Path] = None,
    sitecustomize: Optional[Path] = None,
) -> Path:
    """A layered environment at ``directory`` over the environment of ``over``;
    ``install`` are pip requirements installed into the layer only (no
    dependencies pulled: the base provides them); ``sitecustomize`` is copied
    into the layer (a deliberate change every process of it loads). Returns
    its interpreter."""
    directory = Path(directory).resolve()
    if directory.exists():
        raise UsageError(f"'{directory}' already exists; give the new environment a fresh directory")
    base_site = _site_packages(over)
    base_python = subprocess.run(
        [over, "-c", "import sys; print(getattr(sys, '_base_executable', sys.executable))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    try:
        subprocess.run([base_python, "-m", "venv", "--without-pip", str(directory)], check=True)
        python = str(directory / "bin" / "python")
        layer_site = Path(_site_packages(python))
        # An `import` line runs at start-up: addsitedir also processes the base's
        # own .pth files (editable installs, path hooks), after the layer's packages.
        (layer_site / LAYER_FILE).write_text(f"import site; site.addsitedir({base_site!r})\n")
        pip = [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--ignore-installed",
        ]
        _install(pip, [str(etprop_source or project_source())])
        if install:
            _install(pip, list(install))
        if sitecustomize is not None:
            shutil.copy(sitecustomize, layer_site / "sitecustomize.py")
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return python


def _install(pip: list[str], requirements: list[str]) -> None:
    done = subprocess.run(pip + requirements, capture_output=True, text=True)
    if done.returncode:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise UsageError(f"installing {' '.join(requirements)} into the new environment failed: {last}")


class Environment:
    """etprop's worker running in another Python environment."""

    def __init__(
        self,
        python: str,
        label: str,
        artifacts: Path,
        flow_modules: tuple[str, ...] = (),
        extra_env: Optional[dict] = None,
    ):
        # Absolute, not resolved: a virtual environment's python is a symlink out of it.
        self.python = os.path.abspath(python) if os.sep in python else (shutil.which(python) or python)
        self.label, self.artifacts = label, Path(artifacts)
        self.flow_modules = list(flow_modules)
        # Variables the worker's environment gets on top of this process's (a mutant to shadow in).
        self.extra_env = dict(extra_env or {})
        self.versions: dict = {}
        self.flows: dict = {}
        self.runtimes: dict = {}
        self._process: Optional[subprocess.Popen] = None
        self._lines: "queue.Queue[Optional[str]]" = queue.Queue()
        self._next_id = 0

    def start(self) -> "Environment":
        if not (Path(self.python).is_file() or shutil.which(self.python)):
            raise UsageError(
                f"{self.label} environment: no Python interpreter at '{self.python}'; pass the "
                "path of the environment's python (create one with `etprop env DIR`)"
            )
        self.artifacts.mkdir(parents=True, exist_ok=True)
        # -P and another working directory: the environment's own etprop, never a checkout in the cwd.
        command = [self.python, "-P", "-m", "etprop.commands.env_worker", "--artifacts", str(self.artifacts.resolve())]
        for module in self.flow_modules:
            command += ["--flow-module", module]
        self._stderr = open(self.artifacts / "worker.log", "ab")
        self._lines = queue.Queue()
        # A session of its own: stopping the worker stops its isolated workers too.
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
            cwd=self.artifacts,
            start_new_session=True,
            env={**os.environ, **self.extra_env},
        )
        threading.Thread(target=self._read, args=(self._process.stdout, self._lines), daemon=True).start()
        first = self._receive(START_SECONDS)
        if first is None:
            tail = self.log_tail()
            if "No module named etprop" in tail or "No module named 'etprop" in tail:
                raise UsageError(
                    f"{self.label} environment ({self.python}) has no etprop: install it there with "
                    f"`{self.python} -m pip install --no-deps {project_source()}` (or create the "
                    "environment with `etprop env DIR`)"
                )
            last = tail.strip().splitlines()[-1] if tail.strip() else "no output"
            raise UsageError(f"{self.label} environment ({self.python}): etprop's worker did not start: {last}")
        if first.get("format") != FORMAT:
            raise UsageError(
                f"{self.label} environment runs etprop with worker format {first.get('format')}, "
                f"this etprop speaks {FORMAT}: install the same etprop in both environments"
            )
        self.versions, self.flows, self.runtimes = first["versions"], first["flows"], first.get("runtimes", {})
        return self

    @staticmethod
    def _read(stdout, lines: queue.Queue) -> None:
        for line in stdout:
            lines.put(line)
        lines.put(None)

    def _receive(self, timeout: float) -> Optional[dict]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            return None
        if line is None:
            return None
        try:
            return json.loads(line)
        except ValueError:
            raise EnvironmentFailed(f"{self.label} environment wrote a line that is not the protocol: {line[:200]}")

    def log_tail(self, characters: int = 3000) -> str:
        self._stderr.flush()
        try:
            return (self.artifacts / "worker.log").read_text(errors="replace")[-characters:]
        except OSError:
            return ""

    def unavailable(self, flow: str) -> Optional[str]:
        """Why ``flow`` cannot run in this environment, or None."""
        if flow not in self.flows:
            return f"no flow '{flow}' is registered there (known: {', '.join(sorted(self.flows)) or 'none'})"
        reason = self.flows[flow]
        return reason.strip().splitlines()[0] if reason else None

    def request(self, message: dict, timeout: float = REQUEST_SECONDS, deadline: Optional[float] = None) -> dict:
        """Send one request and wait for its answer, at most ``timeout``
        seconds and not past ``deadline`` (OutOfTime then)."""
        if self._process is None:
            self.start()
        if deadline is not None:
            timeout = min(timeout, deadline - time.time())
            if timeout <= 0:
                raise OutOfTime()
        self._next_id += 1
        message = dict(message, id=self._next_id)
        try:
            self._process.stdin.write(json.dumps(message) + "\n")
            self._process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise EnvironmentFailed(f"{self.label} environment's worker is gone: {self.log_tail(400)}") from None
        answer = self._receive(timeout)
        if answer is None and deadline is not None and time.time() >= deadline - 1:
            self.close(force=True)
            raise OutOfTime()
        if answer is None:
            raise EnvironmentFailed(
                f"{self.label} environment's worker did not answer within {timeout:g} s: {self.log_tail(400)}"
            )
        if answer.get("id") != message["id"] or answer.get("format") != FORMAT:
            raise EnvironmentFailed(f"{self.label} environment answered out of turn: {str(answer)[:200]}")
        if "error" in answer:
            raise EnvironmentFailed(f"{self.label} environment: etprop's worker failed: {answer['error']}")
        return answer

    def run(self, spec: dict, prop: str, flow: str, deadline: Optional[float] = None, attribute: bool = True) -> dict:
        return self.request({"spec": spec, "prop": prop, "flow": flow, "attribute": attribute}, deadline=deadline)

    def close(self, force: bool = False) -> None:
        if self._process is None:
            return
        try:
            if force:
                raise subprocess.TimeoutExpired("stop", 0)
            self._process.stdin.close()
            self._process.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            try:
                os.killpg(self._process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._process.wait(timeout=30)
        self._stderr.close()
        self._process = None

    def __enter__(self) -> "Environment":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def replay_in(python: str, args) -> int:
    """``etprop replay`` run by another environment's etprop: the recorded
    findings (and any repros named) judged with that environment's libraries."""
    if not (Path(python).is_file() or shutil.which(python)):
        raise UsageError(f"--env: no Python interpreter at '{python}'")
    probe = subprocess.run([python, "-c", "import etprop"], capture_output=True, text=True)
    if probe.returncode:
        raise UsageError(
            f"--env {python} has no etprop: install it there with "
            f"`{python} -m pip install --no-deps {project_source()}` (or create the environment "
            "with `etprop env DIR`)"
        )
    command = [python, "-P", "-m", "etprop.commands.cli", "replay", "--artifacts", args.artifacts, *args.paths]
    for module in args.flow_module:
        command += ["--flow-module", module]
    return subprocess.run(command).returncode
