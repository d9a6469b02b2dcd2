"""Spec rewrites that remove one recorded defect's cause and nothing else.

A failure is attributed to a finding only by intervention: the finding names
how to neutralize its cause (``"neutralize"`` in findings/index.json, a list of
the rewrites below), and the failure is known only if the neutralized spec no
longer fails. Each rewrite touches only what the finding names: an argument of
its op, its layer's keyword arguments, its parametrization, or its op replaced
by an equivalent form. It never deletes an unrelated node, state entry or output.

Rewrites (``{"rewrite": NAME, ...}``):

- ``set_attrs``: ``ops``, ``attrs``; nodes of those ops get those attribute values
  (``where`` optional: only nodes whose attributes have these values;
  ``having`` optional: only nodes where these attributes are set and not zero;
  ``types`` optional: only layers of these types; ``state_kwargs`` optional:
  only layers constructed with these arguments; ``after`` optional: only
  nodes whose first operand one of these ops computes, a layer named by its
  type as ``layer:TYPE``; ``not_after`` optional: only nodes
  whose first operand none of these ops computes; ``bias_computed``
  optional: only GEMMs whose bias state entry is computed (has
  parametrizations); ``dtypes`` optional:
  only in programs of these dtypes; ``schemes`` optional: only in programs
  quantized with one of these schemes).
- ``drop_attrs``: ``ops``, ``attrs``; those attributes removed (back to the op's default).
- ``copy_attrs``: ``ops``, ``copy`` (target -> source); where a node leaves the
  target attribute unset, it gets the source's value: an argument whose
  default is another argument's value, written out.
- ``set_layer_kwargs``: ``types``, ``kwargs``; layers of those types get those kwargs.
- ``drop_parametrization``: ``type``, ``rank`` and ``where`` (optional); that
  parametrization (with those attribute values) is removed from every state
  entry that computes a tensor of that rank with it.
- ``set_parametrization_attrs``: ``type``, ``attrs``; every parametrization of
  that type gets those attribute values (an equivalent form of the same weight).
- ``inline_control_flow``: ``ops``; control-flow nodes rendered as their
  equivalent straight-line form (both branches and ``where``; an unrolled loop).
- ``buffer_update_out_of_place``: every ``buffer_update`` computes the updated
  value without writing it back, and its buffer stops being mutable.
- ``bias_per_use``: ``ops``, ``types``; every GEMM node of those ops after the
  first that reads a bias state entry another node also reads gets a copy of
  it, and every call of a layer of those types after the first gets a copy of
  the layer (same seeds: the same values, no longer one tensor). A ``linear``
  in the body of an inlined loop, which every iteration calls with one bias,
  adds its bias after the product instead (``separate_bias``).
- ``weight_per_use``: ``ops``; in each method, every node of those ops after
  the first that reads a weight entry (its ``state``) another node of those ops
  read reads a copy of it (same seed: the same values, no longer one tensor).
- ``state_apart_from_control_flow``: a state entry that a control-flow node's
  bodies read and that something outside that node reads too is read inside
  the node from a copy of its own (same kind, seed and shape: the same values,
  no longer one tensor shared across the control-flow operand and the rest).
- ``merge_repeated_scales``: where the ``scale`` parametrizations of one tensor
  repeat a factor with nothing between them but other scales and
  ``buffer_scale`` (both multiply, so they commute), those scales become one
  scale by their product, dropped when the product is 1 (the same values:
  drawn factors are ±powers of two, so the products are exact); with
  ``every_chain``, every run of two or more multiplying steps holding a
  scale, repeated or not, and where the run multiplies by a buffer too, its
  scales go into that buffer's stored values (``factor`` on ``buffer_scale``).
- ``gemm_scalars_into_weights``: ``ops``; a GEMM's ``beta`` and ``alpha`` (the
  scalars it multiplies its bias and its product by) become a last ``scale``
  of its bias's and its weight's state entries, each copied first if anything
  else reads it (the same values: ``beta * b`` is ``b * beta``, and
  ``alpha * (x @ w)`` is ``x @ (w * alpha)`` exactly for the drawn ±powers of
  two). A zero scalar is left alone.
- ``static_inputs``: ``ops``, ``types`` (optional: only layers of these
  types); a method holding a node of those ops (control-flow bodies
  included) is exported at its example shapes: its inputs' ``dynamic`` dims
  are dropped (the same values; only the export's shape guards change).
- ``shared_single_pixel_via_float64``: ``ops``, ``schemes``; in a program
  quantized with one of them, a top-level value of those ops, of shape (N, C, 1, 1), that several
  readers take (a method output counts as one) gets ``output_via_float64``:
  the same values, through a cast no delegate takes, so no delegate holds
  that value for several readers.
- ``conv_input_apart``: ``ops``, ``types`` (the ``layer`` nodes among those
  ops that count), ``schemes``, ``attrs`` (default ``input_copy``),
  ``beside`` (optional); in a program quantized with one of them, where
  several of those convolutions read one value (with ``beside`` ``any``:
  where anything else reads it too, a method output included), each of them
  gets ``attrs``: a copy of the value, or the value cast to float64 and back
  (the same values), so no one dynamically quantized input is shared.
- ``frozen_state``: ``ops``; in a program holding a node of those ops
  (control-flow bodies included), every layer, weight and parameter is
  frozen (``requires_grad`` off): the same values and the same exported
  program, only autograd no longer tracks them while torch traces it.
- ``int32_batch_counter_when_dynamic``: ``types``; in a program with a dynamic
  input dim, every layer of those types holds its ``num_batches_tracked``
  counter as int32, not int64 (``batch_counter_int32``): the same values in
  eval (only training reads it), and no 64-bit tensor among the exported
  program's inputs.
- ``quantize_folded_weights``: a quantized program's computed weights are
  stored as their values before quantizing (``fold_computed_weights``): the
  same float program, whose weights PT2E no longer quantizes op by op.
"""

from __future__ import annotations

import copy
from typing import Callable

from etprop.errors import UsageError
from etprop.program.spec import all_nodes, iter_nodes, rename_state_refs, state_refs


def _nodes_of(spec: dict, ops) -> list[dict]:
    return [node for _, node in all_nodes(spec) if node["op"] in ops]


def _has(attrs: dict, wanted: dict) -> bool:
    return all(attrs.get(name) == value for name, value in wanted.items())


def _nonzero(value) -> bool:
    return any(_nonzero(v) for v in value) if isinstance(value, (list, tuple)) else bool(value)


def _producers(spec: dict) -> dict[str, set[str]]:
    """Value name -> the names of what computes it: its node's op, and for a
    layer also ``layer:TYPE``."""
    names = {}
    for _, node in all_nodes(spec):
        names[node["id"]] = {node["op"]}
        if node["op"] == "layer":
            names[node["id"]].add(f"layer:{spec['state'].get(node.get('state'), {}).get('type')}")
    return names


def _set_attrs(spec: dict, rule: dict) -> int:
    changed = 0
    if "dtypes" in rule and spec.get("dtype", "float32") not in rule["dtypes"]:
        return 0
    if "schemes" in rule and (spec.get("quantization") or {}).get("scheme") not in rule["schemes"]:
        return 0
    producers = _producers(spec) if "after" in rule or "not_after" in rule else {}
    for node in _nodes_of(spec, rule["ops"]):
        entry = spec["state"].get(node.get("state"), {})
        if "types" in rule and entry.get("type") not in rule["types"]:
            continue
        if any(entry.get("kwargs", {}).get(name) != value for name, value in rule.get("state_kwargs", {}).items()):
            continue
        made_by = producers.get((node.get("args") or [None])[0], set())
        if "after" in rule and not made_by & set(rule["after"]):
            continue
        if made_by & set(rule.get("not_after", ())):
            continue
        attrs = node.get("attrs", {})
        if rule.get("bias_computed") and not spec["state"].get(attrs.get("bias_state"), {}).get("parametrizations"):
            continue
        if not _has(attrs, rule.get("where", {})) or not all(
            _nonzero(attrs.get(name)) for name in rule.get("having", ())
        ):
            continue
        if any(attrs.get(name) != value for name, value in rule["attrs"].items()):
            node.setdefault("attrs", attrs).update(rule["attrs"])
            changed += 1
    return changed


def _copy_attrs(spec: dict, rule: dict) -> int:
    changed = 0
    for node in _nodes_of(spec, rule["ops"]):
        attrs = node.get("attrs", {})
        for target, source in rule["copy"].items():
            if attrs.get(target) is None and attrs.get(source) is not None:
                attrs[target] = copy.deepcopy(attrs[source])
                changed += 1
    return changed


def _drop_attrs(spec: dict, rule: dict) -> int:
    changed = 0
    for node in _nodes_of(spec, rule["ops"]):
        attrs = node.get("attrs", {})
        present = [name for name in rule["attrs"] if name in attrs]
        for name in present:
            del attrs[name]
        changed += bool(present)
    return changed


def _set_layer_kwargs(spec: dict, rule: dict) -> int:
    changed = 0
    for entry in spec["state"].values():
        if entry["kind"] == "layer" and entry["type"] in rule["types"]:
            if any(entry["kwargs"].get(k) != v for k, v in rule["kwargs"].items()):
                entry["kwargs"].update(rule["kwargs"])
                changed += 1
    return changed


def parametrized_rank(entry: dict, parametrization: dict) -> int:
    """The rank of the tensor a parametrization computes (a layer's bias is 1-D)."""
    if entry["kind"] == "layer":
        return 1 if parametrization.get("on") == "bias" else 2
    return len(entry.get("shape", []))


def _drop_parametrization(spec: dict, rule: dict) -> int:
    changed = 0
    for entry in spec["state"].values():
        kept = [
            p
            for p in entry.get("parametrizations", [])
            if not (
                p["type"] == rule["type"]
                and _has(p, rule.get("where", {}))
                and ("rank" not in rule or parametrized_rank(entry, p) == rule["rank"])
            )
        ]
        if len(kept) != len(entry.get("parametrizations", [])):
            entry["parametrizations"] = kept
            changed += 1
    return changed


def _set_parametrization_attrs(spec: dict, rule: dict) -> int:
    changed = 0
    for entry in spec["state"].values():
        touched = False
        for parametrization in entry.get("parametrizations", []):
            if parametrization["type"] == rule["type"] and not _has(parametrization, rule["attrs"]):
                parametrization.update(rule["attrs"])
                touched = True
        changed += touched
    return changed


def _static_inputs(spec: dict, rule: dict) -> int:
    changed = 0
    for body in spec["methods"].values():
        holds = any(
            node["op"] in rule["ops"]
            and ("types" not in rule or spec["state"].get(node.get("state"), {}).get("type") in rule["types"])
            for node in iter_nodes(body["nodes"])
        )
        dynamic = [entry for entry in body["inputs"] if entry.get("dynamic")]
        if holds and dynamic:
            for entry in dynamic:
                del entry["dynamic"]
            changed += 1
    return changed


def _inline_control_flow(spec: dict, rule: dict) -> int:
    return _set_attrs(spec, {"ops": rule["ops"], "attrs": {"inline": True}})


def _buffer_update_out_of_place(spec: dict, rule: dict) -> int:
    nodes = _nodes_of(spec, ("buffer_update",))
    for node in nodes:
        node.setdefault("attrs", {})["in_place"] = False
        spec["state"][node["state"]]["mutable"] = False
    return len(nodes)


def _frozen_state(spec: dict, rule: dict) -> int:
    if not _nodes_of(spec, rule["ops"]):
        return 0
    thawed = [
        entry
        for entry in spec["state"].values()
        if entry["kind"] in ("layer", "weight", "parameter") and not entry.get("frozen")
    ]
    for entry in thawed:
        entry["frozen"] = True
    return len(thawed)


def _int32_batch_counter_when_dynamic(spec: dict, rule: dict) -> int:
    if not any(entry.get("dynamic") for body in spec["methods"].values() for entry in body["inputs"]):
        return 0
    counted = [
        entry
        for entry in spec["state"].values()
        if entry["kind"] == "layer" and entry["type"] in rule["types"] and not entry.get("batch_counter_int32")
    ]
    for entry in counted:
        entry["batch_counter_int32"] = True
    return len(counted)


def _quantize_folded_weights(spec: dict, rule: dict) -> int:
    quantization = spec.get("quantization")
    if (
        not quantization
        or quantization.get("fold_computed_weights")
        or not any(entry.get("parametrizations") for entry in spec["state"].values())
    ):
        return 0
    quantization["fold_computed_weights"] = True
    return 1


def _bias_of_its_own(spec: dict, rule: dict) -> int:
    """A GEMM whose bias is its own weight tensor reads the bias from a copy of
    that state entry instead (same kind, seed and shape: the same values)."""
    changed = 0
    for node in _nodes_of(spec, rule["ops"]):
        attrs = node.get("attrs", {})
        if node.get("state") is None or attrs.get("bias_state") != node["state"]:
            continue
        name = node["state"] + "_bias"
        while name in spec["state"]:
            name += "_"
        spec["state"][name] = copy.deepcopy(spec["state"][node["state"]])
        attrs["bias_state"] = name
        changed += 1
    return changed


def _copy_entry(spec: dict, name: str) -> str:
    copied = name + "_use"
    while copied in spec["state"]:
        copied += "_"
    spec["state"][copied] = copy.deepcopy(spec["state"][name])
    return copied


def _bias_per_use(spec: dict, rule: dict) -> int:
    """Biases read by several GEMM nodes, and layers called at several
    places, get one copy per use after the first."""
    changed = 0
    seen: set[str] = set()
    for _, loop in all_nodes(spec):
        if loop["op"] in ("map", "scan", "while_loop") and loop.get("attrs", {}).get("inline"):
            for node in (n for body in loop["bodies"] for n in iter_nodes(body["nodes"])):
                attrs = node.get("attrs", {})
                if (
                    node["op"] == "linear"
                    and "linear" in rule.get("ops", ())
                    and attrs.get("bias_state")
                    and not attrs.get("separate_bias")
                ):
                    attrs["separate_bias"] = True
                    changed += 1
    for _, node in all_nodes(spec):
        attrs = node.get("attrs", {})
        if node["op"] in rule.get("ops", ()) and attrs.get("bias_state"):
            if attrs["bias_state"] in seen:
                attrs["bias_state"] = _copy_entry(spec, attrs["bias_state"])
                changed += 1
            seen.add(attrs["bias_state"])
        elif node["op"] == "layer" and spec["state"][node["state"]].get("type") in rule.get("types", ()):
            if node["state"] in seen:
                node["state"] = _copy_entry(spec, node["state"])
                changed += 1
            seen.add(node["state"])
    return changed


def _weight_per_use(spec: dict, rule: dict) -> int:
    """Weights read by several nodes of ``ops`` within one method get one copy
    per reader after the first (methods still share theirs)."""
    changed = 0
    for body in spec["methods"].values():
        seen: set[str] = set()
        for node in iter_nodes(body["nodes"]):
            name = node.get("state")
            if node["op"] not in rule["ops"] or not name or spec["state"][name]["kind"] != "weight":
                continue
            if name in seen:
                node["state"] = _copy_entry(spec, name)
                changed += 1
            seen.add(name)
    return changed


def _state_apart_from_control_flow(spec: dict, rule: dict) -> int:
    """Outermost control-flow nodes first: each one that shares a state entry
    with the rest of the program reads a copy inside; nested nodes are then
    judged against the rest, copies included."""
    changed = 0
    for _, node in list(all_nodes(spec)):
        if not node.get("bodies"):
            continue
        inside = [n for body in node["bodies"] for n in iter_nodes(body["nodes"])]
        inside_ids = {id(n) for n in inside}
        outside = set().union(*(state_refs(n) for _, n in all_nodes(spec) if id(n) not in inside_ids))
        shared = set().union(*(state_refs(n) for n in inside)) & outside
        renames = {name: _copy_entry(spec, name) for name in sorted(shared)}
        for inner in inside:
            rename_state_refs(inner, lambda name: renames.get(name, name))
        changed += len(renames)
    return changed


def _gemm_scalars_into_weights(spec: dict, rule: dict) -> int:
    changed = 0
    for node in _nodes_of(spec, rule["ops"]):
        attrs = node.get("attrs", {})
        for scalar, ref in (("beta", "bias_state"), ("alpha", "state")):
            holder = attrs if ref == "bias_state" else node
            name, factor = holder.get(ref), attrs.get(scalar)
            if not name or factor in (None, 0, 1) or spec["state"][name]["kind"] != "weight":
                continue
            readers = sum(name in state_refs(other) for _, other in all_nodes(spec))
            if readers > 1 or node.get("state") == attrs.get("bias_state"):
                name = holder[ref] = _copy_entry(spec, name)
            spec["state"][name].setdefault("parametrizations", []).append({"type": "scale", "factor": factor})
            del attrs[scalar]
            changed += 1
    return changed


def _merge_repeated_scales(spec: dict, rule: dict) -> int:
    changed = 0
    for entry in spec["state"].values():
        steps = entry.get("parametrizations", [])
        # Per tensor, runs of multiplying steps (scale, buffer_scale) between non-commuting ones.
        runs: list[list[int]] = []
        open_run: dict[str, list[int]] = {}
        for index, step in enumerate(steps):
            target = step.get("on", "weight")
            if step["type"] in ("scale", "buffer_scale"):
                if target not in open_run:
                    open_run[target] = []
                    runs.append(open_run[target])
                open_run[target].append(index)
            else:
                open_run.pop(target, None)
        replaced: dict[int, dict | None] = {}
        for run in runs:
            scales = [index for index in run if steps[index]["type"] == "scale"]
            buffers = [index for index in run if steps[index]["type"] == "buffer_scale"]
            factors = [steps[index]["factor"] for index in scales]
            if not rule.get("every_chain"):
                buffers = []
                if len(scales) < 2 or len(set(factors)) == len(factors):
                    continue
            elif not scales or len(scales) + len(buffers) < 2:
                continue
            product = 1.0
            for factor in factors:
                product *= factor
            replaced.update(dict.fromkeys(scales))
            if buffers:
                first = {key: value for key, value in steps[buffers[0]].items() if key != "factor"}
                factor = steps[buffers[0]].get("factor", 1.0) * product
                replaced[buffers[0]] = {**first, "factor": factor} if factor != 1.0 else first
            elif product != 1.0:
                replaced[scales[0]] = {**steps[scales[0]], "factor": product}
        if not replaced:
            continue
        entry["parametrizations"] = [
            replaced.get(index, step) for index, step in enumerate(steps) if replaced.get(index, step) is not None
        ]
        changed += 1
    return changed


def _reader_counts(nodes, outputs) -> dict[str, int]:
    """Value name -> how many node operands and method outputs read it."""
    readers: dict[str, int] = {}
    for name in [arg for node in nodes for arg in node.get("args", [])] + list(outputs):
        readers[name] = readers.get(name, 0) + 1
    return readers


def _shared_single_pixel_via_float64(spec: dict, rule: dict) -> int:
    if (spec.get("quantization") or {}).get("scheme") not in rule["schemes"]:
        return 0
    shared = {}
    for method, body in spec["methods"].items():
        readers = _reader_counts(iter_nodes(body["nodes"]), body["outputs"])
        shared[method] = {name for name, count in readers.items() if count > 1}
    if not any(shared.values()):
        return 0
    from etprop.program import builder
    from etprop.program.semantic_mutants import node_shapes

    # The float program has the shapes of the quantized one, without running PT2E.
    # A program whose shapes cannot be computed node by node keeps its form:
    # its failure is then reported as new, never silenced.
    try:
        built = builder.build({key: value for key, value in spec.items() if key != "quantization"}, validate=False)
        shapes = node_shapes(built, {method: built.inputs(method) for method in spec["methods"]})
    except Exception:
        return 0
    changed = 0
    for method, body in spec["methods"].items():
        for node in body["nodes"]:
            shape = shapes.get((method, node["id"]))
            if (
                node["op"] in rule["ops"]
                and node["id"] in shared[method]
                and shape
                and len(shape) == 4
                and shape[2:] == (1, 1)
            ):
                node.setdefault("attrs", {})["output_via_float64"] = True
                changed += 1
    return changed


def _conv_input_apart(spec: dict, rule: dict) -> int:
    if (spec.get("quantization") or {}).get("scheme") not in rule["schemes"]:
        return 0
    attrs = rule.get("attrs", {"input_copy": True})
    changed = 0
    for _, body in _bodies(spec):
        readers = _reader_counts(body["nodes"], body.get("outputs", []))
        convs: dict[str, list[dict]] = {}
        for node in body["nodes"]:
            if (
                node["op"] in rule["ops"]
                and node.get("args")
                and (node["op"] != "layer" or spec["state"].get(node.get("state"), {}).get("type") in rule["types"])
            ):
                convs.setdefault(node["args"][0], []).append(node)
        for value, nodes in convs.items():
            shared = readers[value] > 1 if rule.get("beside") == "any" else len(nodes) > 1
            for node in nodes if shared else ():
                if any(node.get("attrs", {}).get(name) != want for name, want in attrs.items()):
                    node.setdefault("attrs", {}).update(attrs)
                    changed += 1
    return changed


def _bodies(spec: dict):
    """(method, body) for every method and every control-flow body in it: the
    scopes within which node names refer to one value."""

    def nested(method, body):
        yield method, body
        for node in body["nodes"]:
            for inner in node.get("bodies", ()):
                yield from nested(method, inner)

    for method, body in spec["methods"].items():
        yield from nested(method, body)


REWRITES: dict[str, Callable[[dict, dict], int]] = {
    "merge_repeated_scales": _merge_repeated_scales,
    "gemm_scalars_into_weights": _gemm_scalars_into_weights,
    "bias_of_its_own": _bias_of_its_own,
    "bias_per_use": _bias_per_use,
    "weight_per_use": _weight_per_use,
    "quantize_folded_weights": _quantize_folded_weights,
    "frozen_state": _frozen_state,
    "int32_batch_counter_when_dynamic": _int32_batch_counter_when_dynamic,
    "set_attrs": _set_attrs,
    "drop_attrs": _drop_attrs,
    "copy_attrs": _copy_attrs,
    "set_layer_kwargs": _set_layer_kwargs,
    "drop_parametrization": _drop_parametrization,
    "set_parametrization_attrs": _set_parametrization_attrs,
    "inline_control_flow": _inline_control_flow,
    "buffer_update_out_of_place": _buffer_update_out_of_place,
    "state_apart_from_control_flow": _state_apart_from_control_flow,
    "static_inputs": _static_inputs,
    "shared_single_pixel_via_float64": _shared_single_pixel_via_float64,
    "conv_input_apart": _conv_input_apart,
}


def neutralize(spec: dict, rules: list[dict]) -> tuple[dict, int]:
    """(a rewritten copy of ``spec``, how many places changed); 0 means the
    cause the rules name is absent from this program."""
    rewritten = copy.deepcopy(spec)
    changed = 0
    for rule in rules:
        try:
            rewrite = REWRITES[rule["rewrite"]]
        except KeyError:
            raise UsageError(
                f"unknown neutralization {rule.get('rewrite')!r}; known: {', '.join(sorted(REWRITES))}"
            ) from None
        changed += rewrite(rewritten, rule)
    return rewritten, changed
