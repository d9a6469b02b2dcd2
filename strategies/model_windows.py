"""Programs shaped like real models: windows of connected nodes cut from the
exported graphs of real architectures (``model_zoo``), translated into specs.

Every ATen node of a model's graph is put in one class:
- ``expressed``: the vocabulary writes it (one or more spec nodes, or none for
  an identity such as an eval-mode dropout or a ``contiguous``);
- ``parameters only``: it computes from parameters alone (a frozen batch
  norm's scale); a window that reads such a value gets a seeded parameter of
  its shape in its place;
- ``integer and indexing``: it reads or produces an integer or boolean tensor
  (embeddings, masks, positions, gathers), which specs do not express;
- ``not expressed``: float dataflow with no translation, counted per op.

A window keeps the real argument values (strides, groups, eps, dims, shapes),
the weight tying (one state entry per exported parameter) and module reuse
(one layer per normalization module). Weights are seeded and scaled like a
fresh initialization, so activations keep their order of magnitude.
"""

from __future__ import annotations

import math
import random
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field

import torch
from hypothesis import event
from hypothesis import strategies as st

from etprop.program.spec import FORMAT

aten = torch.ops.aten

_FLOAT = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_IGNORED = {
    aten._assert_tensor_metadata.default,
    aten._assert_scalar.default,
    aten.sym_constrain_range_for_size.default,
}


@dataclass
class Piece:
    """One ATen node's translation: spec nodes whose ``args`` name values
    (``(fx_name, index)``) and whose state slots name state keys."""

    fx: str
    nodes: list[dict] = field(default_factory=list)
    outputs: dict[int, str] = field(default_factory=dict)  # tuple index -> local node id
    reads: list[tuple[str, int]] = field(default_factory=list)
    state: dict[str, dict] = field(default_factory=dict)  # state key -> entry

    def add(self, op: str, args: list, attrs: dict | None = None, state: str | None = None) -> str:
        local = f"{self.fx}__{len(self.nodes)}"
        node = {"id": local, "op": op, "args": list(args)}
        if attrs:
            node["attrs"] = attrs
        if state:
            node["state"] = state
        self.nodes.append(node)
        for arg in args:
            if isinstance(arg, tuple) and arg not in self.reads:
                self.reads.append(arg)
        return local


@dataclass
class ModelGraph:
    name: str
    pieces: dict[str, Piece]  # fx node name -> translation, in graph order
    values: dict[tuple, "torch.Tensor"]  # (fx name, index) -> meta value of a float activation
    users: dict[tuple, list[str]]  # value -> pieces reading it
    graph_outputs: set[tuple]
    classes: Counter  # class (or "not expressed: op") -> ATen node count
    sources: dict[str, str]  # state key -> the exported placeholder it stands for


def _sanitize(name: str, limit: int = 60) -> str:
    """An identifier of at most ``limit`` characters (state names are at most
    32: attributes name them); a long name keeps its tail, the most telling
    part of a module path, and a hash of the whole."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if len(name) > limit:
        name = f"{name[-(limit - 10) :]}_{zlib.crc32(name.encode()):08x}"
    return name if name[:1].isalpha() else f"s{name}"


def _seed(name: str) -> int:
    return zlib.crc32(name.encode())


def _bind(node: torch.fx.Node) -> dict:
    """The node's arguments by schema name, defaults filled in."""
    schema = node.target._schema
    bound = {}
    for index, argument in enumerate(schema.arguments):
        if index < len(node.args):
            bound[argument.name] = node.args[index]
        elif argument.name in node.kwargs:
            bound[argument.name] = node.kwargs[argument.name]
        elif argument.has_default_value():
            bound[argument.name] = argument.default_value
    return bound


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _is_float(value) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in _FLOAT


class _Translator:
    """Walks an exported graph once, classifying and translating each node."""

    def __init__(self, program: torch.export.ExportedProgram):
        self.graph = program.graph
        signature = program.graph_signature
        self.params = {
            **signature.inputs_to_parameters,
            **signature.inputs_to_buffers,
            **signature.inputs_to_lifted_tensor_constants,
        }
        self.param_only: set[str] = set(self.params)
        self.integer: set[str] = set()
        self.alias: dict[tuple, tuple] = {}
        self.deferred: dict[str, tuple] = {}  # chunk/split/unbind node -> (source value, slicer)
        self.pieces: dict[str, Piece] = {}
        self.values: dict[tuple, torch.Tensor] = {}
        self.classes: Counter = Counter()
        self.sources: dict[str, str] = {}

    # -- operands -----------------------------------------------------------
    def value(self, arg) -> tuple:
        key = (arg.name, 0)
        return self.alias.get(key, key)

    def is_state(self, arg) -> bool:
        return isinstance(arg, torch.fx.Node) and arg.name in self.param_only

    def state(self, piece: Piece, arg, kind: str, bias: bool = False) -> str:
        """A state entry for a parameter (or a value computed from parameters
        only): one entry per exported tensor and kind, so tied weights stay
        tied."""
        key = _sanitize(arg.name if kind == "weight" else f"{arg.name}_{kind[0]}", 32)
        shape = list(_val(arg).shape) or [1]
        fan_in = math.prod(shape[1:]) if len(shape) > 1 else 1
        entry = {"kind": kind, "shape": shape, "seed": _seed(key)}
        if kind == "weight":
            entry["scale"] = 0.1 if bias else round(1 / math.sqrt(fan_in), 6)
        piece.state[key] = entry
        self.sources[key] = arg.name
        return key

    def layer(self, piece: Piece, source, layer_type: str, kwargs: dict) -> str:
        """A normalization layer, one per module (keyed by the parameter or
        buffer ``source`` it holds; a layer without one is its own)."""
        name = source.name if isinstance(source, torch.fx.Node) else source
        key = _sanitize(f"{name}_{layer_type}", 32)
        piece.state[key] = {"kind": "layer", "type": layer_type, "kwargs": kwargs, "seed": _seed(key)}
        if isinstance(source, torch.fx.Node):
            self.sources[key] = source.name
        return key

    # -- classification -----------------------------------------------------
    def run(self) -> ModelGraph:
        outputs: set[tuple] = set()
        for node in self.graph.nodes:
            if node.op == "placeholder":
                value = _val(node)
                if node.name not in self.params:
                    if _is_float(value):
                        self.values[(node.name, 0)] = value
                    else:
                        self.integer.add(node.name)
            elif node.op == "call_function":
                self.visit(node)
            elif node.op == "output":
                for arg in torch.fx.node.map_arg(node.args[0], lambda n: n) or ():
                    if isinstance(arg, torch.fx.Node):
                        outputs.add(self.value(arg))
        users: dict[tuple, list[str]] = {}
        for name, piece in self.pieces.items():
            for read in piece.reads:
                users.setdefault(read, []).append(name)
        return ModelGraph("", self.pieces, self.values, users, outputs, self.classes, self.sources)

    def visit(self, node: torch.fx.Node) -> None:
        operands = node.all_input_nodes
        counted = isinstance(node.target, torch._ops.OpOverload) and node.target not in _IGNORED
        if not counted and node.target.__name__ != "getitem":
            return
        if node.target.__name__ == "getitem":
            self.getitem(node)
            return
        value = _val(node)
        outputs = value if isinstance(value, (tuple, list)) else (value,)
        if not all(_is_float(v) for v in outputs if isinstance(v, torch.Tensor)):
            self.integer.add(node.name)
        if node.name in self.integer or any(arg.name in self.integer for arg in operands):
            self.classes["integer and indexing"] += 1
            self.opaque(node, outputs)
            return
        if operands and all(arg.name in self.param_only for arg in operands):
            self.param_only.add(node.name)
            self.classes["parameters only"] += 1
            return
        translated = self.translate(node)
        if translated:
            self.classes["expressed"] += 1
            for index, out in enumerate(outputs):
                if isinstance(out, torch.Tensor) and (node.name, index) not in self.alias:
                    self.values[(node.name, index)] = out
        else:
            self.classes[f"not expressed: {node.target.overloadpacket.__name__}"] += 1
            self.opaque(node, outputs)

    def opaque(self, node, outputs) -> None:
        """A value no window computes: a window reading it takes it as an input."""
        for index, out in enumerate(outputs):
            if _is_float(out):
                self.values[(node.name, index)] = out

    def getitem(self, node) -> None:
        source, index = node.args
        if source.name in self.integer:
            self.integer.add(node.name)
        elif source.name in self.param_only:
            self.param_only.add(node.name)
        elif source.name in self.deferred:
            origin, slicer = self.deferred[source.name]
            piece = Piece(_sanitize(node.name))
            slicer(piece, origin, index)
            piece.outputs[0] = piece.nodes[-1]["id"]
            self.pieces[node.name] = piece
            self.values[(node.name, 0)] = _val(node)
        else:
            self.alias[(node.name, 0)] = self.alias.get((source.name, index), (source.name, index))

    # -- translation --------------------------------------------------------
    def translate(self, node) -> bool:
        rule = _RULES.get(node.target)
        if rule is None:
            return False
        piece = Piece(_sanitize(node.name))
        result = rule(self, piece, node, _bind(node))
        if result is False:
            return False
        if result == "alias":
            self.alias[(node.name, 0)] = self.value(node.args[0])
            return True
        if result == "deferred":
            return True
        piece.outputs[0] = piece.nodes[-1]["id"]
        self.pieces[node.name] = piece
        return True


# -- rules: (translator, piece, node, bound args) -> None | False | "alias" | "deferred"


def _unary(op: str, **names):
    def rule(t, piece, node, a):
        attrs = {}
        for attr, schema_name in names.items():
            value = a.get(schema_name)
            if value is not None:
                attrs[attr] = value
        piece.add(op, [t.value(a["self"])], attrs)

    return rule


def _gelu(t, piece, node, a):
    piece.add("gelu", [t.value(a["self"])], {"approximate": a["approximate"]} if a["approximate"] != "none" else {})


def _elu(t, piece, node, a):
    if a.get("scale", 1) != 1 or a.get("input_scale", 1) != 1:
        return False
    piece.add("elu", [t.value(a["self"])], {"alpha": a.get("alpha", 1.0)})


def _binary(op: str, commutative: bool):
    def rule(t, piece, node, a):
        left, right = a["self"], a["other"]
        attrs = {}
        if a.get("alpha", 1) != 1:
            attrs["alpha"] = a["alpha"]
        if a.get("rounding_mode") is not None:
            attrs["rounding_mode"] = a["rounding_mode"]
        if t.is_state(left) and isinstance(right, torch.fx.Node) and not t.is_state(right):
            if not commutative or attrs:
                return False
            left, right = right, left
        if not isinstance(left, torch.fx.Node) or t.is_state(left):
            return False
        if isinstance(right, (int, float)):
            piece.add(op, [t.value(left)], {**attrs, "scalar": right})
        elif t.is_state(right):
            piece.add(op, [t.value(left)], attrs, state=t.state(piece, right, "parameter"))
        else:
            piece.add(op, [t.value(left), t.value(right)], attrs)

    return rule


def _gemm_state(t, piece, weight, bias):
    return t.state(piece, weight, "weight"), (
        {"bias_state": t.state(piece, bias, "weight", bias=True)} if bias is not None else {}
    )


def _linear(t, piece, node, a):
    if not t.is_state(a["weight"]) or (a["bias"] is not None and not t.is_state(a["bias"])):
        return False
    state, attrs = _gemm_state(t, piece, a["weight"], a["bias"])
    piece.add("linear", [t.value(a["input"])], attrs, state=state)


def _conv(dims: int, transposed: bool):
    names = (
        ("stride", "padding", "output_padding", "groups", "dilation")
        if transposed
        else ("stride", "padding", "dilation", "groups")
    )
    defaults = {"stride": 1, "padding": 0, "dilation": 1, "output_padding": 0, "groups": 1}

    def rule(t, piece, node, a):
        if not t.is_state(a["weight"]) or (a.get("bias") is not None and not t.is_state(a["bias"])):
            return False
        if isinstance(a.get("padding"), str):
            return False
        state, attrs = _gemm_state(t, piece, a["weight"], a.get("bias"))
        for name in names:
            value = a.get(name)
            value = list(value) if isinstance(value, (list, tuple)) else value
            if value is not None and value not in (defaults[name], [defaults[name]] * dims):
                attrs[name] = value
        op = f"conv_transpose{dims}d" if transposed else f"conv{dims}d"
        piece.add(op, [t.value(a["input"])], attrs, state=state)

    return rule


def _matmul(op: str):
    def rule(t, piece, node, a):
        left, right = a["self"], a.get("other", a.get("mat2"))
        if t.is_state(left):
            return False
        if t.is_state(right):
            piece.add(op, [t.value(left)], state=t.state(piece, right, "weight"))
        else:
            piece.add(op, [t.value(left), t.value(right)])

    return rule


def _addmm(t, piece, node, a):
    if not (t.is_state(a["mat2"]) and t.is_state(a["self"])) or t.is_state(a["mat1"]):
        return False
    attrs = {"bias_state": t.state(piece, a["self"], "weight", bias=True)}
    attrs.update({name: a[name] for name in ("beta", "alpha") if a.get(name, 1) != 1})
    piece.add("addmm", [t.value(a["mat1"])], attrs, state=t.state(piece, a["mat2"], "weight"))


def _batch_norm(t, piece, node, a):
    x = a["input"]
    rank = _val(x).dim()
    if a.get("training") or a["running_mean"] is None or rank not in (2, 3, 4):
        return False
    kwargs = {"num_features": _val(x).shape[1]}
    if a["eps"] != 1e-5:
        kwargs["eps"] = a["eps"]
    if a["weight"] is None:
        kwargs["affine"] = False
    layer_type = "BatchNorm2d" if rank == 4 else "BatchNorm1d"
    piece.add(
        "layer",
        [t.value(x)],
        state=t.layer(piece, a["weight"] if a["weight"] is not None else a["running_mean"], layer_type, kwargs),
    )


def _native_batch_norm(t, piece, node, a):
    return _batch_norm(t, piece, node, {**a, "training": False})


def _layer_norm(t, piece, node, a):
    kwargs = {"normalized_shape": list(a["normalized_shape"])}
    if a["eps"] != 1e-5:
        kwargs["eps"] = a["eps"]
    if a["weight"] is None:
        kwargs["elementwise_affine"] = False
    elif a["bias"] is None:
        kwargs["bias"] = False
    piece.add(
        "layer",
        [t.value(a["input"])],
        state=t.layer(piece, a["weight"] if a["weight"] is not None else node.name, "LayerNorm", kwargs),
    )


def _group_norm(t, piece, node, a):
    x = a["input"]
    kwargs = {"num_groups": a["num_groups"], "num_channels": _val(x).shape[1]}
    if a["eps"] != 1e-5:
        kwargs["eps"] = a["eps"]
    if a["weight"] is None:
        kwargs["affine"] = False
    piece.add(
        "layer",
        [t.value(x)],
        state=t.layer(piece, a["weight"] if a["weight"] is not None else node.name, "GroupNorm", kwargs),
    )


def _reduction(op: str):
    def rule(t, piece, node, a):
        if a.get("dtype") is not None or a.get("dim") is None:
            return False
        attrs = {"dim": list(a["dim"]) if isinstance(a["dim"], (list, tuple)) else a["dim"]}
        if a.get("keepdim"):
            attrs["keepdim"] = True
        piece.add(op, [t.value(a["self"])], attrs)

    return rule


def _softmax(op: str):
    def rule(t, piece, node, a):
        if a.get("half_to_float") or a.get("dtype") is not None:
            return False
        piece.add(op, [t.value(a["self"])], {"dim": a["dim"]})

    return rule


def _reshape(t, piece, node, a):
    piece.add("reshape", [t.value(node.args[0])], {"shape": list(_val(node).shape)})


def _flatten(t, piece, node, a):
    attrs = {name: a[name] for name in ("start_dim", "end_dim") if a[name] != {"start_dim": 0, "end_dim": -1}[name]}
    piece.add("flatten", [t.value(a["self"])], attrs)


def _permute(t, piece, node, a):
    piece.add("permute", [t.value(a["self"])], {"dims": list(a["dims"])})


def _transpose(t, piece, node, a):
    piece.add("transpose", [t.value(a["self"])], {"dim0": a["dim0"], "dim1": a["dim1"]})


def _t(t, piece, node, a):
    if _val(a["self"]).dim() != 2:
        return False
    piece.add("transpose", [t.value(a["self"])], {"dim0": 0, "dim1": 1})


def _unsqueeze(t, piece, node, a):
    piece.add("unsqueeze", [t.value(a["self"])], {"dim": a["dim"]})


def _squeeze(t, piece, node, a):
    dim = a["dim"]
    piece.add("squeeze", [t.value(a["self"])], {"dim": list(dim) if isinstance(dim, (list, tuple)) else dim})


def _slice_attrs(rank: int, dim: int, start, end, step) -> dict:
    return {"dim": dim % rank, "start": start, "end": end, "step": step}


def _slice(t, piece, node, a):
    x = a["self"]
    piece.add("slice", [t.value(x)], _slice_attrs(_val(x).dim(), a["dim"], a["start"], a["end"], a["step"]))


def _select(t, piece, node, a):
    """``x.select(dim, i)``: a one-wide slice, then the dim squeezed."""
    x, index = a["self"], a["index"]
    dim = a["dim"] % _val(x).dim()
    sliced = piece.add("slice", [t.value(x)], _slice_attrs(_val(x).dim(), dim, index, index + 1 or None, 1))
    piece.add("squeeze", [sliced], {"dim": dim})


def _cat(t, piece, node, a):
    tensors = a["tensors"]
    if any(t.is_state(x) for x in tensors):
        return False
    rank = _val(tensors[0]).dim()
    piece.add("cat", [t.value(x) for x in tensors], {"dim": a["dim"] % rank})


def _splitting(kind: str):
    """chunk, split and unbind: each ``getitem`` becomes its own slice."""

    def rule(t, piece, node, a):
        x = a["self"]
        rank = _val(x).dim()
        dim = a.get("dim", 0) % rank
        length = _val(x).shape[dim]
        if kind == "chunk":
            size = -(-length // a["chunks"])
            bounds = [(i, min(i + size, length)) for i in range(0, length, size)]
        elif kind == "split":
            sizes = a["split_size"] if isinstance(a["split_size"], int) else None
            bounds = [(i, min(i + sizes, length)) for i in range(0, length, sizes)] if sizes else None
        elif kind == "split_with_sizes":
            starts = [sum(a["split_sizes"][:i]) for i in range(len(a["split_sizes"]))]
            bounds = [(s, s + n) for s, n in zip(starts, a["split_sizes"])]
        else:
            bounds = [(i, i + 1) for i in range(length)]
        if bounds is None:
            return False

        def slicer(piece, origin, index):
            start, end = bounds[index]
            sliced = piece.add("slice", [origin], _slice_attrs(rank, dim, start, end, 1))
            if kind == "unbind":
                piece.add("squeeze", [sliced], {"dim": dim})

        t.deferred[node.name] = (t.value(x), slicer)
        return "deferred"

    return rule


def _pool(op: str, *names: str, defaults: dict):
    def rule(t, piece, node, a):
        attrs = {}
        for name in names:
            value = a.get(name)
            value = list(value) if isinstance(value, (list, tuple)) else value
            if name == "stride" and value == []:
                continue
            if value is not None and value != defaults.get(name):
                attrs[name] = value
        piece.add(op, [t.value(a["self"])], attrs)

    return rule


def _adaptive_avg_pool2d(t, piece, node, a):
    piece.add("adaptive_avg_pool2d", [t.value(a["self"])], {"output_size": list(a["output_size"])})


def _upsample(mode: str):
    def rule(t, piece, node, a):
        attrs = {"mode": mode} if mode != "nearest" else {}
        if a.get("align_corners"):
            attrs["align_corners"] = True
        elif mode != "nearest":
            attrs["align_corners"] = False
        if a.get("scale_factors"):
            attrs["scale_factor"] = list(a["scale_factors"])
        else:
            attrs["size"] = list(_val(node).shape[2:])
        piece.add("interpolate", [t.value(a["input"])], attrs)

    return rule


def _sdpa(t, piece, node, a):
    """Attention without mask, dropout or causality, in vocabulary terms:
    softmax(q kᵀ · scale) v."""
    if a.get("attn_mask") is not None or a.get("dropout_p") or a.get("is_causal") or a.get("enable_gqa"):
        return False
    q, k, v = a["query"], a["key"], a["value"]
    scale = a.get("scale") or 1 / math.sqrt(_val(q).shape[-1])
    keys = piece.add("transpose", [t.value(k)], {"dim0": -2, "dim1": -1})
    scores = piece.add("matmul", [t.value(q), keys])
    scaled = piece.add("mul", [scores], {"scalar": scale})
    weights = piece.add("softmax", [scaled], {"dim": -1})
    piece.add("matmul", [weights, t.value(v)])


def _pow(t, piece, node, a):
    """Whole exponents 2 and 3 (GPT-2's GELU cubes) as products."""
    if a["exponent"] not in (2, 3) or not isinstance(a["self"], torch.fx.Node):
        return False
    squared = piece.add("square", [t.value(a["self"])])
    if a["exponent"] == 3:
        piece.add("mul", [squared, t.value(a["self"])])


def _identity(t, piece, node, a):
    return "alias"


def _dropout(t, piece, node, a):
    return "alias" if not a.get("train") else False


def _same_shape_dtype(t, piece, node, a):
    source = _val(node.args[0])
    return "alias" if (source.shape == _val(node).shape and source.dtype == _val(node).dtype) else False


def _clamp(t, piece, node, a):
    attrs = {name: a[name] for name in ("min", "max") if a.get(name) is not None}
    if any(not isinstance(v, (int, float)) for v in attrs.values()):
        return False
    piece.add("clamp", [t.value(a["self"])], attrs)


def _relu6(t, piece, node, a):
    piece.add("hardtanh", [t.value(a["self"])], {"min_val": 0.0, "max_val": 6.0})


_RULES: dict = {}
for _packets, _rule in [
    ((aten.relu, aten.relu_), _unary("relu")),
    ((aten.sigmoid, aten.sigmoid_), _unary("sigmoid")),
    ((aten.tanh, aten.tanh_), _unary("tanh")),
    ((aten.silu, aten.silu_), _unary("silu")),
    ((aten.hardswish, aten.hardswish_), _unary("hardswish")),
    ((aten.hardsigmoid, aten.hardsigmoid_), _unary("hardsigmoid")),
    ((aten.abs, aten.abs_), _unary("abs")),
    ((aten.neg, aten.neg_), _unary("neg")),
    ((aten.floor,), _unary("floor")),
    ((aten.ceil,), _unary("ceil")),
    ((aten.round,), _unary("round")),
    ((aten.gelu, aten.gelu_), _gelu),
    ((aten.elu, aten.elu_), _elu),
    ((aten.hardtanh, aten.hardtanh_), _unary("hardtanh", min_val="min_val", max_val="max_val")),
    ((aten.relu6,), _relu6),
    ((aten.square,), _unary("square")),
    ((aten.leaky_relu, aten.leaky_relu_), _unary("leaky_relu", negative_slope="negative_slope")),
    ((aten.softplus,), _unary("softplus", beta="beta", threshold="threshold")),
    ((aten.clamp, aten.clamp_), _clamp),
    ((aten.add, aten.add_), _binary("add", True)),
    ((aten.sub, aten.sub_), _binary("sub", False)),
    ((aten.mul, aten.mul_), _binary("mul", True)),
    ((aten.div, aten.div_), _binary("div", False)),
    ((aten.maximum,), _binary("maximum", True)),
    ((aten.minimum,), _binary("minimum", True)),
    ((aten.linear,), _linear),
    ((aten.conv1d,), _conv(1, False)),
    ((aten.conv2d,), _conv(2, False)),
    ((aten.conv_transpose1d,), _conv(1, True)),
    ((aten.conv_transpose2d,), _conv(2, True)),
    ((aten.matmul,), _matmul("matmul")),
    ((aten.bmm,), _matmul("bmm")),
    ((aten.mm,), _matmul("mm")),
    ((aten.addmm,), _addmm),
    ((aten.batch_norm,), _batch_norm),
    ((aten._native_batch_norm_legit_no_training,), _native_batch_norm),
    ((aten.layer_norm,), _layer_norm),
    ((aten.group_norm,), _group_norm),
    ((aten.mean,), _reduction("mean")),
    ((aten.sum,), _reduction("sum")),
    ((aten.amax,), _reduction("amax")),
    ((aten.amin,), _reduction("amin")),
    ((aten.softmax, aten._softmax), _softmax("softmax")),
    ((aten.log_softmax, aten._log_softmax), _softmax("log_softmax")),
    ((aten.view, aten.reshape, aten._unsafe_view, aten.unflatten), _reshape),
    ((aten.flatten,), _flatten),
    ((aten.permute,), _permute),
    ((aten.transpose,), _transpose),
    ((aten.t,), _t),
    ((aten.unsqueeze,), _unsqueeze),
    ((aten.squeeze,), _squeeze),
    ((aten.slice,), _slice),
    ((aten.select,), _select),
    ((aten.cat,), _cat),
    ((aten.chunk,), _splitting("chunk")),
    ((aten.split,), _splitting("split")),
    ((aten.split_with_sizes,), _splitting("split_with_sizes")),
    ((aten.unbind,), _splitting("unbind")),
    (
        (aten.max_pool2d,),
        _pool(
            "max_pool2d",
            "kernel_size",
            "stride",
            "padding",
            "dilation",
            "ceil_mode",
            defaults={"padding": [0, 0], "dilation": [1, 1], "ceil_mode": False},
        ),
    ),
    (
        (aten.max_pool1d,),
        _pool(
            "max_pool1d",
            "kernel_size",
            "stride",
            "padding",
            "dilation",
            "ceil_mode",
            defaults={"padding": [0], "dilation": [1], "ceil_mode": False},
        ),
    ),
    (
        (aten.avg_pool2d,),
        _pool(
            "avg_pool2d",
            "kernel_size",
            "stride",
            "padding",
            "ceil_mode",
            "count_include_pad",
            "divisor_override",
            defaults={"padding": [0, 0], "ceil_mode": False, "count_include_pad": True},
        ),
    ),
    (
        (aten.avg_pool1d,),
        _pool(
            "avg_pool1d",
            "kernel_size",
            "stride",
            "padding",
            "ceil_mode",
            "count_include_pad",
            defaults={"padding": [0], "ceil_mode": False, "count_include_pad": True},
        ),
    ),
    ((aten.adaptive_avg_pool2d,), _adaptive_avg_pool2d),
    ((aten.upsample_nearest2d,), _upsample("nearest")),
    ((aten.upsample_bilinear2d,), _upsample("bilinear")),
    ((aten.pixel_shuffle,), _unary("pixel_shuffle", upscale_factor="upscale_factor")),
    ((aten.pixel_unshuffle,), _unary("pixel_unshuffle", downscale_factor="downscale_factor")),
    ((aten.scaled_dot_product_attention,), _sdpa),
    ((aten.pow,), _pow),
    ((aten.dropout, aten.dropout_), _dropout),
    ((aten.clone, aten.contiguous, aten.alias, aten.detach, aten.lift_fresh_copy), _identity),
    ((aten.expand, aten.to, aten._to_copy, aten.type_as), _same_shape_dtype),
]:
    for _packet in _packets:
        for _overload in _packet.overloads():
            _RULES[getattr(_packet, _overload)] = _rule


def translate(name: str, program: torch.export.ExportedProgram) -> ModelGraph:
    graph = _Translator(program).run()
    graph.name = name
    return graph


_GRAPHS: dict[str, ModelGraph] = {}


def model_graph(name: str) -> ModelGraph:
    """The recipe's translated graph, once per process."""
    if name not in _GRAPHS:
        from etprop.strategies.model_zoo import exported

        _GRAPHS[name] = translate(name, exported(name))
    return _GRAPHS[name]


def window(graph: ModelGraph, start: int, size: int, seed: int, dtype: str = "float32") -> dict:
    """The spec of a connected window of ``graph``: grown from its
    ``start``-th translated node (modulo their number), in a seeded random
    order over producers and consumers, until it holds ``size`` spec nodes."""
    names = list(graph.pieces)
    order = {name: index for index, name in enumerate(names)}
    producers = {
        name: [read[0] for read in piece.reads if read[0] in graph.pieces] for name, piece in graph.pieces.items()
    }
    consumers: dict[str, list[str]] = {}
    for (producer, _), readers in graph.users.items():
        consumers.setdefault(producer, []).extend(readers)
    rng = random.Random(seed)
    chosen = {names[start % len(names)]}
    frontier = [names[start % len(names)]]
    count = len(graph.pieces[frontier[0]].nodes)
    while frontier and count < size:
        current = frontier[rng.randrange(len(frontier))]
        options = [n for n in producers[current] + consumers.get(current, []) if n not in chosen]
        if not options:
            frontier.remove(current)
            continue
        picked = options[rng.randrange(len(options))]
        chosen.add(picked)
        frontier.append(picked)
        count += len(graph.pieces[picked].nodes)
    return _window_spec(graph, sorted(chosen, key=order.get), dtype)


def _window_spec(graph: ModelGraph, chosen: list[str], dtype: str) -> dict:
    chosen_set = set(chosen)
    ids: dict = {}
    inputs: list[dict] = []
    state: dict = {}
    nodes: list[dict] = []

    def ref(arg):
        if isinstance(arg, str):
            return ids[arg]
        if arg[0] in chosen_set:
            return ids[graph.pieces[arg[0]].outputs[arg[1]]]
        if arg not in ids:
            ids[arg] = f"x{len(inputs)}"
            inputs.append({"name": ids[arg], "shape": list(graph.values[arg].shape) or [1], "dtype": dtype})
        return ids[arg]

    produced = []
    for name in chosen:
        piece = graph.pieces[name]
        state.update(piece.state)
        for node in piece.nodes:
            args = [ref(arg) for arg in node["args"]]
            ids[node["id"]] = f"v{len(nodes) + 1}"
            spec_node = {**node, "id": ids[node["id"]], "args": args}
            nodes.append(spec_node)
        produced.append(((name, 0), ids[piece.outputs[0]]))
    read_inside = {arg for node in nodes for arg in node["args"]}
    outputs = [
        value_id
        for value, value_id in produced
        if value_id not in read_inside
        or value in graph.graph_outputs
        or any(user not in chosen_set for user in graph.users.get(value, []))
    ]
    body = {"inputs": inputs, "nodes": nodes, "outputs": outputs}
    spec = {"format": FORMAT, "state": state, "methods": {"forward": body}}
    if dtype != "float32":
        spec["dtype"] = dtype
    return spec


@st.composite
def real_model_windows(draw, min_nodes: int = 3, max_nodes: int = 30, models: tuple[str, ...] | None = None):
    """A window of a real model's graph (see the module docstring)."""
    from etprop.strategies.model_zoo import INSTALL_HINT, installed

    names = models or installed()
    if not names:
        raise ImportError(f"the real-model family needs at least one model library: {INSTALL_HINT}")
    name = draw(st.sampled_from(names))
    graph = model_graph(name)
    size = draw(st.integers(min_nodes, max_nodes))
    start = draw(st.integers(0, len(graph.pieces) - 1))
    seed = draw(st.integers(0, 2**16))
    dtype = draw(st.sampled_from(("float32", "float32", "float32", "float16", "bfloat16")))
    event(f"model {name}")
    return window(graph, start, size, seed, dtype)
