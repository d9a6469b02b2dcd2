"""Shared fixtures: tiny hand-written specs and a deliberately broken flow."""

from __future__ import annotations

import pytest

from etprop.program.spec import FORMAT


def linear_relu_spec(out_features: int = 4) -> dict:
    """x[2, 8] -> Linear(8, out) -> relu: the smallest program with a weight."""
    return {
        "format": FORMAT,
        "state": {"l0": {"kind": "layer", "type": "Linear", "seed": 1,
                         "kwargs": {"in_features": 8, "out_features": out_features, "bias": True}}},
        "methods": {"forward": {
            "inputs": [{"name": "x", "shape": [2, 8], "dtype": "float32"}],
            "nodes": [{"id": "v0", "op": "layer", "args": ["x"], "state": "l0"},
                      {"id": "v1", "op": "relu", "args": ["v0"]}],
            "outputs": ["v1"]}},
    }


@pytest.fixture
def while_loop_spec() -> dict:
    """x[2, 8] -> while_loop(2 iterations of a Linear): what the 1.5.1 emitter cannot emit."""
    return {
        "format": FORMAT,
        "state": {"l0": {"kind": "layer", "type": "Linear", "seed": 1,
                         "kwargs": {"in_features": 8, "out_features": 8, "bias": True}}},
        "methods": {"forward": {
            "inputs": [{"name": "x", "shape": [2, 8], "dtype": "float32"}],
            "nodes": [{"id": "v0", "op": "while_loop", "args": ["x"], "attrs": {"iterations": 2},
                       "bodies": [{"params": ["a0"], "outputs": ["a1"],
                                   "nodes": [{"id": "a1", "op": "layer", "args": ["a0"], "state": "l0"}]}]}],
            "outputs": ["v0"]}},
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
    from pathlib import Path

    from etprop import flows

    flows.load_flow_module(str(Path(__file__).parent / "fixtures" / "broken_flows.py"))
    return flows.get("test-broken-weights")
