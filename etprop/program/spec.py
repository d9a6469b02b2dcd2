"""Program specs: plain JSON-serializable descriptions of the programs etprop lowers.

A spec is a dict::

    {"format": "etprop-spec/1",
     "dtype":   "float32",                    # optional: the program's float dtype
     "state":   {name: state entry},          # layers, weights, buffers, constants
     "methods": {name: {"inputs": [...], "nodes": [...], "outputs": [...]}}}

State entries (``kind``):
  ``layer``     an nn layer: ``type`` (Linear, Conv1d, ...), ``kwargs``, ``seed``,
                ``parametrizations`` (a list, applied to ``on``: weight or bias).
  ``weight``    a holder module with one parameter ``weight`` of ``shape``,
                with optional ``parametrizations`` (a computed weight).
  ``parameter`` / ``buffer`` / ``constant``: a tensor of ``shape`` (buffers may
                be ``mutable``: updated in place by a ``buffer_update`` node).
Inputs: ``{"name", "shape", "dtype", "dynamic": [[dim, min, max], ...]}``.
Nodes: ``{"id", "op", "args": [value names], "attrs": {...}, "state": name}``;
control-flow nodes add ``"bodies": [{"params": [...], "nodes": [...], "outputs": [...]}]``.

Everything that differs between two programs is in the spec, so a spec is the
unit of shrinking, deduplication and reproduction.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterator

from etprop.errors import UsageError
from etprop.program.vocabulary import CONTROL_FLOW_OPS, OPS

FORMAT = "etprop-spec/1"
STATE_KINDS = ("layer", "weight", "parameter", "buffer", "constant")
LAYER_TYPES = ("Linear", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d",
               "LayerNorm", "BatchNorm1d", "BatchNorm2d", "GroupNorm")
PARAMETRIZATIONS = ("weight_norm", "spectral_norm", "scale", "add_delta", "low_rank",
                    "transpose", "reshape", "buffer_scale")
DTYPES = ("float32", "float16", "bfloat16")


class SpecError(UsageError):
    """A spec that cannot describe a program; the message names the offending part."""


def dumps(spec: dict) -> str:
    return json.dumps(spec, sort_keys=True, indent=1)


def loads(text: str) -> dict:
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"not valid JSON ({exc.msg} at line {exc.lineno}); "
                        "the file may be truncated: regenerate it with 'etprop fuzz'") from None
    validate(spec)
    return spec


def digest(spec: dict) -> str:
    """A short content hash: equal programs get equal names on disk."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def iter_nodes(nodes: list[dict]) -> Iterator[dict]:
    """Every node, control-flow bodies included, in program order."""
    for node in nodes:
        yield node
        for body in node.get("bodies", ()):
            yield from iter_nodes(body["nodes"])


def all_nodes(spec: dict) -> Iterator[tuple[str, dict]]:
    for method, body in spec["methods"].items():
        for node in iter_nodes(body["nodes"]):
            yield method, node


def _require(cond: Any, message: str) -> None:
    if not cond:
        raise SpecError(message)


def _check_body(where: str, body: dict, defined: set[str], state: dict) -> None:
    defined = set(defined)
    for node in body["nodes"]:
        _require(isinstance(node, dict) and "id" in node and "op" in node,
                 f"{where}: every node needs an 'id' and an 'op'")
        op = node["op"]
        _require(op in OPS or op in CONTROL_FLOW_OPS,
                 f"{where}: node {node['id']} has unknown op '{op}'; known ops: "
                 f"{', '.join(sorted(OPS) + list(CONTROL_FLOW_OPS))}")
        for arg in node.get("args", []):
            _require(arg in defined, f"{where}: node {node['id']} reads '{arg}' before it is defined")
        for key in ("state", "bias_state"):
            ref = node.get(key) or node.get("attrs", {}).get(key)
            _require(ref is None or ref in state,
                     f"{where}: node {node['id']} uses unknown state '{ref}'")
        if op in CONTROL_FLOW_OPS:
            bodies = node.get("bodies")
            _require(isinstance(bodies, list) and bodies,
                     f"{where}: control-flow node {node['id']} needs 'bodies'")
            for index, sub in enumerate(bodies):
                _check_body(f"{where}/{node['id']}[{index}]", sub, set(sub.get("params", [])), state)
        defined.add(node["id"])
    for out in body["outputs"]:
        _require(out in defined, f"{where}: output '{out}' is not defined")


def validate(spec: Any) -> None:
    """Raise SpecError naming the first problem; a valid spec passes silently."""
    _require(isinstance(spec, dict), "a spec must be a JSON object")
    _require(spec.get("format") == FORMAT,
             f"spec format is {spec.get('format')!r}, this etprop reads {FORMAT!r}; "
             "re-create the repro with this etprop version")
    _require(spec.get("dtype", "float32") in DTYPES,
             f"spec dtype {spec.get('dtype')!r} is not one of {DTYPES}")
    state = spec.get("state", {})
    _require(isinstance(state, dict), "'state' must be an object")
    for name, entry in state.items():
        _require(name.isidentifier(), f"state name {name!r} is not a Python identifier")
        _require(entry.get("kind") in STATE_KINDS,
                 f"state '{name}' has kind {entry.get('kind')!r}; expected one of {STATE_KINDS}")
        if entry["kind"] == "layer":
            _require(entry.get("type") in LAYER_TYPES,
                     f"layer '{name}' has unknown type {entry.get('type')!r}")
        for p in entry.get("parametrizations", []):
            _require(p.get("type") in PARAMETRIZATIONS,
                     f"state '{name}' has unknown parametrization {p.get('type')!r}")
    methods = spec.get("methods")
    _require(isinstance(methods, dict) and methods, "a spec needs at least one method")
    for mname, body in methods.items():
        _require(mname.isidentifier(), f"method name {mname!r} is not a Python identifier")
        inputs = body.get("inputs", [])
        for inp in inputs:
            _require(inp.get("dtype", "float32") in DTYPES,
                     f"method {mname}: input {inp.get('name')} has unsupported dtype {inp.get('dtype')!r}")
        _require(isinstance(body.get("nodes"), list) and isinstance(body.get("outputs"), list)
                 and body["outputs"], f"method {mname} needs 'nodes' and at least one output")
        _check_body(mname, body, {i["name"] for i in inputs}, state)


def count_ops(spec: dict) -> int:
    return sum(1 for _ in all_nodes(spec))
