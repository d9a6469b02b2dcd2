"""The catalogue of semantic mutants: one per way a backend could get an op of
the vocabulary wrong, generated from the vocabulary so no op is left out.

A semantic mutant changes what one op computes in the eager reference (the
backend's lowering is left as it was): the lowered outputs of a program that
passed are then compared with the mutated program's reference by the suite's
own oracle. If they differ, the campaign's corpus would have caught a backend
with that defect: the mutant is killed. Kinds, each applied to every
occurrence of the op in a program (a backend defect is not selective):

- ``ignore_argument``: an argument the generator draws is reset to its
  default (the backend ignores it);
- ``misread_argument``: an argument without a default (a shape, dims, a
  factor) given another value that fits, one that keeps the shape first;
- ``relative``: the op is replaced by its nearest relative, same signature,
  another function (``sum`` for ``mean``, ``floor`` for ``ceil``);
- ``other_axis``: applied over another axis, one that keeps the shape first;
- ``swap_operands``: the two operands of a binary op swapped;
- ``swap_weight``: a GEMM's or binary op's parameter swapped with another
  parameter of the same shape;
- ``drop_operand``: the second operand (or a GEMM's bias) dropped.

``ARGUMENTS`` lists, per op (and per layer type of the ``layer`` op), every
argument the strategies draw with its default; ``tests/test_mutation.py``
checks it against what the strategies actually draw.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Iterator

from etprop.program.spec import all_nodes
from etprop.program.vocabulary import ARGUMENT_DTYPES, CONTROL_FLOW_OPS, OP_TABLE, OPS, REQUIRED, family

# Per spec op: argument -> default, for every argument a strategy draws (the op table's).
ARGUMENTS: dict[str, dict] = {name: op.arguments for name, op in OP_TABLE.items() if op.arguments is not None}

# Per layer type (the ``layer`` op): keyword argument -> default.
_CONV_LAYER = {
    "in_channels": REQUIRED,
    "out_channels": REQUIRED,
    "kernel_size": REQUIRED,
    "stride": 1,
    "padding": 0,
    "dilation": 1,
    "groups": 1,
    "bias": True,
    "padding_mode": "zeros",
}
_TRANSPOSED_CONV_LAYER = {name: default for name, default in _CONV_LAYER.items() if name != "padding_mode"}
LAYER_ARGUMENTS: dict[str, dict] = {
    "Linear": {"in_features": REQUIRED, "out_features": REQUIRED, "bias": True},
    "Conv1d": dict(_CONV_LAYER),
    "Conv2d": dict(_CONV_LAYER),
    # PyTorch's transposed convolutions accept no padding mode but zeros.
    "ConvTranspose1d": {**_TRANSPOSED_CONV_LAYER, "output_padding": 0},
    "ConvTranspose2d": {**_TRANSPOSED_CONV_LAYER, "output_padding": 0},
    "LayerNorm": {"normalized_shape": REQUIRED, "eps": 1e-5, "elementwise_affine": True, "bias": True},
    "GroupNorm": {"num_groups": REQUIRED, "num_channels": REQUIRED, "eps": 1e-5, "affine": True},
    "BatchNorm1d": {"num_features": REQUIRED, "eps": 1e-5, "affine": True},
    "BatchNorm2d": {"num_features": REQUIRED, "eps": 1e-5, "affine": True},
}

# Node attributes that are operands or neutralizations, not drawn arguments.
OPERAND_ATTRS = frozenset(
    {
        "bias_state",
        "scalar",
        "two_pass",
        "layer_norm_two_pass",
        "separate_bias",
        "by_index",
        "input_copy",
        "by_hand",
        "antialias_widened",
        "pad_by_cat",
        "predicate_keepdim",
        "input_via_float64",
        "output_via_float64",
        "same_padding_explicit",
        "circular_padding_explicit",
        "fit_shape",
        "weight_as",
        "input_channels",
        "by_sums",
        "as_4d",
        "crop_by_slice",
        "as_amax",
        "by_one_hot",
        "batched",
    }
)

# The nearest relative of an op: same signature, another function.
RELATIVES = {name: op.relative for name, op in OP_TABLE.items() if op.relative}
AXIS_OPS = tuple(name for name, op in OP_TABLE.items() if op.axis)
BINARY = tuple(name for name, op in OP_TABLE.items() if op.binary)
GEMMS_WITH_BIAS = tuple(name for name, op in OP_TABLE.items() if op.bias)
STATE_OPERAND_OPS = tuple(name for name, op in OP_TABLE.items() if op.state_operand)
_IDENTITY = {"add": 0.0, "sub": 0.0, "mul": 1.0, "div": 1.0}


@dataclass(frozen=True)
class Mutant:
    op: str  # a spec op, or "layer:<Type>"
    kind: str
    detail: str = ""

    @property
    def name(self) -> str:
        return " ".join(part for part in (self.op, self.kind, self.detail) if part)

    @property
    def family(self) -> str:
        return (
            "gemm"
            if self.op.startswith("layer:") and ("Conv" in self.op or "Linear" in self.op)
            else "normalization"
            if self.op.startswith("layer:")
            else family(self.op)
        )

    def applies_to(self, spec: dict) -> bool:
        return bool(_targets(spec, self.op))

    def drawn_in(self, dtype: str) -> bool:
        """Whether the strategies draw what this mutant changes in ``dtype``
        programs (a row of the score only then)."""
        if self.kind not in ("ignore_argument", "misread_argument"):
            return True
        return dtype in ARGUMENT_DTYPES.get((self.op, self.detail), (dtype,))

    def variants(self, spec: dict, shapes: dict | None = None) -> Iterator[dict]:
        """Mutated copies of ``spec``, the preferred first (the caller keeps
        the first that builds, preferring one whose output shapes are unchanged).

        With ``shapes`` (``node_shapes``), each is followed by its fitted
        form: every mutated node's result written into a buffer of the shape
        it had, as a backend fills the output the graph declares whatever it
        computed. A defect that changes a shape the rest of the program needs
        is then still a defect in the values."""
        variants = list(_VARIANTS[self.kind](self, spec))
        yield from variants
        for variant in variants if shapes else ():
            fitted = self._fitted(spec, variant, shapes)
            if fitted is not None:
                yield fitted

    def _fitted(self, spec: dict, variant: dict, shapes: dict) -> dict | None:
        targets = set(_targets(spec, self.op))  # layer state names, or (method, node id) pairs
        fitted, changed = copy.deepcopy(variant), False
        for method, body in fitted["methods"].items():
            for node in body["nodes"]:
                if self.op.startswith("layer:"):
                    target = node["op"] == "layer" and node.get("state") in targets
                else:
                    target = (method, node["id"]) in targets
                if target and (method, node["id"]) in shapes:
                    node.setdefault("attrs", {})["fit_shape"] = list(shapes[(method, node["id"])])
                    changed = True
        return fitted if changed else None


def node_shapes(built, inputs: dict) -> dict:
    """``(method, node id) -> shape`` of each top-level node, by running
    ``built`` node by node on ``inputs`` (per method), up to its first
    control-flow or buffer-writing node."""
    import torch

    from etprop.program import vocabulary

    shapes = {}
    for method, body in built.spec["methods"].items():
        if method not in inputs:
            continue
        values = dict(built.namespace, self=built.module)
        values.update({inp["name"]: value for inp, value in zip(body["inputs"], inputs[method])})
        with torch.no_grad():
            for node in body["nodes"]:
                if node["op"] in CONTROL_FLOW_OPS or node["op"] == "buffer_update":
                    break
                values[node["id"]] = eval(vocabulary.render(node, node["args"]), values)
                shapes[(method, node["id"])] = tuple(values[node["id"]].shape)
    return shapes


def catalogue() -> list[Mutant]:
    """Every semantic mutant of the vocabulary, in a stable order."""
    mutants = []
    for op in OPS:
        if op in ("layer", "buffer_update"):
            continue
        mutants += [
            Mutant(op, "ignore_argument", name) for name, default in ARGUMENTS[op].items() if default is not REQUIRED
        ]
        mutants += [
            Mutant(op, "misread_argument", name) for name, default in ARGUMENTS[op].items() if default is REQUIRED
        ]
        if RELATIVES.get(op):
            mutants.append(Mutant(op, "relative", RELATIVES[op]))
        if op in AXIS_OPS:
            mutants.append(Mutant(op, "other_axis"))
        if op in BINARY:
            mutants.append(Mutant(op, "swap_operands"))
        if op in STATE_OPERAND_OPS:
            mutants.append(Mutant(op, "swap_weight"))
        if op in BINARY or op in GEMMS_WITH_BIAS or op == "addmm":
            mutants.append(Mutant(op, "drop_operand"))
    for layer_type, arguments in LAYER_ARGUMENTS.items():
        op = f"layer:{layer_type}"
        mutants += [
            Mutant(op, "ignore_argument", name) for name, default in arguments.items() if default is not REQUIRED
        ]
        if "bias" in arguments or "affine" in arguments or "elementwise_affine" in arguments:
            mutants.append(Mutant(op, "drop_operand"))
        mutants.append(Mutant(op, "swap_weight"))
    return mutants


def _targets(spec: dict, op: str) -> list:
    """(method, node) pairs of ``op``, or state names of a layer type."""
    if op.startswith("layer:"):
        layer_type = op.split(":", 1)[1]
        return [
            name for name, entry in spec["state"].items() if entry["kind"] == "layer" and entry["type"] == layer_type
        ]
    return [(method, node["id"]) for method, node in all_nodes(spec) if node["op"] == op]


def _nodes(spec: dict, op: str) -> list[dict]:
    return [node for _, node in all_nodes(spec) if node["op"] == op]


def _ignore_argument(mutant: Mutant, spec: dict):
    copied = copy.deepcopy(spec)
    changed = False
    if mutant.op.startswith("layer:"):
        default = LAYER_ARGUMENTS[mutant.op.split(":", 1)[1]][mutant.detail]
        for name in _targets(copied, mutant.op):
            kwargs = copied["state"][name]["kwargs"]
            if mutant.detail in kwargs and kwargs[mutant.detail] != default:
                kwargs[mutant.detail] = default
                changed = True
    else:
        default = ARGUMENTS[mutant.op][mutant.detail]
        for node in _nodes(copied, mutant.op):
            attrs = node.get("attrs", {})
            if mutant.detail in attrs and attrs[mutant.detail] != default:
                if default is None:
                    del attrs[mutant.detail]
                else:
                    attrs[mutant.detail] = default
                _keep_callable(node, mutant.detail, copied["state"])
                changed = True
    if changed:
        yield copied


def _keep_callable(node: dict, reset: str, state: dict) -> None:
    """What a backend ignoring ``reset`` computes, where the argument reset
    alone would leave a call PyTorch rejects: a grouped convolution whose
    groups it ignores reads every group's filters from the first group's
    channels; a clamp left without bounds passes its input through; a resize
    back at nearest drops the arguments only interpolating modes take."""
    attrs = node["attrs"]
    if reset == "groups" and node["op"] in ("conv1d", "conv2d") and node.get("state") in state:
        attrs["input_channels"] = state[node["state"]]["shape"][1]
    elif node["op"] == "clamp" and attrs.get("min") is None and attrs.get("max") is None:
        node.update(op="add", attrs={"scalar": 0.0})
        node.pop("state", None)
    elif node["op"] == "interpolate" and reset == "mode":
        for name in ("align_corners", "antialias"):
            attrs.pop(name, None)


def _relative(mutant: Mutant, spec: dict):
    copied = copy.deepcopy(spec)
    accepted = set(ARGUMENTS.get(mutant.detail, {})) | OPERAND_ATTRS
    for node in _nodes(copied, mutant.op):
        node["op"] = mutant.detail
        if "attrs" in node:
            node["attrs"] = {k: v for k, v in node["attrs"].items() if k in accepted}
        layout = _relative_weight_layout(
            mutant.op, mutant.detail, copied["state"].get(node.get("state")), node.get("attrs", {}).get("groups", 1)
        )
        if layout:
            node.setdefault("attrs", {})["weight_as"] = layout
        if mutant.op.startswith("conv") and isinstance(node.get("attrs", {}).get("padding"), str):
            del node["attrs"]["padding"]  # "same" / "valid": transposed convolutions take neither
    yield copied


def _relative_weight_layout(op: str, relative: str, entry: dict | None, groups: int) -> list | None:
    """The shape in which ``relative`` reads ``op``'s weight buffer, when its
    layout differs: ``linear``'s (out, in) read as ``matmul``'s (in, out); a
    convolution's (out, in / groups, *kernel) read as its transposed
    relative's (in, out / groups, *kernel), and back (the same formula)."""
    if not entry or entry.get("kind") != "weight":
        return None
    shape = list(entry["shape"])
    if op == "linear" and relative == "matmul":
        return shape[::-1]
    if op.startswith("conv") and relative.startswith("conv"):
        return [shape[1] * groups, shape[0] // groups, *shape[2:]]
    return None


def _misread(value, attempt: int):
    """The ``attempt``-th other value of an argument: a number moved, a list
    reversed, rotated or moved; None when there are no more."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        steps = (1, -1, 2, -2)
        return value + steps[attempt] if attempt < len(steps) else None
    if isinstance(value, list) and value:
        options = [value[::-1], value[1:] + value[:1], [v + 1 if isinstance(v, (int, float)) else v for v in value]]
        return options[attempt] if attempt < len(options) else None
    return None


def _misread_argument(mutant: Mutant, spec: dict):
    for attempt in range(4):
        copied = copy.deepcopy(spec)
        changed = False
        for node in _nodes(copied, mutant.op):
            attrs = node.get("attrs", {})
            other = _misread(attrs.get(mutant.detail), attempt)
            if other is not None and other != attrs[mutant.detail]:
                attrs[mutant.detail] = other
                changed = True
        if changed:
            yield copied


def _other_axis(mutant: Mutant, spec: dict):
    """Every node's axis moved by the same offset (1, then -1, then 2, ...)."""
    attr = "start_dim" if mutant.op == "flatten" else "dim"
    for offset in (1, -1, 2, -2, 3):
        copied = copy.deepcopy(spec)
        for node in _nodes(copied, mutant.op):
            value = node.get("attrs", {}).get(attr)
            if isinstance(value, int):
                node["attrs"][attr] = value + offset
            elif isinstance(value, list) and value:
                node["attrs"][attr] = [d + offset for d in value]
        yield copied


def _swap_operands(mutant: Mutant, spec: dict):
    copied = copy.deepcopy(spec)
    changed = False
    for node in _nodes(copied, mutant.op):
        if len(node["args"]) == 2:
            node["args"] = node["args"][::-1]
            changed = True
    if changed:
        yield copied


def _swap_weight(mutant: Mutant, spec: dict):
    """Each target's parameter replaced by another state entry of the same
    kind and shape (layers: another layer of the same type and arguments)."""
    copied = copy.deepcopy(spec)
    state = copied["state"]
    changed = False

    def twin(name):
        entry = state[name]
        for other, candidate in state.items():
            if other == name or candidate["kind"] != entry["kind"]:
                continue
            if entry["kind"] == "layer":
                if candidate["type"] == entry["type"] and candidate["kwargs"] == entry["kwargs"]:
                    return other
            elif candidate.get("shape") == entry.get("shape"):
                return other
        return None

    if mutant.op.startswith("layer:"):
        targets = {name: twin(name) for name in _targets(copied, mutant.op)}
        for _, node in all_nodes(copied):
            if node["op"] == "layer" and targets.get(node.get("state")):
                node["state"] = targets[node["state"]]
                changed = True
    else:
        for node in _nodes(copied, mutant.op):
            other = twin(node["state"]) if node.get("state") in state else None
            if other:
                node["state"] = other
                changed = True
    if changed:
        yield copied


def _drop_operand(mutant: Mutant, spec: dict):
    copied = copy.deepcopy(spec)
    changed = False
    if mutant.op.startswith("layer:"):
        for name in _targets(copied, mutant.op):
            entry = copied["state"][name]
            for flag in ("bias", "affine", "elementwise_affine"):
                if (
                    entry["kwargs"].get(flag, flag in LAYER_ARGUMENTS[entry["type"]])
                    and flag in LAYER_ARGUMENTS[entry["type"]]
                ):
                    entry["kwargs"][flag] = False
                    entry["parametrizations"] = [
                        p for p in entry.get("parametrizations", []) if p.get("on", "weight") == "weight"
                    ]
                    changed = True
                    break
    elif mutant.op == "addmm":
        for node in _nodes(copied, mutant.op):
            node.setdefault("attrs", {})["beta"] = 0.0
            changed = True
    elif mutant.op in GEMMS_WITH_BIAS:
        for node in _nodes(copied, mutant.op):
            if node.get("attrs", {}).pop("bias_state", None):
                changed = True
    else:
        for node in _nodes(copied, mutant.op):
            node["op"] = "add" if mutant.op in ("maximum", "minimum") else mutant.op
            node["args"] = node["args"][:1]
            node.pop("state", None)
            node["attrs"] = {"scalar": _IDENTITY.get(mutant.op, 0.0)}
            changed = True
    if changed:
        yield copied


_VARIANTS = {
    "ignore_argument": _ignore_argument,
    "misread_argument": _misread_argument,
    "relative": _relative,
    "other_axis": _other_axis,
    "swap_operands": _swap_operands,
    "swap_weight": _swap_weight,
    "drop_operand": _drop_operand,
}
