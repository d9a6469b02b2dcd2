"""The coverage space: which combinations of op, argument value and dtype a
program exercises. One definition, read by the gate's coverage corpus and by
campaign coverage reports.

A program's keys are tuples ``(op, argument, value, dtype)``:
- ``(op, "", "", dtype)`` for every op it holds (a layer counts as
  ``layer:<Type>``; control flow as ``cond``, ``map``, ``scan``, ``while_loop``,
  and a construct nested in another as ``cond>map`` and so on; an inlined one,
  straight-line code, as nothing; an out-of-place buffer update as
  ``buffer_update:out_of_place``);
- ``(op, argument, value, dtype)`` for every argument the generator draws
  (etprop.program.semantic_mutants.ARGUMENTS) set away from its default, the
  value in a class (booleans, strings and small integers as themselves, other
  numbers as their sign, sequences by length);
- ``(op, kind, "form", dtype)`` where a semantic mutant of that kind
  (etprop.program.semantic_mutants) needs more than the op to change the
  program, and the program has it: a twin weight of the same shape
  (``swap_weight``), a bias or second operand (``drop_operand``), two value
  operands (``swap_operands``);
- ``("methods", n, shared, dtype)`` for a program of several methods, with
  whether they share state.
``dtype`` is the program's input dtype, or the quantization scheme for a
quantized program.
"""

from __future__ import annotations

from typing import Iterator

from etprop.program.semantic_mutants import ARGUMENTS, LAYER_ARGUMENTS, Mutant, catalogue
from etprop.program.spec import FLOAT_DTYPES
from etprop.program.vocabulary import CONTROL_FLOW_OPS

Key = tuple[str, str, str, str]


def value_class(value) -> str:
    if value is None or isinstance(value, (bool, str)):
        return str(value)
    if isinstance(value, int):
        return str(value) if -4 <= value <= 8 else ("large" if value > 0 else "negative")
    if isinstance(value, float):
        return "0.0" if value == 0 else "positive" if value > 0 else "negative"
    if isinstance(value, (list, tuple)):
        return f"sequence of {len(value)}"
    return type(value).__name__


def program_dtype(spec: dict) -> str:
    scheme = (spec.get("quantization") or {}).get("scheme")
    if scheme:
        return f"quantized {scheme}"
    # The float dtypes: integer and bool inputs (ids, indices, masks) are the ops' business.
    dtypes = {value["dtype"] for body in spec["methods"].values() for value in body["inputs"]} & set(FLOAT_DTYPES)
    return "/".join(sorted(dtypes)) or "none"


def _is_control_flow(node: dict) -> bool:
    """A control-flow node rendered as such (an inlined one is straight-line code)."""
    return node["op"] in CONTROL_FLOW_OPS and not node.get("attrs", {}).get("inline")


def _walk(nodes: list[dict], outer: str) -> Iterator[tuple[str, dict]]:
    for node in nodes:
        yield outer, node
        for body in node.get("bodies", []):
            yield from _walk(body["nodes"], node["op"] if _is_control_flow(node) else outer)


# Mutant kinds that need a form beyond the op: a twin weight, a bias or a
# second operand, two value operands.
FORM_KINDS = ("swap_weight", "drop_operand", "swap_operands")
_FORM_MUTANTS: list[Mutant] = []


def _mutant_forms(spec: dict, dtype: str) -> set[Key]:
    if not _FORM_MUTANTS:
        _FORM_MUTANTS.extend(m for m in catalogue() if m.kind in FORM_KINDS)
    return {
        (mutant.op, mutant.kind, "form", dtype)
        for mutant in _FORM_MUTANTS
        if mutant.applies_to(spec) and next(mutant.variants(spec), None) is not None
    }


def keys(spec: dict) -> set[Key]:
    dtype = program_dtype(spec)
    found: set[Key] = set()
    for body in spec["methods"].values():
        for outer, node in _walk(body["nodes"], ""):
            op, attrs, defaults = node["op"], node.get("attrs", {}), ARGUMENTS.get(node["op"], {})
            if op == "layer":
                entry = spec["state"].get(node.get("state"), {})
                op, attrs = f"layer:{entry.get('type')}", entry.get("kwargs", {})
                defaults = LAYER_ARGUMENTS.get(entry.get("type"), {})
            if op in CONTROL_FLOW_OPS and not _is_control_flow(node):
                continue
            if op == "buffer_update" and not attrs.get("in_place", True):
                op = "buffer_update:out_of_place"
            found.add((op, "", "", dtype))
            if op in CONTROL_FLOW_OPS and outer:
                found.add((f"{outer}>{op}", "", "", dtype))
            for name, value in attrs.items():
                if name in defaults and value != defaults[name]:
                    found.add((op, name, value_class(value), dtype))
    found |= _mutant_forms(spec, dtype)
    if len(spec["methods"]) > 1:
        used = [
            {node.get("state") for _, node in _walk(body["nodes"], "")} - {None} for body in spec["methods"].values()
        ]
        shared = any(used[i] & used[j] for i in range(len(used)) for j in range(i + 1, len(used)))
        found.add(("methods", str(len(spec["methods"])), "shared state" if shared else "separate state", dtype))
    return found


def key_text(key: Key) -> str:
    """A key as one line of text (campaign records, reports)."""
    op, argument, value, dtype = key
    if value == "form":
        return f"{op} {argument} form [{dtype}]"
    return f"{op} {argument}={value} [{dtype}]" if argument else f"{op} [{dtype}]"


def greedy_cover(pool: list[dict]) -> tuple[list[int], set[Key]]:
    """Indices of pool programs that together reach every key the pool
    reaches, and those keys. Programs that can be packed together are
    picked first (each pick the one adding most keys, fewer nodes on a tie),
    then the others for what only they reach (several methods)."""
    from etprop.program.spec import count_ops

    pool_keys = [keys(spec) for spec in pool]
    wanted = set().union(*pool_keys) if pool_keys else set()
    chosen: list[int] = []
    covered: set[Key] = set()
    for packable in (True, False):
        candidates = [i for i in range(len(pool)) if (packing_class(pool[i]) is not None) == packable]
        while candidates:
            best = max(candidates, key=lambda i: (len(pool_keys[i] - covered), -count_ops(pool[i])))
            if not pool_keys[best] - covered:
                break
            chosen.append(best)
            covered |= pool_keys[best]
    return chosen, wanted


def packing_class(spec: dict):
    """Programs of one class can share one method (None: the program stays alone):
    single-method, the same program dtype, and for quantized programs the same
    whole-program quantization."""
    if len(spec["methods"]) != 1:
        return None
    quantization = spec.get("quantization")
    if quantization and quantization.get("modules"):
        return None
    return spec["format"], spec.get("dtype", "float32"), quantization["scheme"] if quantization else None


def _names(spec: dict) -> set[str]:
    names = set(spec["state"])

    def visit(body: dict) -> None:
        names.update(value["name"] for value in body.get("inputs", []))
        names.update(body.get("params", []))
        for node in body["nodes"]:
            names.add(node["id"])
            for sub in node.get("bodies", []):
                visit(sub)

    for body in spec["methods"].values():
        visit(body)
    return names


def _renamed(value, names: set[str], prefix: str):
    if isinstance(value, str):
        return prefix + value if value in names else value
    if isinstance(value, list):
        return [_renamed(item, names, prefix) for item in value]
    if isinstance(value, dict):
        return {key: value[key] if key == "op" else _renamed(value[key], names, prefix) for key in value}
    return value


def pack(specs: list[dict]) -> dict:
    """One single-method program computing every program of ``specs`` (all
    of one packing class) side by side: each keeps its own inputs, state and
    outputs under a prefix, so a failure shrinks back to the program it came from."""
    first = specs[0]
    packed = {key: value for key, value in first.items() if key not in ("methods", "state")}
    method = next(iter(first["methods"]))
    body = {"inputs": [], "nodes": [], "outputs": []}
    state: dict = {}
    for index, spec in enumerate(specs):
        prefix, names = f"p{index}_", _names(spec)
        (only,) = spec["methods"].values()
        renamed = _renamed(only, names, prefix)
        for key in body:
            body[key] += renamed[key]
        state.update({prefix + name: entry for name, entry in spec["state"].items()})
    packed.update(methods={method: body}, state=state)
    if first.get("quantization"):
        packed["quantization"] = dict(
            first["quantization"], calibration=max(spec["quantization"]["calibration"] for spec in specs)
        )
    return packed
