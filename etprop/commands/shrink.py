"""Shrinking a saved repro: the smallest spec that still fails the same way.

Hypothesis shrinks while a property runs, but CI runs without shrinking and a
campaign can end mid-shrink, so a repro on disk may still hold forty nodes and
three methods. ``etprop shrink FILE`` works on the spec directly: it tries
smaller programs (a method dropped, an output dropped, a node bypassed by one
of its arguments, a parametrization removed, dead code removed) and keeps each
one that still fails on the same flow with the same outcome and oracle (and,
with ``--match``, a message matching a regular expression). Candidates run in
the isolated worker, so a repro that crashes or hangs shrinks too.
"""

from __future__ import annotations

import copy
import math
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

from etprop.errors import UsageError
from etprop.program import spec as specmod
from etprop.verdicts import repro


def _referenced_state(nodes: list[dict]) -> set[str]:
    return set().union(*(specmod.state_refs(node) for node in specmod.iter_nodes(nodes)))


def _prune_body(body: dict) -> None:
    """Drop nodes no output depends on (bodies of kept nodes are pruned too)."""
    by_id = {node["id"]: node for node in body["nodes"]}
    live, stack = set(), list(body["outputs"])
    while stack:
        name = stack.pop()
        if name in live or name not in by_id:
            continue
        live.add(name)
        stack.extend(by_id[name].get("args", []))
    body["nodes"] = [node for node in body["nodes"] if node["id"] in live]
    for node in body["nodes"]:
        for sub in node.get("bodies", ()):
            _prune_body(sub)


def prune(spec: dict) -> dict:
    """Dead nodes, unused inputs and unused state removed."""
    spec = copy.deepcopy(spec)
    for body in spec["methods"].values():
        _prune_body(body)
        read = {arg for node in body["nodes"] for arg in node.get("args", [])} | set(body["outputs"])
        body["inputs"] = [inp for inp in body["inputs"] if inp["name"] in read] or body["inputs"][:1]
    used = set()
    for body in spec["methods"].values():
        used |= _referenced_state(body["nodes"])
    spec["state"] = {name: entry for name, entry in spec.get("state", {}).items() if name in used}
    quantization = spec.get("quantization")
    if quantization and quantization.get("modules"):
        kept = [name for name in quantization["modules"] if name in spec["state"]]
        if kept:
            quantization["modules"] = kept
        else:
            spec = _float(spec)
    return spec


def _float(spec: dict) -> dict:
    """The program without its quantization (a float spec)."""
    smaller = {key: value for key, value in spec.items() if key != "quantization"}
    smaller["format"] = specmod.format_for(smaller)
    return smaller


def _quantization_simplifications(spec: dict) -> Iterator[tuple[str, dict]]:
    """No quantization, then the quantizer narrowed to one layer, one
    calibration batch."""
    quantization = spec.get("quantization")
    if not quantization:
        return
    yield "no quantization", _float(spec)
    layers = quantization.get("modules") or sorted(
        {node["state"] for _, node in specmod.all_nodes(spec) if node["op"] == "layer"}
    )
    if len(layers) > 1 or not quantization.get("modules"):
        for layer in layers:
            smaller = copy.deepcopy(spec)
            smaller["quantization"]["modules"] = [layer]
            yield f"quantize layer {layer} only", smaller
    if quantization.get("calibration", 1) > 1:
        smaller = copy.deepcopy(spec)
        smaller["quantization"]["calibration"] = 1
        yield "one calibration batch", smaller


def _bodies(spec: dict) -> Iterator[tuple[str, dict]]:
    """Every node list with its outputs: methods, then control-flow bodies."""

    def walk(where: str, body: dict):
        yield where, body
        for node in body["nodes"]:
            for index, sub in enumerate(node.get("bodies", ())):
                yield from walk(f"{where}/{node['id']}[{index}]", sub)

    for method, body in spec["methods"].items():
        yield from walk(method, body)


def _bypass(body: dict, node: dict, replacement: str) -> None:
    """Every use of ``node`` reads ``replacement`` instead."""
    for other in body["nodes"]:
        other["args"] = [replacement if a == node["id"] else a for a in other.get("args", [])]
    body["outputs"] = [replacement if o == node["id"] else o for o in body["outputs"]]


def _bypass_chunk(body: dict, positions: list[int]) -> bool:
    """Bypass several nodes at once, each by its first argument (last first,
    so a chain inside the chunk collapses onto what feeds it)."""
    nodes = body["nodes"]
    if any(not nodes[p].get("args") for p in positions):
        return False
    for position in sorted(positions, reverse=True):
        _bypass(body, nodes[position], nodes[position]["args"][0])
    return True


def _node_removals(spec: dict) -> Iterator[tuple[str, dict]]:
    """Delta debugging over each body's nodes: halves, quarters, ... (bulk
    removals cost one lowering for many nodes), then one node by each of its arguments."""
    for where, body in list(_bodies(spec)):
        count = len(body["nodes"])
        chunk = count // 2
        while chunk >= 2:
            for first in range(count - chunk, -1, -chunk):
                smaller = copy.deepcopy(spec)
                if _bypass_chunk(dict(_bodies(smaller))[where], list(range(first, first + chunk))):
                    yield f"bypass nodes {first}..{first + chunk - 1} of {where}", smaller
            chunk //= 2
    for where, body in list(_bodies(spec)):
        for position in reversed(range(len(body["nodes"]))):
            node = body["nodes"][position]
            for arg in dict.fromkeys(node.get("args", [])):
                smaller = copy.deepcopy(spec)
                target = dict(_bodies(smaller))[where]
                _bypass(target, target["nodes"][position], arg)
                yield f"bypass {node['op']} {node['id']} in {where} with {arg}", smaller


_INPUT_DTYPES = ("float32", "float16", "bfloat16", "int64", "int32", "bool")


def _node_values(spec: dict, method: str) -> dict:
    """Eager values of a method's top-level nodes, by id ({} if the program
    does not run): the shapes a cut's new input takes."""
    import torch

    from etprop.program import builder

    probe = copy.deepcopy(spec)
    body = probe["methods"][method]
    body["outputs"] = list(dict.fromkeys(body["outputs"] + [node["id"] for node in body["nodes"]]))
    try:
        built = builder.build(probe, validate=False)
        values = built.eager(method, built.inputs(method))
    except Exception:
        return {}
    if len(values) != len(body["outputs"]):
        return {}
    return {name: value for name, value in zip(body["outputs"], values) if isinstance(value, torch.Tensor)}


def _cuts(spec: dict) -> Iterator[tuple[str, dict]]:
    """A node's value read from a new input of its shape and dtype instead:
    the node and whatever only it needed go at once, and what reads it still
    sees a tensor of the same shape (which bypassing by an argument may not
    keep). Latest nodes first: they take the most with them."""
    for method, body in spec["methods"].items():
        if len(body["nodes"]) < 2:
            continue
        values = _node_values(spec, method)
        names = {inp["name"] for inp in body["inputs"]}
        for node in reversed(body["nodes"]):
            value = values.get(node["id"])
            dtype = str(getattr(value, "dtype", "")).removeprefix("torch.")
            if value is None or dtype not in _INPUT_DTYPES or node["id"] in body["outputs"]:
                continue
            name = f"cut_{node['id']}"
            while name in names:
                name += "_"
            smaller = copy.deepcopy(spec)
            target = smaller["methods"][method]
            entry = {"name": name, "shape": list(value.shape), "dtype": dtype}
            if dtype in ("int64", "int32"):
                # Values in [0, high) fit wherever the node's did.
                entry["high"] = int(value.max()) + 1 if value.numel() and int(value.min()) >= 0 else 0
                if not entry["high"]:
                    continue
            target["inputs"].append(entry)
            smaller["format"] = specmod.format_for(smaller)
            _bypass(target, next(n for n in target["nodes"] if n["id"] == node["id"]), name)
            yield f"read {node['op']} {node['id']} of {method} from a new input {name}", smaller


def _simplifications(spec: dict) -> Iterator[tuple[str, dict]]:
    """Same nodes, simpler program: float32 for a low-precision dtype, one
    input read in place of another of its shape, static shapes, smaller
    inputs, arguments back to their defaults; for a quantized program, no
    quantization or less of it first."""
    yield from _quantization_simplifications(spec)
    low_precision = (
        spec.get("dtype", "float32") != "float32"
        or any(
            inp.get("dtype", "float32") not in ("float32", "int64", "bool")
            for body in spec["methods"].values()
            for inp in body["inputs"]
        )
        or any(entry.get("dtype") for entry in spec.get("state", {}).values())
    )
    if low_precision:
        smaller = copy.deepcopy(spec)
        smaller.pop("dtype", None)
        for body in smaller["methods"].values():
            for inp in body["inputs"]:
                if inp.get("dtype") in ("float16", "bfloat16"):
                    inp["dtype"] = "float32"
        for entry in smaller.get("state", {}).values():
            if entry.get("dtype") in ("float16", "bfloat16"):
                del entry["dtype"]
        yield "float32 instead of a low-precision dtype", smaller
    for method, body in spec["methods"].items():
        inputs = body["inputs"]
        for keep, inp in enumerate(inputs):
            for drop, other in enumerate(inputs):
                if (
                    drop != keep
                    and other["shape"] == inp["shape"]
                    and other.get("dtype") == inp.get("dtype")
                    # An index read for another stays within what that one indexes.
                    and inp.get("high", 0) <= other.get("high", 0)
                ):
                    smaller = copy.deepcopy(spec)
                    target = smaller["methods"][method]
                    for node in specmod.iter_nodes(target["nodes"]):
                        node["args"] = [inp["name"] if a == other["name"] else a for a in node.get("args", [])]
                    target["outputs"] = [inp["name"] if o == other["name"] else o for o in target["outputs"]]
                    yield f"read input {inp['name']} for {other['name']} in {method}", smaller
        for index, inp in enumerate(inputs):
            if inp.get("dynamic"):
                smaller = copy.deepcopy(spec)
                del smaller["methods"][method]["inputs"][index]["dynamic"]
                yield f"static shape for input {inp['name']} of {method}", smaller
                continue
            for dim, extent in enumerate(inp["shape"]):
                for new in dict.fromkeys((1, extent // 2)):
                    if 1 <= new < extent:
                        smaller = copy.deepcopy(spec)
                        smaller["methods"][method]["inputs"][index]["shape"][dim] = new
                        yield f"input {inp['name']} of {method}: dim {dim} {extent} -> {new}", smaller
    for method, node in list(specmod.all_nodes(spec)):
        for name in node.get("attrs", {}):
            smaller = copy.deepcopy(spec)
            twin = next(
                n
                for m, n in specmod.all_nodes(smaller)
                if m == method and n["id"] == node["id"] and n.get("attrs", {}).get(name) == node["attrs"][name]
            )
            del twin["attrs"][name]
            yield f"{node['op']} {node['id']}: {name} back to its default", smaller


def candidates(spec: dict) -> Iterator[tuple[str, dict]]:
    """Smaller variants of ``spec``, most reducing first."""
    methods = list(spec["methods"])
    if len(methods) > 1:
        for method in methods:
            smaller = copy.deepcopy(spec)
            del smaller["methods"][method]
            yield f"drop method {method}", smaller
    for method in methods:
        outputs = spec["methods"][method]["outputs"]
        if len(outputs) > 1:
            half = len(outputs) // 2
            for keep in (outputs[:half], outputs[half:]):
                smaller = copy.deepcopy(spec)
                smaller["methods"][method]["outputs"] = list(keep)
                yield f"keep outputs {keep} of {method}", smaller
            for index, out in enumerate(outputs):
                smaller = copy.deepcopy(spec)
                del smaller["methods"][method]["outputs"][index]
                yield f"drop output {out} of {method}", smaller
    yield from _node_removals(spec)
    yield from _cuts(spec)
    for name, entry in spec.get("state", {}).items():
        for index, parametrization in enumerate(entry.get("parametrizations", [])):
            smaller = copy.deepcopy(spec)
            del smaller["state"][name]["parametrizations"][index]
            if not smaller["state"][name]["parametrizations"]:
                del smaller["state"][name]["parametrizations"]
            yield f"drop parametrization {parametrization['type']} of {name}", smaller
    yield from _simplifications(spec)


def size(spec: dict) -> tuple:
    """What shrinking decreases, most important first: nodes; methods,
    outputs and parametrizations; inputs; low-precision values; attributes;
    input elements; text."""
    params = sum(len(e.get("parametrizations", [])) for e in spec.get("state", {}).values())
    outputs = sum(len(body["outputs"]) for body in spec["methods"].values())
    inputs = [inp for body in spec["methods"].values() for inp in body["inputs"]]
    low = (
        int(spec.get("dtype", "float32") != "float32")
        + sum(inp.get("dtype") in ("float16", "bfloat16") for inp in inputs)
        + sum(1 for e in spec.get("state", {}).values() if e.get("dtype") in ("float16", "bfloat16"))
    )
    attrs = sum(len(node.get("attrs", {})) for _, node in specmod.all_nodes(spec))
    quantization = spec.get("quantization")
    if quantization:
        # Quantized counts as low precision: the whole program, or each annotated layer.
        low += 1 + len(quantization.get("modules") or spec.get("state", {}))
        attrs += quantization.get("calibration", 1) - 1
    elements = sum(math.prod(inp["shape"]) + len(inp.get("dynamic", [])) for inp in inputs)
    return (
        specmod.count_ops(spec),
        params + outputs + len(spec["methods"]),
        len(inputs),
        low,
        attrs,
        elements,
        len(specmod.dumps(spec)),
    )


@dataclass
class Failure:
    """What "fails the same way" means for one shrink."""

    flow: str
    outcome: str
    oracle: str
    pattern: Optional[re.Pattern]

    def describe(self) -> str:
        return f"{self.flow}: {self.outcome} from the {self.oracle} oracle" + (
            f", message matching /{self.pattern.pattern}/" if self.pattern else ""
        )


def reproduces(result, failure: Failure) -> bool:
    """The failure is there, on its flow, and no known finding explains it."""
    if result is None:
        return False
    for flow_result in result.results:
        if flow_result.flow != failure.flow or flow_result.outcome.value != failure.outcome or flow_result.known:
            continue
        failed = [v for v in flow_result.verdicts if not v.ok]
        if not failed or failed[0].oracle != failure.oracle:
            continue
        return failure.pattern is None or bool(failure.pattern.search(flow_result.message))
    return False


def _is_valid(spec: dict) -> bool:
    """Cheap pre-check in this process: the spec builds and runs eagerly."""
    from etprop.program import builder
    from etprop.program.quantize import QuantizationFailed

    try:
        specmod.validate(spec)
        built = builder.build(spec, validate=False)
        for method in built.methods:
            built.eager(method, built.inputs(method))
    except QuantizationFailed as exc:
        # The program is valid; PT2E failing on it is a failure to shrink like any other.
        return exc.stage == "pt2e"
    except Exception:
        return False
    return True


@dataclass
class Shrunk:
    """A shrink's result. ``one_minimal``: a whole pass over every candidate
    (each single removal or simplification that still builds) kept none, so
    undoing any one step of it makes the failure go."""

    spec: dict
    checks: int
    one_minimal: bool

    def facts(self, original: dict) -> dict:
        return {
            "one_minimal": self.one_minimal,
            "checks": self.checks,
            "nodes_before": specmod.count_ops(original),
            "nodes": specmod.count_ops(self.spec),
        }


def shrink_to(
    spec: dict,
    still_fails: Callable[[dict], bool],
    log: Callable[[str], None] = print,
    max_checks: int = 400,
    deadline: Optional[float] = None,
    on_kept: Optional[Callable[[Shrunk], None]] = None,
) -> Shrunk:
    """Greedy: take the first smaller candidate that still fails, start over;
    stop at a 1-minimal spec, after ``max_checks`` lowerings or at ``deadline``.
    ``on_kept`` sees every smaller failing spec as it is found, so a shrink cut
    off by a crash or a kill still leaves its progress behind."""
    best = prune(spec)
    if best != spec and not still_fails(best):
        best = spec
    checks = 0
    improved, exhausted = True, False
    while improved and not exhausted:
        improved = False
        for label, candidate in candidates(best):
            if checks >= max_checks or (deadline is not None and time.time() > deadline):
                exhausted = True
                break
            candidate = prune(candidate)
            if size(candidate) >= size(best) or not _is_valid(candidate):
                continue
            checks += 1
            if still_fails(candidate):
                log(f"  kept: {label} -> {specmod.count_ops(candidate)} nodes")
                best, improved = candidate, True
                if on_kept is not None:
                    on_kept(Shrunk(best, checks, False))
                break
    log(
        f"shrink: {checks} candidates lowered; {specmod.count_ops(spec)} -> {specmod.count_ops(best)} nodes"
        + ("; 1-minimal" if not exhausted else "; stopped early (not 1-minimal)")
    )
    return Shrunk(best, checks, not exhausted)


def shrink(
    spec: dict, still_fails: Callable[[dict], bool], log: Callable[[str], None] = print, max_checks: int = 400
) -> dict:
    return shrink_to(spec, still_fails, log, max_checks).spec


def _failure_of(flow: Optional[str], match: Optional[str], first) -> Failure:
    failing = [r for r in first.results if r.outcome.is_failure]
    chosen = next((r for r in failing if r.flow == flow), None) if flow else (failing[-1] if failing else None)
    if chosen is None:
        raise UsageError(
            "the repro does not fail here (every flow passes), so there is nothing to shrink; "
            "check 'etprop repro' on it first"
        )
    oracle = next(v.oracle for v in chosen.verdicts if not v.ok)
    return Failure(chosen.flow, chosen.outcome.value, oracle, re.compile(match) if match else None)


def shrink_file(
    path: Path,
    output: Optional[Path],
    match: Optional[str],
    flow: Optional[str],
    max_checks: int,
    flow_modules: Optional[list[str]] = None,
) -> Path:
    """Shrink the repro at ``path``; write the result (JSON + script) and return its path."""
    from etprop import flows as flowreg
    from etprop.commands.replay import oracles_for
    from etprop.lowering.pipeline import ExportFailed
    from etprop.verdicts.session import Session

    record = repro.read(path)
    chosen = [flowreg.get_available(name) for name in record["flows"]]
    oracles = oracles_for(record["property"])
    with tempfile.TemporaryDirectory(prefix="etprop-shrink-") as scratch:
        session = Session(Path(scratch), flow_modules=flow_modules)
        try:
            # A new failure must stay new: a candidate whose failure a known
            # finding explains (its cause neutralized, the failure gone) has
            # drifted to that finding and does not count. A known failure's
            # own repro shrinks on its raw symptom.
            attribute = {"on": True}

            def run(spec):
                try:
                    return session.run(spec, chosen, record["property"], oracles, attribute=attribute["on"])
                except ExportFailed:
                    return None

            first = run(record["spec"])
            if first is None:
                raise UsageError(
                    f"the program in '{path}' does not export with this torch; "
                    "it cannot be shrunk here (see 'etprop repro' on it)"
                )
            if any(r.known for r in first.results if r.outcome.is_failure) and not first.new_failures:
                attribute["on"] = False
                first = run(record["spec"])
            failure = _failure_of(flow, match, first)
            print(
                f"shrinking {path} ({specmod.count_ops(record['spec'])} nodes) while it fails as {failure.describe()}"
            )
            # shrink() keeps exactly the candidates that reproduce, so the
            # last reproducing run is the smallest spec's: no final lowering.
            latest = {"result": first}

            def still_fails(spec):
                result = run(spec)
                if reproduces(result, failure):
                    latest["result"] = result
                    return True
                return False

            output = output or path.with_name(path.stem + ".shrunk.json")

            def save(shrunk: Shrunk) -> None:
                message = next((r.message for r in latest["result"].results if r.flow == failure.flow), "")
                repro.write(
                    output,
                    shrunk.spec,
                    record["flows"],
                    record["property"],
                    failure.outcome,
                    message,
                    script_flow=failure.flow,
                    shrink=shrunk.facts(record["spec"]),
                )

            shrunk = shrink_to(record["spec"], still_fails, max_checks=max_checks, on_kept=save)
        finally:
            session.close()
    save(shrunk)
    print(f"wrote {output} and {output.with_suffix('.py')}")
    return output
