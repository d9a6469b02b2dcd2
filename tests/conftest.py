"""Shared fixtures: tiny hand-written specs and a deliberately broken flow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from etprop.program.spec import FORMAT


def linear_relu_spec(out_features: int = 4) -> dict:
    """x[2, 8] -> Linear(8, out) -> relu: the smallest program with a weight."""
    return {
        "format": FORMAT,
        "state": {
            "l0": {
                "kind": "layer",
                "type": "Linear",
                "seed": 1,
                "kwargs": {"in_features": 8, "out_features": out_features, "bias": True},
            }
        },
        "methods": {
            "forward": {
                "inputs": [{"name": "x", "shape": [2, 8], "dtype": "float32"}],
                "nodes": [
                    {"id": "v0", "op": "layer", "args": ["x"], "state": "l0"},
                    {"id": "v1", "op": "relu", "args": ["v0"]},
                ],
                "outputs": ["v1"],
            }
        },
    }


@pytest.fixture
def while_loop_spec() -> dict:
    """x[2, 8] -> while_loop(2 iterations of a Linear): what the 1.5.1 emitter cannot emit."""
    return {
        "format": FORMAT,
        "state": {
            "l0": {
                "kind": "layer",
                "type": "Linear",
                "seed": 1,
                "kwargs": {"in_features": 8, "out_features": 8, "bias": True},
            }
        },
        "methods": {
            "forward": {
                "inputs": [{"name": "x", "shape": [2, 8], "dtype": "float32"}],
                "nodes": [
                    {
                        "id": "v0",
                        "op": "while_loop",
                        "args": ["x"],
                        "attrs": {"iterations": 2},
                        "bodies": [
                            {
                                "params": ["a0"],
                                "outputs": ["a1"],
                                "nodes": [{"id": "a1", "op": "layer", "args": ["a0"], "state": "l0"}],
                            }
                        ],
                    }
                ],
                "outputs": ["v0"],
            }
        },
    }


@pytest.fixture
def tiny_spec() -> dict:
    return linear_relu_spec()


@pytest.fixture(scope="session")
def make_linear_relu_spec():
    return linear_relu_spec


@pytest.fixture(scope="session")
def broken_flow():
    """Registers (once) the flows defined in tests/fixtures/broken_flows.py."""
    from etprop import flows

    flows.load_flow_module(str(Path(__file__).parent / "fixtures" / "broken_flows.py"))
    return flows.get("test-broken-weights")


class ScriptRunner:
    """Runs standalone scripts as ``python -I script`` would, each in a fork
    of one warm interpreter (tests/script_server.py): the same verdicts, about
    20 s less per script."""

    def __init__(self, log_dir):
        self._log = Path(log_dir) / "script_server.log"
        self._log_file = self._log.open("w")
        self._server = subprocess.Popen(
            [sys.executable, "-I", str(Path(__file__).with_name("script_server.py"))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            text=True,
        )
        self._reply()

    def _reply(self) -> dict:
        line = self._server.stdout.readline()
        if not line:
            raise RuntimeError(f"the script server stopped: {self._log.read_text()[-2000:]}")
        return json.loads(line)

    def run(self, script, cwd, timeout: float = 600):
        """A CompletedProcess for ``script`` run in ``cwd``; TimeoutExpired
        after ``timeout`` seconds, as subprocess.run would raise."""
        out, err = Path(cwd) / f"{Path(script).name}.stdout", Path(cwd) / f"{Path(script).name}.stderr"
        request = {"script": str(script), "cwd": str(cwd), "stdout": str(out), "stderr": str(err), "timeout": timeout}
        self._server.stdin.write(json.dumps(request) + "\n")
        self._server.stdin.flush()
        reply = self._reply()
        if reply.get("timed_out"):
            raise subprocess.TimeoutExpired([str(script)], timeout)
        return subprocess.CompletedProcess([str(script)], reply["returncode"], out.read_text(), err.read_text())

    def close(self) -> None:
        self._server.stdin.close()
        self._server.wait(timeout=60)
        self._log_file.close()


@pytest.fixture(scope="session")
def script_runner(tmp_path_factory):
    runner = ScriptRunner(tmp_path_factory.mktemp("script_server"))
    yield runner
    runner.close()
