"""Size limits for specs etprop did not draw itself.

A spec from a file is untrusted: an input of shape [200000, 200000] would make
torch allocate 160 GB before anything could refuse it. Every spec loaded from
a file is measured against these limits before anything is built. The
defaults sit far above what the strategies draw (tests/test_spec_input.py
checks that) and far below what a 2-CPU CI machine can hold; raise one with
``--limit NAME=N`` on any etprop command or ``ETPROP_LIMITS="NAME=N,..."``.
"""

from __future__ import annotations

import math
import os
from typing import Iterator

from etprop.errors import UsageError

DEFAULTS = {
    # elements of any one tensor: inputs (dynamic dims at their maximum),
    # state, a layer's weight, a size an op is asked to produce
    "tensor_elements": 1 << 22,
    # bytes of all parameters, buffers and constants of the program
    "state_bytes": 256 << 20,
    # nodes of the whole program, control-flow bodies included
    "nodes": 2000,
    # control flow nested in control flow
    "depth": 4,
    "methods": 16,
    # upsampling factor of one interpolate
    "scale_factor": 64,
}

_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


class LimitExceeded(UsageError):
    """A spec over a size limit; the message names the limit and how to raise it."""


def current() -> dict[str, int]:
    """The defaults, with ETPROP_LIMITS applied (``NAME=N,NAME=N``)."""
    limits = dict(DEFAULTS)
    for item in filter(None, (part.strip() for part in os.environ.get("ETPROP_LIMITS", "").split(","))):
        name, _, value = item.partition("=")
        if name not in DEFAULTS:
            raise UsageError(f"unknown limit '{name}' (--limit or ETPROP_LIMITS); known: {', '.join(DEFAULTS)}")
        try:
            limits[name] = int(float(value))
        except ValueError:
            raise UsageError(f"ETPROP_LIMITS: '{item}' is not NAME=NUMBER") from None
    return limits


def _over(what: str, amount: float, name: str, limits: dict) -> None:
    if amount > limits[name]:
        raise LimitExceeded(
            f"{what}: {amount:,.0f} is over the limit of {limits[name]:,} ({name}); "
            f"raise it with --limit {name}=N if you mean it"
        )


def _numel(shape) -> int:
    return math.prod(shape) if shape else 1


def _int_list(value, rank: int) -> list[int]:
    values = value if isinstance(value, list) else [value] * rank
    return [v if isinstance(v, int) and not isinstance(v, bool) else 1 for v in values]


def _layer_tensors(entry: dict) -> Iterator[int]:
    """Element counts of a layer's weight and bias, from its kwargs."""
    kwargs, kind = entry.get("kwargs", {}), entry.get("type", "")

    def number(key: str) -> int:
        value = kwargs.get(key, 1)
        return value if isinstance(value, int) and not isinstance(value, bool) else 1

    if kind == "Linear":
        yield number("in_features") * number("out_features")
        yield number("out_features")
    elif kind.startswith("Conv"):
        rank = 2 if kind.endswith("2d") else 1
        kernel = _numel(_int_list(kwargs.get("kernel_size", 1), rank))
        yield number("in_channels") * number("out_channels") * kernel
        yield number("out_channels")
    elif kind == "LayerNorm":
        yield _numel(_int_list(kwargs.get("normalized_shape", 1), 1))
    else:
        yield max(number("num_features"), number("num_channels"))


def _nodes(nodes: list[dict], depth: int, limits: dict, where: str) -> Iterator[dict]:
    for node in nodes:
        yield node
        bodies = node.get("bodies") or []
        if bodies and depth + 1 > limits["depth"]:
            _over(f"{where}: control flow nested {depth + 1} deep at node {node.get('id')}", depth + 1, "depth", limits)
        for body in bodies:
            yield from _nodes(body.get("nodes", []), depth + 1, limits, where)


def check(spec: dict, limits: dict | None = None) -> None:
    """Raise LimitExceeded for the first limit the spec is over. Assumes the
    spec passed the schema (etprop/program/schemas)."""
    limits = limits or current()
    methods = spec["methods"]
    _over("methods", len(methods), "methods", limits)
    state_bytes = 0
    for name, entry in spec["state"].items():
        counts = list(_layer_tensors(entry)) if entry["kind"] == "layer" else [_numel(entry["shape"])]
        for count in counts:
            _over(f"state '{name}' elements", count, "tensor_elements", limits)
        # A parametrized tensor holds its original and the helpers' tensors (about as large again).
        copies = 1 + len(entry.get("parametrizations", []))
        state_bytes += sum(counts) * copies * _BYTES.get(entry.get("dtype", spec.get("dtype", "float32")), 4)
    _over("state bytes", state_bytes, "state_bytes", limits)
    total = 0
    for method, body in methods.items():
        for inp in body["inputs"]:
            shape = list(inp["shape"])
            for dim, _, high in inp.get("dynamic", []):
                if dim < len(shape):
                    shape[dim] = max(shape[dim], high)
            _over(f"method '{method}' input '{inp['name']}' elements", _numel(shape), "tensor_elements", limits)
        for node in _nodes(body["nodes"], 0, limits, f"method '{method}'"):
            total += 1
            attrs = node.get("attrs", {})
            for key in ("output_size", "shape", "size"):
                if isinstance(attrs.get(key), list):
                    _over(
                        f"method '{method}' node {node['id']} {key}",
                        _numel([abs(v) for v in _int_list(attrs[key], 1)]),
                        "tensor_elements",
                        limits,
                    )
            factor = attrs.get("scale_factor")
            for value in factor if isinstance(factor, list) else [factor]:
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    _over(f"method '{method}' node {node['id']} scale_factor", value, "scale_factor", limits)
    _over("nodes", total, "nodes", limits)
