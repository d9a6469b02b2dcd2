"""One small strategy per op: draw its arguments (keyword arguments included,
non-default values as often as defaults) so the call is valid for its input.

Each drawer returns the new Value, or None when the drawn combination did not
fit (rare; counted through ``event``). Drawers read shapes from the draft and
do not filter: constraints are built into the ranges they draw from.
"""

from __future__ import annotations

import copy
from typing import Callable, Optional

from hypothesis import strategies as st

from etprop.program.vocabulary import ARGUMENT_DTYPES, OP_TABLE
from etprop.strategies.graph import GraphDraft, Value

Drawer = Callable[[Callable, GraphDraft], Optional[Value]]


def _maybe(draw, value, default=None):
    """The value or the default, equally often; shrinks to the default."""
    return value if draw(st.booleans()) else default


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# -- computed weights ---------------------------------------------------------


def parametrizations(draw, shape: tuple[int, ...], always: bool = False) -> list[dict]:
    """How a weight of ``shape`` is computed: an optional storage form
    (weight_norm, spectral_norm, low-rank factors, stored transposed or flat)
    followed by shape-preserving steps (scale, a second parameter, a buffer).
    Torch chains parametrizations only in that order."""
    storage = [None, "weight_norm", "scale"]
    if len(shape) >= 2:
        storage += ["spectral_norm", "reshape"]
    if len(shape) == 2:
        storage += ["low_rank", "transpose"]
    result = []
    first = draw(st.sampled_from(storage[1:] if always else storage))
    if first == "weight_norm":
        result.append({"type": first, "dim": draw(st.integers(-1, len(shape) - 1))})
    elif first == "spectral_norm":
        result.append(
            {"type": first, "n_power_iterations": draw(st.integers(1, 3)), "dim": draw(st.sampled_from([None, 1]))}
        )
    elif first == "low_rank":
        result.append({"type": first, "rank": draw(st.integers(1, min(shape)))})
    elif first == "scale":
        result.append({"type": first, "factor": draw(st.sampled_from([0.5, 2.0, -1.0]))})
    elif first is not None:
        result.append({"type": first})
    for _ in range(draw(st.integers(0, 2 if first else 0))):
        kind = draw(st.sampled_from(["scale", "add_delta", "buffer_scale"]))
        step: dict = {"type": kind}
        if kind == "scale":
            step["factor"] = draw(st.sampled_from([0.5, 2.0, -1.0]))
        else:
            step["seed"] = draw(st.integers(0, 1000))
        result.append(step)
    return result


def _weight(draw, g: GraphDraft, shape: tuple[int, ...], computed_bias: bool = False) -> str:
    """A weight holder for a functional GEMM: reuse one of the right shape
    (a shared source) or make a new one, computed or not."""
    existing = [n for n, e in g.program.state.items() if e["kind"] == "weight" and tuple(e["shape"]) == tuple(shape)]
    if existing and draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from(existing))
    fan_in = 1
    for d in shape[1:] or shape:
        fan_in *= d
    entry = {"kind": "weight", "shape": list(shape), "scale": round(1.0 / fan_in**0.5, 4)}
    computed = parametrizations(draw, shape, always=g.program.computed_weights and len(shape) > 1)
    if computed:
        entry["parametrizations"] = computed
    return g.program.add_state("w", entry)


def _layer_params(draw, g: GraphDraft, weight_shape, bias: bool) -> list[dict]:
    result = [dict(p, on="weight") for p in parametrizations(draw, weight_shape, g.program.computed_weights)]
    if bias and draw(st.integers(0, 4)) == 0:
        result.append({"type": draw(st.sampled_from(["scale", "add_delta"])), "on": "bias", "factor": 2.0, "seed": 7})
    return result


def _new_or_reused_layer(draw, g: GraphDraft, layer_type: str, kwargs: dict, weight_shape: tuple[int, ...]) -> str:
    """Reuse an identical layer now and then (one module called at several places)."""
    for name, entry in g.program.state.items():
        if entry.get("type") == layer_type and entry["kwargs"] == kwargs and draw(st.integers(0, 2)) == 0:
            return name
    entry = {"kind": "layer", "type": layer_type, "kwargs": kwargs}
    params = _layer_params(draw, g, weight_shape, kwargs.get("bias", True))
    if params:
        entry["parametrizations"] = params
    return g.program.add_state("l", entry)


# -- GEMMs ----------------------------------------------------------------------


def draw_linear(draw, g):
    x = g.pick(draw, lambda v: 1 <= v.rank <= 4)
    if x is None:
        return None
    # Square projections (out = in) are as common in models as any other
    # width, and the only ones where a backend reading the weight untransposed
    # still computes something.
    out = draw(st.one_of(st.just(max(x.shape[-1], 1)), st.integers(1, 16)))
    bias = draw(st.booleans())
    kwargs = {"in_features": x.shape[-1], "out_features": out, "bias": bias}
    if draw(st.booleans()):
        name = _new_or_reused_layer(draw, g, "Linear", kwargs, (out, x.shape[-1]))
        return g.add("layer", [x], state=name)
    attrs = {}
    if bias:
        attrs["bias_state"] = _weight(draw, g, (out,))
    return g.add("linear", [x], attrs, state=_weight(draw, g, (out, x.shape[-1])))


def _conv_kwargs(draw, x: Value, dims: int, transposed: bool) -> Optional[dict]:
    c_in = x.shape[1]
    spatial = x.shape[2:]
    groups = draw(st.sampled_from(_divisors(c_in)))
    depthwise = groups == c_in and draw(st.booleans())
    c_out = c_in * draw(st.integers(1, 2)) if depthwise else groups * draw(st.integers(1, max(1, 8 // groups)))
    kernel = [draw(st.integers(1, max(1, min(5, s)))) for s in spatial]
    dilation = [draw(st.integers(1, 2)) if k > 1 and (k - 1) * 2 + 1 <= s else 1 for k, s in zip(kernel, spatial)]
    stride = [draw(st.integers(1, 3)) for _ in spatial]
    kwargs = {"in_channels": c_in, "out_channels": c_out, "groups": groups, "bias": draw(st.booleans())}
    if transposed:
        padding = [draw(st.integers(0, d * (k - 1) // 2)) for k, d in zip(kernel, dilation)]
        output_padding = [draw(st.integers(0, max(s, d) - 1)) for s, d in zip(stride, dilation)]
        kwargs.update(output_padding=output_padding if dims > 1 else output_padding[0])
    else:
        mode = draw(st.sampled_from(["int", "same", "valid"]))
        if mode == "same":
            stride = [1] * dims
            padding = "same"
        elif mode == "valid":
            padding = "valid"
        else:
            padding = [draw(st.integers(0, d * (k - 1) // 2)) for k, d in zip(kernel, dilation)]
        if padding != "valid" and padding != [0] * dims:
            pad_mode = draw(st.sampled_from(["zeros", "zeros", "reflect", "replicate", "circular"]))
            if pad_mode == "reflect" and padding != "same" and any(p >= s for p, s in zip(padding, spatial)):
                pad_mode = "zeros"
            if pad_mode != "zeros" and padding == "same":
                pad_mode = "zeros"
            kwargs["padding_mode"] = pad_mode
    scalar = dims == 1 or draw(st.booleans())
    pick = (lambda v: v[0]) if dims == 1 else (lambda v: v if not scalar or len(set(v)) > 1 else v[0])
    kwargs.update(
        kernel_size=pick(kernel),
        stride=pick(stride),
        dilation=pick(dilation),
        padding=padding if isinstance(padding, str) else pick(padding),
    )
    return kwargs


def _draw_conv(dims: int, transposed: bool) -> Drawer:
    layer_type = f"ConvTranspose{dims}d" if transposed else f"Conv{dims}d"

    def draw_conv(draw, g):
        x = g.pick(draw, lambda v: v.rank == dims + 2 and v.shape[1] <= 16)
        if x is None:
            return None
        kwargs = _conv_kwargs(draw, x, dims, transposed)
        ksize = kwargs["kernel_size"] if isinstance(kwargs["kernel_size"], list) else [kwargs["kernel_size"]] * dims
        if transposed:
            wshape = (kwargs["in_channels"], kwargs["out_channels"] // kwargs["groups"], *ksize)
        else:
            wshape = (kwargs["out_channels"], kwargs["in_channels"] // kwargs["groups"], *ksize)
        if kwargs.get("padding_mode", "zeros") != "zeros" or draw(st.booleans()):
            name = _new_or_reused_layer(draw, g, layer_type, kwargs, wshape)
            return g.add("layer", [x], state=name)
        attrs = {k: kwargs[k] for k in ("stride", "padding", "dilation", "groups", "output_padding") if k in kwargs}
        if kwargs["bias"]:
            attrs["bias_state"] = _weight(draw, g, (kwargs["out_channels"],))
        op = f"conv_transpose{dims}d" if transposed else f"conv{dims}d"
        return g.add(op, [x], attrs, state=_weight(draw, g, wshape))

    return draw_conv


def draw_addmm(draw, g):
    x = g.pick(draw, lambda v: v.rank == 2)
    if x is None:
        return None
    n, k = x.shape
    m = draw(st.integers(1, 16))
    bias_shape = draw(st.sampled_from([(m,), (n, m), (1, m)]))
    attrs = {"bias_state": _weight(draw, g, bias_shape)}
    for kw in ("beta", "alpha"):
        value = _maybe(draw, draw(st.sampled_from([0.5, 2.0, -1.0, 0.0])))
        if value is not None:
            attrs[kw] = value
    return g.add("addmm", [x], attrs, state=_weight(draw, g, (k, m)))


def draw_mm(draw, g):
    x = g.pick(draw, lambda v: v.rank == 2)
    if x is None:
        return None
    return g.add("mm", [x], state=_weight(draw, g, (x.shape[1], draw(st.integers(1, 16)))))


def draw_bmm(draw, g):
    x = g.pick(draw, lambda v: v.rank == 3)
    if x is None:
        return None
    b, _, k = x.shape
    return g.add("bmm", [x], state=_weight(draw, g, (b, k, draw(st.integers(1, 16)))))


def draw_matmul(draw, g):
    x = g.pick(draw, lambda v: v.rank >= 1)
    if x is None:
        return None
    shape = draw(st.sampled_from([(x.shape[-1], draw(st.integers(1, 16))), (x.shape[-1],)]))
    return g.add("matmul", [x], state=_weight(draw, g, shape))


# Ops whose parameters a twin can have: GEMMs and binary ops with a parameter,
# buffer or constant operand (the op table's), and the normalization layers.
_TWINNABLE = tuple(name for name, op in OP_TABLE.items() if op.twinnable) + ("layer_norm", "batch_norm", "group_norm")


def _twin_state(g: GraphDraft, name: str) -> str:
    """A new state entry configured like ``name``, with values of its own."""
    entry = copy.deepcopy(g.program.state[name])
    entry.pop("seed", None)
    return g.program.add_state(name.rstrip("0123456789"), entry)


def add_twin(g: GraphDraft, value: Value) -> Optional[Value]:
    """``value``'s node again on the same operands, reading its own copy of
    each state entry (same kind, shape and arguments, other values), as Q/K/V
    projections or parallel branches do: the form in which a backend that
    confuses same-shaped parameters is wrong. None unless ``value`` is the
    last node drawn and reads state."""
    node = g.nodes[-1] if g.nodes and g.nodes[-1]["id"] == value.name else None
    if node is None or "state" not in node:
        return None
    twin = copy.deepcopy(node)
    twin["id"] = g.program.fresh("v")
    twin["state"] = _twin_state(g, twin["state"])
    if "bias_state" in twin.get("attrs", {}):
        twin["attrs"]["bias_state"] = _twin_state(g, twin["attrs"]["bias_state"])
    by_name = {v.name: v for v in g.values}
    return g.add_node(twin, [by_name[a] for a in twin["args"]], value.shape)


def draw_parallel_twins(draw, g):
    """Two ops of one configuration side by side on one input, each with its
    own parameters, then combined (Q/K/V projections, a gated MLP's branches,
    two norms of one width): where a backend could read one weight for its
    same-shaped twin. The combinations are the ones that show such a swap
    (not a sum or product)."""
    _, drawer = draw(st.sampled_from([d for d in DRAWERS if d[0] in _TWINNABLE]))
    first = drawer(draw, g)
    second = add_twin(g, first) if first is not None else None
    if second is None:
        return first
    how = draw(st.sampled_from(["sub", "gated", "cat"]))
    if how == "gated":
        return g.add("mul", [g.add("silu", [first]), second])
    if how == "cat":
        return g.add("cat", [first, second], {"dim": -1})
    return g.add("sub", [first, second])


# -- elementwise, activations ------------------------------------------------------


def _unary(op: str, **kw_strategies) -> Drawer:
    def draw_unary(draw, g):
        x = g.pick(draw)
        attrs = {}
        for name, strategy in kw_strategies.items():
            value = _maybe(draw, draw(strategy))
            if value is not None:
                attrs[name] = value
        if (
            op == "clamp"
            and attrs.get("min") is not None
            and attrs.get("max") is not None
            and attrs["min"] > attrs["max"]
        ):
            attrs["min"], attrs["max"] = attrs["max"], attrs["min"]
        if op == "hardtanh" and attrs.get("min_val", -1.0) >= attrs.get("max_val", 1.0):
            attrs.pop("min_val", None)
            attrs.pop("max_val", None)
        return g.add(op, [x], attrs)

    return draw_unary


def _broadcastable(a: tuple, b: tuple) -> bool:
    return all(x == y or x == 1 or y == 1 for x, y in zip(reversed(a), reversed(b)))


def _binary(op: str, **kw_strategies) -> Drawer:
    def draw_binary(draw, g):
        x = g.pick(draw)
        attrs = {}
        for name, strategy in kw_strategies.items():
            value = _maybe(draw, draw(strategy))
            if value is not None:
                attrs[name] = value
        source = draw(st.sampled_from(["value", "state", "scalar"]))
        if source == "value":
            other = g.pick(
                draw, lambda v: v.name != x.name and _broadcastable(x.shape, v.shape) and len(v.shape) <= len(x.shape)
            )
            if other is not None and op in ("div", "floor_divide"):
                # A divisor kept within [1/e, e]: exp(tanh(.)) of the value.
                other = g.add("exp_bounded", [other])
            if other is not None:
                return g.add(op, [x, other], attrs)
        if source == "scalar" and op not in ("maximum", "minimum"):
            attrs["scalar"] = draw(st.sampled_from([0.5, 2.0, -3.0, 1.0]))
            return g.add(op, [x], attrs)
        shape = list(x.shape[draw(st.integers(0, len(x.shape))) :])
        kind = draw(st.sampled_from(["parameter", "buffer", "constant"]))
        entry = {"kind": kind, "shape": shape, "scale": 1.0}
        if op in ("div", "floor_divide"):
            entry["min_abs"] = 0.5
        return g.add(op, [x], attrs, state=g.program.add_state(kind[0], entry))

    return draw_binary


# -- reductions, softmax, views -------------------------------------------------------


def _reduction(op: str) -> Drawer:
    def draw_reduction(draw, g):
        x = g.pick(draw, lambda v: v.rank >= 1)
        if x is None:
            return None
        dims = draw(
            st.lists(st.integers(-x.rank, x.rank - 1), min_size=1, max_size=x.rank, unique_by=lambda d: d % x.rank)
        )
        attrs = {"dim": dims[0] if len(dims) == 1 and draw(st.booleans()) else dims}
        keepdim = _maybe(draw, True, None)
        if keepdim or x.rank == len(dims):
            attrs["keepdim"] = True
        if op == "var":
            attrs["correction"] = draw(st.sampled_from([0, 1]))
            if attrs["correction"] == 1 and all(x.shape[d] == 1 for d in dims):
                attrs["correction"] = 0
        return g.add(op, [x], attrs)

    return draw_reduction


def _softmax(op: str) -> Drawer:
    def draw_softmax(draw, g):
        x = g.pick(draw, lambda v: v.rank >= 1)
        if x is None:
            return None
        return g.add(op, [x], {"dim": draw(st.integers(-x.rank, x.rank - 1))})

    return draw_softmax


def draw_reshape(draw, g):
    x = g.pick(draw, lambda v: v.rank >= 1)
    if x is None:
        return None
    remaining, shape = x.numel, []
    for _ in range(draw(st.integers(0, 3))):
        d = draw(st.sampled_from(_divisors(remaining)))
        shape.append(d)
        remaining //= d
    shape.append(remaining if not shape or draw(st.booleans()) else -1)
    return g.add("reshape", [x], {"shape": shape})


def draw_permute(draw, g):
    x = g.pick(draw, lambda v: v.rank >= 2)
    if x is None:
        return None
    return g.add("permute", [x], {"dims": draw(st.permutations(range(x.rank)))})


def draw_transpose(draw, g):
    x = g.pick(draw, lambda v: v.rank >= 2)
    if x is None:
        return None
    return g.add(
        "transpose", [x], {"dim0": draw(st.integers(0, x.rank - 1)), "dim1": draw(st.integers(-x.rank, x.rank - 1))}
    )


def draw_flatten(draw, g):
    x = g.pick(draw, lambda v: v.rank >= 2)
    if x is None:
        return None
    start = draw(st.integers(0, x.rank - 1))
    return g.add("flatten", [x], {"start_dim": start, "end_dim": draw(st.integers(start, x.rank - 1))})


def draw_unsqueeze(draw, g):
    x = g.pick(draw, lambda v: v.rank <= 3)
    if x is None:
        return None
    return g.add("unsqueeze", [x], {"dim": draw(st.integers(-x.rank - 1, x.rank))})


def draw_squeeze(draw, g):
    x = g.pick(draw, lambda v: 1 in v.shape and v.rank >= 2)
    if x is None:
        return None
    return g.add("squeeze", [x], {"dim": draw(st.sampled_from([i for i, d in enumerate(x.shape) if d == 1]))})


def draw_slice(draw, g):
    x = g.pick(draw, lambda v: v.rank >= 1 and max(v.shape) > 1)
    if x is None:
        return None
    dim = draw(st.sampled_from([i for i, d in enumerate(x.shape) if d > 1]))
    size = x.shape[dim]
    start = draw(st.integers(-size, size - 1))
    end = draw(st.sampled_from([None, size, draw(st.integers(1, size))]))
    return g.add("slice", [x], {"dim": dim, "start": start, "end": end, "step": draw(st.integers(1, 3))})


def draw_cat(draw, g):
    x = g.pick(draw, lambda v: v.rank >= 1)
    if x is None:
        return None
    dim = draw(st.integers(0, x.rank - 1))
    same = lambda v: v.rank == x.rank and all(a == b for i, (a, b) in enumerate(zip(v.shape, x.shape)) if i != dim)
    others = [g.pick(draw, same) for _ in range(draw(st.integers(1, 2)))]
    return g.add("cat", [x] + others, {"dim": dim - x.rank if draw(st.booleans()) else dim})


# -- pooling, normalization ---------------------------------------------------------------


def _pool(op: str, dims: int) -> Drawer:
    def draw_pool(draw, g):
        x = g.pick(draw, lambda v: v.rank == dims + 2 and min(v.shape[2:]) >= 2)
        if x is None:
            return None
        spatial = x.shape[2:]
        kernel = [draw(st.integers(1, min(4, s))) for s in spatial]
        attrs: dict = {"kernel_size": kernel[0] if dims == 1 else kernel}
        stride = _maybe(draw, [draw(st.integers(1, 3)) for _ in spatial])
        if stride:
            attrs["stride"] = stride[0] if dims == 1 else stride
        dilation = [1] * dims
        if op.startswith("max") and draw(st.booleans()):
            dilation = [draw(st.integers(1, 2)) if (k - 1) * 2 + 1 <= s else 1 for k, s in zip(kernel, spatial)]
            attrs["dilation"] = dilation[0] if dims == 1 else dilation
        padding = [draw(st.integers(0, ((k - 1) * d + 1) // 2)) for k, d in zip(kernel, dilation)]
        if any(padding):
            attrs["padding"] = padding[0] if dims == 1 else padding
        if draw(st.booleans()):
            attrs["ceil_mode"] = True
        if op.startswith("avg"):
            if draw(st.booleans()):
                attrs["count_include_pad"] = False
            if dims == 2 and draw(st.integers(0, 3)) == 0:
                attrs["divisor_override"] = draw(st.integers(1, 5))
        return g.add(op, [x], attrs)

    return draw_pool


def draw_adaptive_avg_pool2d(draw, g):
    x = g.pick(draw, lambda v: v.rank == 4)
    if x is None:
        return None
    size = [draw(st.integers(1, s)) for s in x.shape[2:]]
    return g.add("adaptive_avg_pool2d", [x], {"output_size": size})


# Interpolation modes by input rank; which take align_corners / antialias.
_INTERPOLATE_MODES = {
    3: ["nearest", "linear", "nearest-exact", "area"],
    4: ["nearest", "bilinear", "bicubic", "nearest-exact", "area"],
}
_ALIGNABLE = {"linear", "bilinear", "bicubic"}


def draw_interpolate(draw, g):
    """F.interpolate with its whole signature: an output size or a scale
    factor (per dim or one for all), every mode for the rank, align_corners,
    recompute_scale_factor and antialias where the mode takes them."""
    x = g.pick(draw, lambda v: v.rank in (3, 4))
    if x is None:
        return None
    spatial = x.shape[2:]
    mode = draw(st.sampled_from(_INTERPOLATE_MODES[x.rank]))
    attrs: dict = {"mode": mode}
    if draw(st.booleans()):
        attrs["size"] = [draw(st.integers(1, 2 * s + 2)) for s in spatial]
        if len(spatial) == 1 and draw(st.booleans()):
            attrs["size"] = attrs["size"][0]
    else:
        factors = [draw(st.sampled_from([0.5, 1.5, 2.0, 3.0])) for _ in spatial]
        attrs["scale_factor"] = factors[0] if draw(st.booleans()) else factors
        if draw(st.booleans()):
            attrs["recompute_scale_factor"] = True
    if mode in _ALIGNABLE and draw(st.booleans()):
        attrs["align_corners"] = True
    if (
        mode in ("bilinear", "bicubic")
        and g.program.dtype in ARGUMENT_DTYPES[("interpolate", "antialias")]
        and draw(st.integers(0, 3)) == 0
    ):
        attrs["antialias"] = True
    return g.add("interpolate", [x], attrs)


def draw_pixel_shuffle(draw, g):
    x = g.pick(draw, lambda v: v.rank == 4)
    if x is None:
        return None
    if draw(st.booleans()):
        factors = [r for r in (2, 3) if x.shape[1] % (r * r) == 0]
        if not factors:
            return None
        return g.add("pixel_shuffle", [x], {"upscale_factor": draw(st.sampled_from(factors))})
    factors = [r for r in (2, 3) if x.shape[2] % r == 0 and x.shape[3] % r == 0]
    if not factors:
        return None
    return g.add("pixel_unshuffle", [x], {"downscale_factor": draw(st.sampled_from(factors))})


def draw_layer_norm(draw, g):
    x = g.pick(draw, lambda v: v.rank >= 2)
    if x is None:
        return None
    shape = list(x.shape[-draw(st.integers(1, min(2, x.rank - 1))) :])
    kwargs = {
        "normalized_shape": shape,
        "eps": draw(st.sampled_from([1e-5, 1e-3])),
        "elementwise_affine": draw(st.booleans()),
    }
    if kwargs["elementwise_affine"] and draw(st.booleans()):
        kwargs["bias"] = False
    return g.add("layer", [x], state=g.program.add_state("n", {"kind": "layer", "type": "LayerNorm", "kwargs": kwargs}))


def draw_batch_norm(draw, g):
    x = g.pick(draw, lambda v: 2 <= v.rank <= 4)
    if x is None:
        return None
    layer_type = "BatchNorm2d" if x.rank == 4 else "BatchNorm1d"
    kwargs = {"num_features": x.shape[1], "eps": draw(st.sampled_from([1e-5, 1e-3])), "affine": draw(st.booleans())}
    return g.add("layer", [x], state=g.program.add_state("n", {"kind": "layer", "type": layer_type, "kwargs": kwargs}))


def draw_group_norm(draw, g):
    x = g.pick(draw, lambda v: v.rank >= 3)
    if x is None:
        return None
    channels = x.shape[1]
    kwargs = {
        "num_groups": draw(st.sampled_from(_divisors(channels))),
        "num_channels": channels,
        "eps": draw(st.sampled_from([1e-5, 1e-3])),
        "affine": draw(st.booleans()),
    }
    return g.add("layer", [x], state=g.program.add_state("n", {"kind": "layer", "type": "GroupNorm", "kwargs": kwargs}))


_FUSED_ACTIVATIONS = [
    ("relu", {}),
    ("hardtanh", {"min_val": 0.0, "max_val": 6.0}),
    ("hardtanh", {}),
    ("clamp", {"min": 0.0}),
    ("clamp", {"min": -1.0, "max": 1.0}),
]


def draw_idiom(draw, g):
    """A pattern that lowering passes and quantizer annotators fuse, in the
    order models write it: a convolution then its batch norm, a GEMM or an
    add then an activation (relu, relu6 as hardtanh, a clamp), a GEMM then
    both. The random graph rarely draws a producer straight into its fusing
    consumer, so these paths are otherwise left alone."""
    first = draw(st.sampled_from(["conv_batch_norm", "gemm_activation", "add_activation"]))
    if first == "conv_batch_norm":
        value = draw(st.sampled_from([d for d in DRAWERS if d[0] in ("conv1d", "conv2d", "conv_transpose2d")]))[1](
            draw, g
        )
        if value is None or value.rank not in (3, 4):
            return value
        layer_type = "BatchNorm2d" if value.rank == 4 else "BatchNorm1d"
        kwargs = {
            "num_features": value.shape[1],
            "eps": draw(st.sampled_from([1e-5, 1e-3])),
            "affine": draw(st.booleans()),
        }
        value = g.add(
            "layer", [value], state=g.program.add_state("n", {"kind": "layer", "type": layer_type, "kwargs": kwargs})
        )
    elif first == "gemm_activation":
        value = draw(st.sampled_from(GEMM_DRAWERS))[1](draw, g)
    else:
        value = _binary("add")(draw, g)
    if value is None or (first == "conv_batch_norm" and draw(st.booleans())):
        return value
    op, attrs = draw(st.sampled_from(_FUSED_ACTIVATIONS))
    return g.add(op, [value], dict(attrs))


def draw_buffer_update(draw, g):
    """A mutable buffer updated in place (a running state, a KV-cache slot):
    the runtime must start from the buffer's initial value, as eager does."""
    x = g.pick(draw, lambda v: v.rank >= 1)
    if x is None:
        return None
    name = g.program.add_state("m", {"kind": "buffer", "shape": list(x.shape), "scale": 1.0, "mutable": True})
    return g.add("buffer_update", [x], {"how": draw(st.sampled_from(["add", "copy", "mul"]))}, state=name)


# -- ExecuTorch's backend suite: its float ops beyond the above ----------------------


def _positive(draw, g, x: Value) -> Optional[Value]:
    """``x`` itself when it is known positive, else exp(tanh(x)): an operand
    in [1/e, e] for ops defined on positive values only (None when even that
    does not fit: an input past the size limit)."""
    node = next((n for n in g.nodes if n["id"] == x.name), None)
    if node is not None and node["op"] in ("exp_bounded", "sqrt_abs"):
        return x
    return g.add("exp_bounded", [x])


def _on_positive(op: str) -> Drawer:
    def draw_on_positive(draw, g):
        x = _positive(draw, g, g.pick(draw))
        return None if x is None else g.add(op, [x])

    return draw_on_positive


def draw_pow(draw, g):
    """An integer exponent on any operand; a fractional or negative one on a positive operand."""
    x = g.pick(draw)
    exponent = draw(st.sampled_from([2.0, 3.0, 0.5, -1.0, 1.5, -0.5, 2]))
    if exponent not in (2.0, 3.0, 2):
        x = _positive(draw, g, x)
    return None if x is None else g.add("pow", [x], {"exponent": exponent})


def draw_threshold(draw, g):
    return g.add("threshold", [g.pick(draw)], {"threshold": draw(FLOATS), "value": draw(FLOATS)})


def draw_glu(draw, g):
    x = g.pick(draw, lambda v: v.rank >= 1 and any(d % 2 == 0 for d in v.shape))
    if x is None:
        return None
    dim = draw(st.sampled_from([i for i, d in enumerate(x.shape) if d % 2 == 0]))
    attrs = {"dim": dim - x.rank if draw(st.booleans()) else dim}
    if attrs["dim"] == -1:
        attrs = {}
    return g.add("glu", [x], attrs)


def draw_prelu(draw, g):
    """One slope, or one per channel (dim 1)."""
    x = g.pick(draw)
    channels = x.shape[1] if x.rank >= 2 and draw(st.booleans()) else 1
    slope = g.program.add_state("p", {"kind": "parameter", "shape": [channels], "scale": 0.5})
    return g.add("prelu", [x], state=slope)


def _reduction_with_indices(op: str) -> Drawer:
    """max or min along one dim (negative dims too, keepdim both ways), their values."""

    def draw_reduction(draw, g):
        x = g.pick(draw, lambda v: v.rank >= 1)
        if x is None:
            return None
        attrs: dict = {"dim": draw(st.integers(-x.rank, x.rank - 1))}
        if draw(st.booleans()) or x.rank == 1:
            attrs["keepdim"] = True
        return g.add(op, [x], attrs)

    return draw_reduction


def draw_select(draw, g):
    x = g.pick(draw, lambda v: v.rank >= 2)
    if x is None:
        return None
    dim = draw(st.integers(-x.rank, x.rank - 1))
    size = x.shape[dim]
    return g.add("select", [x], {"dim": dim, "index": draw(st.integers(-size, size - 1))})


def draw_split(draw, g):
    """One chunk of a split: chunks of a size that need not divide the dim (the last is shorter)."""
    x = g.pick(draw, lambda v: v.rank >= 1 and max(v.shape) > 1)
    if x is None:
        return None
    dim = draw(st.sampled_from([i for i, d in enumerate(x.shape) if d > 1]))
    size = x.shape[dim]
    split_size = draw(st.integers(1, size - 1))
    chunks = -(-size // split_size)
    attrs = {"split_size": split_size, "chunk": draw(st.integers(-chunks, chunks - 1))}
    if dim or draw(st.booleans()):
        attrs["dim"] = dim - x.rank if draw(st.booleans()) else dim
    return g.add("split", [x], attrs)


def draw_stack(draw, g):
    x = g.pick(draw, lambda v: v.rank <= 3)
    if x is None:
        return None
    others = [g.pick(draw, lambda v: v.shape == x.shape) for _ in range(draw(st.integers(1, 2)))]
    dim = draw(st.integers(-x.rank - 1, x.rank))
    return g.add("stack", [x] + others, {"dim": dim} if dim else {})


def draw_expand(draw, g):
    """Size-1 dims widened, new leading dims, -1 for a dim kept."""
    x = g.pick(draw, lambda v: v.rank <= 3 and v.numel <= 512)
    if x is None:
        return None
    shape = [
        draw(st.integers(2, 4)) if d == 1 and draw(st.booleans()) else draw(st.sampled_from([d, -1])) for d in x.shape
    ]
    lead = [draw(st.integers(1, 3)) for _ in range(draw(st.integers(0, 1)))]
    return g.add("expand", [x], {"shape": lead + shape})


def _adaptive_pool(op: str, dims: int) -> Drawer:
    def draw_adaptive(draw, g):
        x = g.pick(draw, lambda v: v.rank in (dims + 1, dims + 2))
        if x is None:
            return None
        size = [draw(st.integers(1, s)) for s in x.shape[-dims:]]
        return g.add(
            op, [x], {"output_size": size[0] if dims == 1 or draw(st.booleans()) and len(set(size)) == 1 else size}
        )

    return draw_adaptive


def draw_pad(draw, g):
    """F.pad over the last one to three dims: constant (negative amounts crop,
    a fill value or none), or reflect, replicate and circular where PyTorch
    takes them (an input of one or two more dims than padded, amounts within
    the size)."""
    x = g.pick(draw, lambda v: v.rank >= 1)
    if x is None:
        return None
    padded = draw(st.integers(1, min(3, x.rank)))
    mode = draw(st.sampled_from(["constant", "constant", "reflect", "replicate", "circular"]))
    if mode != "constant" and x.rank not in (padded + 1, padded + 2):
        mode = "constant"
    amounts = []
    for size in reversed(x.shape[-padded:]):
        if mode == "constant":
            low, high = -((size - 1) // 2), 3
        else:
            low, high = 0, min(3, size - 1 if mode == "reflect" else size)
        amounts += [draw(st.integers(low, high)), draw(st.integers(low, high))]
    attrs: dict = {"pad": amounts}
    if mode != "constant":
        attrs["mode"] = mode
    elif draw(st.booleans()):
        attrs["value"] = draw(FLOATS)
    return g.add("pad", [x], attrs)


def draw_sdpa(draw, g):
    """Attention over (batch, [heads,] length, width) values: self-attention
    (one value as query, key and value) or another value as key and value;
    causal or not, a scale or the default, and now and then an additive 2-D
    float mask (the form XNNPACK's SDPA pattern takes)."""
    q = g.pick(draw, lambda v: v.rank in (3, 4))
    if q is None:
        return None
    kv = g.pick(draw, lambda v: v.rank == q.rank and v.shape[:-2] == q.shape[:-2] and v.shape[-1] == q.shape[-1])
    attrs: dict = {}
    if kv.shape[-2] == q.shape[-2] and draw(st.booleans()):
        attrs["is_causal"] = True
    if draw(st.booleans()):
        attrs["scale"] = draw(st.sampled_from([0.125, 0.5, 1.0]))
    state = None
    if not attrs.get("is_causal") and draw(st.integers(0, 2)) == 0:
        shape = [q.shape[-2], kv.shape[-2]]
        state = g.program.add_state("m", {"kind": "buffer", "shape": shape, "scale": 1.0})
    return g.add("sdpa", [q, kv, kv], attrs, state=state)


FLOATS = st.sampled_from([-2.0, -0.5, 0.0, 0.5, 1.0, 3.0])


# -- integer and bool values: indices, ids, masks ------------------------------------

INDEX_DTYPES = ("int64", "int32")


def _indices(draw, g: GraphDraft, high: int, accept=lambda v: True, shape=None) -> Optional[Value]:
    """Integer values in [0, high): an integer value of the program whose
    values fit (an argmax's, an input's), or a new input of ``shape`` (drawn
    when None: one or two dims)."""
    if draw(st.booleans()):
        found = g.pick(draw, lambda v: 0 < v.high <= high and accept(v), dtypes=INDEX_DTYPES)
        if found is not None:
            return found
    if shape is None:
        shape = tuple(draw(st.integers(1, 6)) for _ in range(draw(st.integers(1, 2))))
    return g.new_input(shape, draw(st.sampled_from(("int64", "int64", "int32"))), high)


def _index_of_max(op: str) -> Drawer:
    """argmax or argmin along one dim (negative dims too, keepdim both ways)."""

    def draw_index(draw, g):
        x = g.pick(draw, lambda v: v.rank >= 1)
        if x is None:
            return None
        dim = draw(st.integers(-x.rank, x.rank - 1))
        attrs = {"dim": dim, "keepdim": True} if draw(st.booleans()) else {"dim": dim}
        return g.add(op, [x], attrs, high=x.shape[dim])

    return draw_index


def draw_embedding(draw, g):
    """A table lookup: ids (rank 1 to 3) into a weight with at least as many rows as ids reach."""
    ids = _indices(draw, g, draw(st.integers(2, 32)), lambda v: v.rank <= 3)
    if ids is None:
        return None
    rows = max(ids.high, draw(st.integers(1, 32)))
    weight = g.program.add_state("w", {"kind": "weight", "shape": [rows, draw(st.integers(1, 16))]})
    return g.add("embedding", [ids], state=weight)


def draw_index_select(draw, g):
    x = g.pick(draw, lambda v: v.rank >= 1)
    if x is None:
        return None
    dim = draw(st.integers(-x.rank, x.rank - 1))
    size = x.shape[dim]
    index = _indices(draw, g, size, lambda v: v.rank == 1, shape=(draw(st.integers(1, 2 * size)),))
    if index is None:
        return None
    return g.add("index_select", [x, index], {"dim": dim})


def draw_index_put(draw, g):
    """Values written (or added) at indices into the leading one or two dims:
    written, one position; added, any number, repeats included. Or at a bool
    mask over the leading dims (``x[mask] = v``), the values one row
    broadcast to every selected place, however many the mask selects (none
    at all on all-false masks)."""
    x = g.pick(draw, lambda v: v.rank >= 1)
    if x is None:
        return None
    accumulate = draw(st.booleans())
    dims = draw(st.integers(1, min(2, x.rank)))
    if draw(st.integers(0, 2)) == 0:
        lead = x.shape[:dims]
        mask = g.pick(draw, lambda v: v.shape == lead, dtypes=("bool",)) or g.new_input(lead, "bool")
        if mask is None:
            return None
        indices, shape = [mask], (1, *x.shape[dims:])
    else:
        count = draw(st.integers(1, 6)) if accumulate else 1
        indices = []
        for dim in range(dims):
            index = _indices(draw, g, x.shape[dim], lambda v: v.shape == (count,), shape=(count,))
            if index is None:
                return None
            indices.append(index)
        shape = (count, *x.shape[dims:])
    values = g.pick(draw, lambda v: v.shape == shape) or g.new_input(shape, "")
    if values is None:
        return None
    return g.add("index_put", [x, values, *indices], {"accumulate": True} if accumulate else {})


def draw_masked_fill(draw, g):
    """A fill where a mask (a comparison's result, or a bool input of the
    value's shape or one that broadcasts to it) is true."""
    x = g.pick(draw, lambda v: v.rank >= 1)
    if x is None:
        return None
    mask = g.pick(draw, lambda v: _broadcastable(x.shape, v.shape) and v.rank <= x.rank, dtypes=("bool",))
    if mask is None:
        shape = tuple(1 if draw(st.integers(0, 3)) == 0 else d for d in x.shape[draw(st.integers(0, x.rank - 1)) :])
        mask = g.new_input(shape, "bool")
    if mask is None:
        return None
    return g.add("masked_fill", [x, mask], {"value": draw(st.sampled_from([0.0, -1.0, 2.5, -1e4]))})


# Order matters for shrinking: Hypothesis shrinks a choice toward the first
# entry, so the simplest ops come first.
DRAWERS: list[tuple[str, Drawer]] = [
    ("relu", _unary("relu")),
    ("neg", _unary("neg")),
    ("abs", _unary("abs")),
    ("sigmoid", _unary("sigmoid")),
    ("tanh", _unary("tanh")),
    ("gelu", _unary("gelu", approximate=st.sampled_from(["tanh"]))),
    ("silu", _unary("silu")),
    ("hardswish", _unary("hardswish")),
    ("hardsigmoid", _unary("hardsigmoid")),
    (
        "hardtanh",
        _unary("hardtanh", min_val=st.sampled_from([-2.0, -0.5, 0.0]), max_val=st.sampled_from([0.5, 1.0, 6.0])),
    ),
    ("leaky_relu", _unary("leaky_relu", negative_slope=st.sampled_from([0.2, 0.0, 1.5]))),
    ("elu", _unary("elu", alpha=st.sampled_from([0.5, 2.0]))),
    ("softplus", _unary("softplus", beta=st.sampled_from([0.5, 2.0]), threshold=st.sampled_from([5.0, 30.0]))),
    ("clamp", _unary("clamp", min=FLOATS, max=FLOATS)),
    ("square", _unary("square")),
    ("sqrt_abs", _unary("sqrt_abs")),
    ("exp_bounded", _unary("exp_bounded")),
    ("floor", _unary("floor")),
    ("ceil", _unary("ceil")),
    ("round", _unary("round")),
    ("via_float64", _unary("via_float64")),
    ("via_int64", _unary("via_int64")),
    ("add", _binary("add", alpha=st.sampled_from([2.0, -1.0, 0.5]))),
    ("sub", _binary("sub", alpha=st.sampled_from([2.0, -1.0, 0.5]))),
    ("mul", _binary("mul")),
    ("div", _binary("div", rounding_mode=st.sampled_from(["trunc", "floor"]))),
    ("maximum", _binary("maximum")),
    ("minimum", _binary("minimum")),
    ("linear", draw_linear),
    ("conv1d", _draw_conv(1, False)),
    ("conv2d", _draw_conv(2, False)),
    ("conv_transpose1d", _draw_conv(1, True)),
    ("conv_transpose2d", _draw_conv(2, True)),
    ("addmm", draw_addmm),
    ("mm", draw_mm),
    ("bmm", draw_bmm),
    ("matmul", draw_matmul),
    ("parallel_twins", draw_parallel_twins),
    ("sum", _reduction("sum")),
    ("mean", _reduction("mean")),
    ("amax", _reduction("amax")),
    ("amin", _reduction("amin")),
    ("var", _reduction("var")),
    ("softmax", _softmax("softmax")),
    ("log_softmax", _softmax("log_softmax")),
    ("reshape", draw_reshape),
    ("permute", draw_permute),
    ("transpose", draw_transpose),
    ("flatten", draw_flatten),
    ("unsqueeze", draw_unsqueeze),
    ("squeeze", draw_squeeze),
    ("slice", draw_slice),
    ("cat", draw_cat),
    ("max_pool1d", _pool("max_pool1d", 1)),
    ("max_pool2d", _pool("max_pool2d", 2)),
    ("avg_pool1d", _pool("avg_pool1d", 1)),
    ("avg_pool2d", _pool("avg_pool2d", 2)),
    ("adaptive_avg_pool2d", draw_adaptive_avg_pool2d),
    ("interpolate", draw_interpolate),
    ("pixel_shuffle", draw_pixel_shuffle),
    ("layer_norm", draw_layer_norm),
    ("batch_norm", draw_batch_norm),
    ("group_norm", draw_group_norm),
    ("buffer_update", draw_buffer_update),
    ("log", _on_positive("log")),
    ("log2", _on_positive("log2")),
    ("log10", _on_positive("log10")),
    ("log1p", _on_positive("log1p")),
    ("rsqrt", _on_positive("rsqrt")),
    ("pow", draw_pow),
    ("trunc", _unary("trunc")),
    ("threshold", draw_threshold),
    ("logsigmoid", _unary("logsigmoid")),
    ("glu", draw_glu),
    ("prelu", draw_prelu),
    ("floor_divide", _binary("floor_divide")),
    ("max_dim", _reduction_with_indices("max_dim")),
    ("min_dim", _reduction_with_indices("min_dim")),
    ("select", draw_select),
    ("split", draw_split),
    ("stack", draw_stack),
    ("expand", draw_expand),
    ("adaptive_avg_pool1d", _adaptive_pool("adaptive_avg_pool1d", 1)),
    ("pad", draw_pad),
    ("sin", _unary("sin")),
    ("cos", _unary("cos")),
    ("sdpa", draw_sdpa),
    ("idiom", draw_idiom),
    ("argmax", _index_of_max("argmax")),
    ("argmin", _index_of_max("argmin")),
    ("embedding", draw_embedding),
    ("index_select", draw_index_select),
    ("index_put", draw_index_put),
    ("masked_fill", draw_masked_fill),
    ("gt", _binary("gt")),
    ("lt", _binary("lt")),
]

# Drawers only campaigns use (sizes.exploring()): the deterministic ``ci``
# draws and the coverage corpus keep the vocabulary whose failures are
# triaged into findings, so the test command stays a regression suite. A
# drawer leaves this set once its campaign failures are recorded. Rank-5
# inputs are campaign-only for the same reason (strategies/programs.py).
CAMPAIGN_ONLY = frozenset(
    {
        "log",
        "log2",
        "log10",
        "log1p",
        "rsqrt",
        "pow",
        "trunc",
        "threshold",
        "logsigmoid",
        "glu",
        "prelu",
        "floor_divide",
        "max_dim",
        "min_dim",
        "select",
        "split",
        "stack",
        "expand",
        "adaptive_avg_pool1d",
        "pad",
        "sin",
        "cos",
        "sdpa",
        "idiom",
        "argmax",
        "argmin",
        "embedding",
        "index_select",
        "index_put",
        "masked_fill",
        "gt",
        "lt",
    }
)

# Ops of ExecuTorch's backend suite (executorch/backends/test/suite/operators,
# by its module names) the strategies do not draw yet, and why. A program is
# drawn once for every flow, so an op only some flows can run is left out.
_NO_PORTABLE_KERNEL = (
    "the portable runtime has no kernel for it (error 0x14 at load, 0x12 for conv3d at run time) and XNNPACK "
    "does not claim it, so only Core AI flows could run it: needs drawing per flow"
)
_NOT_CORE_ATEN = (
    "outside the Core ATen opset: to_edge rejects it on every flow (ExecuTorch's suite skips it: "
    "runner.UNSUPPORTED_PORTABLE_OPS)"
)
NOT_DRAWN = {
    "embedding_bag": _NO_PORTABLE_KERNEL,
    "conv3d": _NO_PORTABLE_KERNEL,
    "convtranspose3d": _NO_PORTABLE_KERNEL
    + "; Core AI's converter rejects it ('Transposed conv3d is not yet supported')",
    "maxpool3d": _NO_PORTABLE_KERNEL,
    "avgpool3d": _NO_PORTABLE_KERNEL,
    "adaptive_avgpool3d": _NO_PORTABLE_KERNEL,
    "adaptive_maxpool1d": _NOT_CORE_ATEN,
    "adaptive_maxpool2d": _NOT_CORE_ATEN,
    "adaptive_maxpool3d": _NOT_CORE_ATEN,
    "median": _NOT_CORE_ATEN,
    "lstm": "a recurrent layer: the tolerance model has no rounding bound over time steps yet",
}
GEMM_DRAWERS = [d for d in DRAWERS if d[0] == "parallel_twins" or (d[0] in OP_TABLE and OP_TABLE[d[0]].gemm)]
