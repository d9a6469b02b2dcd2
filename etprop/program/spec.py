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
Inputs: ``{"name", "shape", "dtype", "dynamic": [[dim, min, max], ...]}``;
an int64 or int32 input (format etprop-spec/3) adds ``"high"``: its values
lie in [0, high); a bool input is a mask.
Nodes: ``{"id", "op", "args": [value names], "attrs": {...}, "state": name}``;
control-flow nodes add ``"bodies": [{"params": [...], "nodes": [...], "outputs": [...]}]``.

Everything that differs between two programs is in the spec, so a spec is the
unit of shrinking, deduplication and reproduction.
"""

from __future__ import annotations

import functools
import hashlib
import json
import keyword
from typing import Any, Callable, Iterator

from etprop.errors import UsageError, parse_json
from etprop.program.vocabulary import CONTROL_FLOW_OPS, OP_TABLE, OPS

FORMAT = "etprop-spec/1"
# etprop-spec/1 plus ``quantization`` (etprop/program/quantize.py). A float
# program is still written as etprop-spec/1, which etprop versions without
# quantization read.
QUANTIZED_FORMAT = "etprop-spec/2"
# etprop-spec/2 plus integer and bool method inputs (token ids, indices,
# masks): written only for programs that have one.
INTEGER_FORMAT = "etprop-spec/3"
# The published JSON Schemas (etprop/program/schemas, shipped with the package).
SCHEMAS = {
    FORMAT: "etprop-spec-1.schema.json",
    QUANTIZED_FORMAT: "etprop-spec-2.schema.json",
    INTEGER_FORMAT: "etprop-spec-3.schema.json",
}
FLOAT_DTYPES = ("float32", "float16", "bfloat16")
SCHEMA = SCHEMAS[FORMAT]


class SpecError(UsageError):
    """A spec that cannot describe a program; the message names the offending part."""


def dumps(spec: dict) -> str:
    return json.dumps(spec, sort_keys=True, indent=1)


def loads(text: str) -> dict:
    spec = parse_json(text, "the spec", "the file may be truncated: regenerate it with 'etprop fuzz'")
    validate(spec)
    return spec


def format_for(spec: dict) -> str:
    """The oldest format that describes ``spec``, so older readers keep
    reading what they can: /3 with an integer or bool input, /2 when
    quantized, else /1."""
    if any(
        inp.get("dtype", "float32") not in FLOAT_DTYPES for body in spec["methods"].values() for inp in body["inputs"]
    ):
        return INTEGER_FORMAT
    return QUANTIZED_FORMAT if spec.get("quantization") else FORMAT


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


def state_refs(node: dict) -> set[str]:
    """The state entries a node reads by name: its layer, weight or buffer,
    and the bias a GEMM adds (``attrs.bias_state``)."""
    return {node.get("state"), node.get("attrs", {}).get("bias_state")} - {None, ""}


def rename_state_refs(node: dict, rename: Callable[[str], str]) -> None:
    """Point every state reference of ``node`` (see ``state_refs``) at ``rename(name)``."""
    if node.get("state"):
        node["state"] = rename(node["state"])
    attrs = node.get("attrs", {})
    if attrs.get("bias_state"):
        attrs["bias_state"] = rename(attrs["bias_state"])


def _require(cond: Any, message: str) -> None:
    if not cond:
        raise SpecError(message)


# Names the generated source defines or imports: a spec name equal to one
# would shadow it (never run code, but fail in confusing ways).
_RESERVED = {
    "self",
    "torch",
    "nn",
    "F",
    "parametrize",
    "parametrizations",
    "hop_map",
    "hop_scan",
    "hop_while_loop",
    "DTYPES",
    "Program",
    "INPUTS",
    "make_input",
    "step",
    "carried",
}
# Integer attributes that drive Python-level work when the program is built
# (a list of slices, loop trips, power iterations): bounded so a spec cannot hang.
_BOUNDED_INTS = {"dim": 8, "iterations": 64, "n_power_iterations": 64}
_HOW = ("add", "mul", "copy")


def _check_name(where: str, name: str) -> None:
    _require(
        not keyword.iskeyword(name) and name not in _RESERVED,
        f"{where}: name '{name}' is reserved (a Python keyword or a name the generated program uses)",
    )


def _check_body(where: str, body: dict, defined: set[str], state: dict) -> None:
    defined = set(defined)
    for node in body["nodes"]:
        node_id, op = node["id"], node["op"]
        _check_name(where, node_id)
        _require(node_id not in defined, f"{where}: '{node_id}' is defined twice")
        _require(
            op in OPS or op in CONTROL_FLOW_OPS,
            f"{where}: node {node_id} has unknown op '{op}'; known ops: "
            f"{', '.join(sorted(OPS) + list(CONTROL_FLOW_OPS))}",
        )
        if op in OP_TABLE:
            needed, given = OP_TABLE[op].operands, len(node.get("args", []))
            _require(
                given >= needed, f"{where}: node {node_id} ({op}) reads {given} value(s) in 'args'; it needs {needed}"
            )
        for arg in node.get("args", []):
            _require(arg in defined, f"{where}: node {node_id} reads '{arg}' before it is defined")
        for key in ("state", "bias_state"):
            ref = node.get(key) or node.get("attrs", {}).get(key)
            _require(ref is None or ref in state, f"{where}: node {node_id} uses unknown state '{ref}'")
        attrs = node.get("attrs", {})
        for key, bound in _BOUNDED_INTS.items():
            value = attrs.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                _require(abs(value) <= bound, f"{where}: node {node_id} has {key}={value}, beyond {bound}")
        if op == "buffer_update":
            _require(
                attrs.get("how") in _HOW,
                f"{where}: node {node_id} updates its buffer by {attrs.get('how')!r}; expected one of {_HOW}",
            )
        if op in CONTROL_FLOW_OPS:
            bodies = node.get("bodies")
            _require(isinstance(bodies, list) and bodies, f"{where}: control-flow node {node_id} needs 'bodies'")
            for index, sub in enumerate(bodies):
                for param in sub.get("params", []):
                    _check_name(f"{where}/{node_id}[{index}]", param)
                _check_body(f"{where}/{node_id}[{index}]", sub, set(sub.get("params", [])), state)
        defined.add(node_id)
    for out in body["outputs"]:
        _require(out in defined, f"{where}: output '{out}' is not defined")


@functools.lru_cache(maxsize=None)
def _validator(name: str):
    """A jsonschema validator for a schema shipped in etprop/program/schemas."""
    import importlib.resources

    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource

    folder = importlib.resources.files("etprop.program") / "schemas"
    schemas = {
        entry.name: json.loads(entry.read_text()) for entry in folder.iterdir() if entry.name.endswith(".schema.json")
    }
    registry = Registry().with_resources((schema["$id"], Resource.from_contents(schema)) for schema in schemas.values())
    return Draft202012Validator(schemas[name], registry=registry)


def check_schema(document: Any, schema: str) -> None:
    """Raise SpecError with the most relevant schema violation, as one line."""
    from jsonschema.exceptions import best_match

    error = best_match(_validator(schema).iter_errors(document))
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path) or "the document"
        message = " ".join(error.message.split())
        if len(message) > 200:
            message = message[:200] + "..."
        raise SpecError(f"{where}: {message} (schema {schema})")


def _check_quantization(spec: dict) -> None:
    """What the spec-2 schema cannot say about ``quantization``: its layers
    exist, and the program holds no state a call mutates (a quantized program is
    a converted graph, judged call by call)."""
    config = spec.get("quantization")
    if config is None:
        return
    for name in config.get("modules") or ():
        entry = spec["state"].get(name)
        _require(
            entry is not None and entry["kind"] == "layer",
            f"quantization: modules names '{name}', which is not a layer of the program's state",
        )
    _require(
        not any(entry["kind"] == "buffer" and entry.get("mutable") for entry in spec["state"].values()),
        "quantization: a program with mutable buffers cannot be quantized; drop 'quantization' or the "
        "buffer_update nodes",
    )


def validate(spec: Any, limits: dict | None = None) -> None:
    """Raise SpecError (or LimitExceeded) naming the first problem: the
    published schema, then what a schema cannot say (names defined before
    use, state that exists, known ops), then the size limits."""
    from etprop.program import limits as size_limits

    _require(isinstance(spec, dict), "a spec must be a JSON object")
    _require(
        spec.get("format") in SCHEMAS,
        f"spec format is {spec.get('format')!r}, this etprop reads {' and '.join(map(repr, SCHEMAS))}; "
        "re-create the repro with this etprop version",
    )
    check_schema(spec, SCHEMAS[spec["format"]])
    state = spec["state"]
    _check_quantization(spec)
    for name, entry in state.items():
        _check_name("state", name)
    for mname, body in spec["methods"].items():
        _check_name("methods", mname)
        names = [inp["name"] for inp in body["inputs"]]
        _require(len(set(names)) == len(names), f"method {mname}: two inputs share a name")
        for name in names:
            _check_name(f"method {mname}", name)
        _check_body(mname, body, set(names), state)
    size_limits.check(spec, limits)


def count_ops(spec: dict) -> int:
    return sum(1 for _ in all_nodes(spec))
