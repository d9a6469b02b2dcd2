"""The op vocabulary of program specs: how each spec op becomes Python source.

A node is ``{"id", "op", "args": [value refs], "attrs": {...}}`` (plus
``"state"`` for ops that call a stateful layer). Each op here renders a node as
one Python expression; the builder assembles those into the module's source.
Rendering to source (rather than building modules from closures) means the
program a repro file describes and the standalone repro script are the same
code, and shape inference can evaluate that very expression on meta tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

Render = Callable[[list[str], dict, str], str]


def _kw(attrs: dict, *names: str) -> str:
    """Keyword arguments for the attrs present, in a stable order."""
    parts = [f"{name}={attrs[name]!r}" for name in names if name in attrs]
    return (", " + ", ".join(parts)) if parts else ""


def _call(fn: str, *kwnames: str, nargs: int | None = None) -> Render:
    def render(args, attrs, state):
        used = args if nargs is None else args[:nargs]
        return f"{fn}({', '.join(used)}{_kw(attrs, *kwnames)})"

    return render


def _avg_pool(fn: str, *kwnames: str) -> Render:
    """``by_sums``: the pool as whole windows over an explicitly padded input,
    divided by what PyTorch's divisor counts (the same values; a
    neutralization)."""

    def render(args, attrs, state):
        return f"{'_avg_pool_by_sums' if attrs.get('by_sums') else fn}({args[0]}{_kw(attrs, *kwnames)})"

    return render


def _through_float64(operand: str) -> str:
    """``operand`` cast to float64 and back: the same values, through a cast
    no delegate takes (``input_via_float64``)."""
    return f"{operand}.double().to({operand}.dtype)"


def _layer(args, attrs, state):
    """``two_pass`` (GroupNorm) and ``layer_norm_two_pass`` (LayerNorm): the
    variance taken about the mean; ``input_copy``: the layer reads a copy of
    its input, so no rewrite fuses it with the op before;
    ``input_via_float64``: it reads its input cast to float64 and back (the
    same values, through a cast no delegate takes); ``by_hand``: a batch norm
    as arithmetic on its running statistics (the same values up to rounding;
    neutralizations); ``pad_output``: a transposed convolution
    layer's output_padding applied by padding its full result (``pad_by_cat``:
    by concatenating zeros); ``output_via_float64``: its result (before any
    output padding) cast to float64 and back; ``same_padding_explicit``: a
    convolution layer with padding 'same' as zeros padded on, then the
    convolution without padding; ``circular_padding_explicit``: a convolution
    layer with padding_mode 'circular' as wrapped slices concatenated on,
    then the convolution without padding."""
    operand = f"{args[0]}.clone()" if attrs.get("input_copy") else args[0]
    if attrs.get("input_via_float64"):
        operand = _through_float64(operand)
    if attrs.get("same_padding_explicit"):
        return f"_conv_same_padded_explicitly(self.{state}, {operand})"
    if attrs.get("circular_padding_explicit"):
        return f"_conv_circular_padded_explicitly(self.{state}, {operand})"
    if attrs.get("pad_output"):
        extra = (", by_cat=True" if attrs.get("pad_by_cat") else "") + (
            ", via_float64=True" if attrs.get("output_via_float64") else ""
        )
        return f"_conv_transpose_output_padded(self.{state}, {operand}{extra})"
    if attrs.get("output_via_float64"):
        return f"_via_float64({_layer(args, {k: v for k, v in attrs.items() if k != 'output_via_float64'}, state)})"
    kinds = [
        kind for kind, attr in (("GroupNorm", "two_pass"), ("LayerNorm", "layer_norm_two_pass")) if attrs.get(attr)
    ]
    if kinds and attrs.get("by_hand"):
        # Neutralizations compose: each rewrites only the layer type it names.
        return f"_norm_two_pass(self.{state}, {operand}, {tuple(kinds)!r}, batch_norm_by_hand=True)"
    if kinds == ["GroupNorm"] and not attrs.get("input_copy"):
        return f"_group_norm_two_pass(self.{state}, {args[0]})"
    if kinds:
        return f"_norm_two_pass(self.{state}, {operand}, {tuple(kinds)!r})"
    if attrs.get("by_hand"):
        return f"_batch_norm_by_hand(self.{state}, {operand})"
    return f"self.{state}({operand})"


def _weight_ref(state: str, attr: str = "weight") -> str:
    return f"self.{state}.{attr}"


def _weight_operand(state: str, attrs: dict) -> str:
    """The weight a GEMM reads from ``state``. ``weight_as`` (set by mutation
    analysis, never drawn): the same values read row-major in another shape,
    as a relative op expecting another weight layout reads the same buffer."""
    if "weight_as" in attrs:
        return f"{_weight_ref(state)}.reshape({tuple(attrs['weight_as'])!r})"
    return _weight_ref(state)


def _gemm_functional(fn: str, *kwnames: str, bias_argument: bool = False) -> Render:
    """A functional GEMM whose last operand is the weight held in ``state``;
    without ``state``, a product of two values (attention's scores). A
    ``bias_state`` is ``fn``'s first argument with ``bias_argument``, else
    added to the product (a GEMM's relative without a bias argument)."""

    def render(args, attrs, state):
        operands = list(args) + ([_weight_operand(state, attrs)] if state else [])
        bias = attrs.get("bias_state")
        if bias and bias_argument:
            operands.insert(0, _weight_ref(bias))
        product = f"{fn}({', '.join(operands)}{_kw(attrs, *kwnames)})"
        return f"torch.add({product}, {_weight_ref(bias)})" if bias and not bias_argument else product

    return render


def _addmm(args, attrs, state):
    """``separate_bias``: the product and the bias added as two ops (the same
    values; a neutralization)."""
    if not attrs.get("separate_bias"):
        return _gemm_functional("torch.addmm", "beta", "alpha", bias_argument=True)(args, attrs, state)
    product = f"torch.mm({args[0]}, {_weight_operand(state, attrs)}) * {attrs.get('alpha', 1)!r}"
    return f"torch.add({product}, {_weight_ref(attrs['bias_state'])} * {attrs.get('beta', 1)!r})"


def _interpolate(args, attrs):
    """``by_index``: a nearest resize to a given size written as gathers (the
    same values; a neutralization). ``antialias_widened``: an antialiased 2-D
    resize keeping a width of 1 computed at width 2 (a neutralization)."""
    if attrs.get("by_index") and attrs.get("mode", "nearest") == "nearest" and attrs.get("size"):
        size = [attrs["size"]] if isinstance(attrs["size"], int) else list(attrs["size"])
        return f"_nearest_by_index({args[0]}, {size!r})"
    names = ("size", "scale_factor", "mode", "align_corners", "recompute_scale_factor", "antialias")
    if attrs.get("antialias_widened") and attrs.get("antialias"):
        return f"_interpolate_widened({args[0]}{_kw(attrs, *names)})"
    return _call("F.interpolate", *names)(args, attrs, None)


def _linear_functional(args, attrs, state):
    """``separate_bias``: the product, then the bias added; ``input_via_float64``:
    it reads its input cast to float64 and back, through a cast no delegate
    takes (the same values; neutralizations)."""
    bias = _weight_ref(attrs["bias_state"]) if attrs.get("bias_state") else "None"
    if attrs.get("input_via_float64"):
        args = [_through_float64(args[0])] + list(args[1:])
    if attrs.get("separate_bias") and attrs.get("bias_state"):
        return f"torch.add(F.linear({args[0]}, {_weight_operand(state, attrs)}, None), {bias})"
    return f"F.linear({args[0]}, {_weight_operand(state, attrs)}, {bias})"


def _conv_functional(dims: int, transposed: bool) -> Render:
    fn = f"F.conv_transpose{dims}d" if transposed else f"F.conv{dims}d"
    names = (
        ("stride", "padding", "output_padding", "groups", "dilation")
        if transposed
        else ("stride", "padding", "dilation", "groups")
    )

    def render(args, attrs, state):
        bias = _weight_ref(attrs["bias_state"]) if attrs.get("bias_state") else "None"
        # ``input_via_float64`` (a convolution): what it convolves, padded or
        # not, read through a cast to float64 and back; ``input_copy``: it
        # convolves a copy of its input, which no other op reads
        # (neutralizations).
        via = attrs.get("input_via_float64")
        if attrs.get("input_copy"):
            args = [f"{args[0]}.clone()"] + list(args[1:])
        if not transposed and attrs.get("same_padding_explicit") and attrs.get("padding") == "same":
            # ``same_padding_explicit``: the zeros padded on, then no padding (a neutralization).
            return (
                f"_conv_same_padded_explicitly_functional({args[0]}, {_weight_operand(state, attrs)}, {bias}, "
                f"{attrs.get('dilation', 1)!r}, {attrs.get('groups', 1)!r}" + (", via_float64=True)" if via else ")")
            )
        if via:
            args = [_through_float64(args[0])] + list(args[1:])
        if transposed and attrs.get("pad_output") and attrs.get("output_padding"):
            # ``pad_output``: the full transposed convolution, cropped by
            # padding and extended by output_padding with zeros, then the bias
            # (the same values; a neutralization).
            inner = {name: value for name, value in attrs.items() if name not in ("output_padding", "padding")}
            by_cat = ", by_cat=True" if attrs.get("pad_by_cat") else ""
            full = f"{fn}({args[0]}, {_weight_operand(state, attrs)}, None{_kw(inner, *names)})"
            if attrs.get("output_via_float64"):
                full = f"_via_float64({full})"
            return f"_output_padded({full}, {attrs.get('padding', 0)!r}, {attrs['output_padding']!r}, {bias}{by_cat})"
        result = f"{fn}({args[0]}, {_weight_operand(state, attrs)}, {bias}{_kw(attrs, *names)})"
        # ``output_via_float64``: the result cast to float64 and back (a neutralization).
        return f"_via_float64({result})" if attrs.get("output_via_float64") else result

    return render


def _method(name: str, *kwnames: str) -> Render:
    def render(args, attrs, state):
        rest = ", ".join(args[1:])
        positional = [rest] if rest else []
        positional += [repr(a) for a in attrs.get("positional", [])]
        return f"{args[0]}.{name}({', '.join(positional)}{_kw(attrs, *kwnames)})"

    return render


def _binary_with_state(fn: str, *kwnames: str) -> Render:
    """Binary op whose second operand may be a parameter/buffer/constant;
    ``input_via_float64``: its first operand cast to float64 and back (a
    neutralization)."""

    def render(args, attrs, state):
        operands = list(args)
        if attrs.get("input_via_float64"):
            operands[0] = _through_float64(operands[0])
        if state:
            operands.append(f"self.{state}")
        if "scalar" in attrs:
            operands.append(repr(attrs["scalar"]))
        return f"{fn}({', '.join(operands)}{_kw(attrs, *kwnames)})"

    return render


def _index_put(args, attrs, state):
    """``torch.index_put`` of ``args[1]`` at the indices (or the bool mask)
    ``args[2:]``. ``by_one_hot`` (accumulated only): the same sums written
    without index_put (``_index_put_summed``; a neutralization)."""
    tensor, values, indices = args[0], args[1], args[2:]
    if attrs.get("accumulate") and attrs.get("by_one_hot"):
        return f"_index_put_summed({tensor}, {values}, {', '.join(indices)})"
    accumulate = attrs.get("accumulate", False)
    return f"torch.index_put({tensor}, ({', '.join(indices)},), {values}, accumulate={accumulate!r})"


def _adaptive_avg_pool1d(args, attrs, state):
    """``batched``: an unbatched (C, L) input pooled with a batch dim of one
    added and taken away again (the same values; a neutralization)."""
    if attrs.get("batched"):
        return f"_pooled_with_batch_dim({args[0]}, {attrs['output_size']!r})"
    return _call("F.adaptive_avg_pool1d", "output_size")(args, attrs, state)


def _cat(args, attrs, state):
    return f"torch.cat([{', '.join(args)}], dim={attrs['dim']!r})"


def _slice(args, attrs, state):
    bounds = f"{attrs.get('start')!r}, {attrs.get('end')!r}, {attrs.get('step', 1)!r}"
    index = ["slice(None)"] * attrs.get("dim", 0) + [f"slice({bounds})"]
    return f"{args[0]}[{', '.join(index)}]"


def _prelu(args, attrs, state):
    """``as_4d``: the slope applied to a 4-D view, (N, C, rest, 1), then the
    input's shape again (the same values; a neutralization)."""
    if attrs.get("as_4d"):
        x = args[0]
        return f"F.prelu({x}.reshape(({x}.shape + (1, 1))[:2] + (-1, 1)), self.{state}).reshape({x}.shape)"
    return f"F.prelu({args[0]}, self.{state})"


def _pad(args, attrs, state):
    """``crop_by_slice``: a constant pad's negative amounts (a crop) taken as
    a slice first, then only the positive amounts padded (the same values; a
    neutralization)."""
    amounts = list(attrs["pad"])
    if not (attrs.get("crop_by_slice") and any(a < 0 for a in amounts)):
        return _call("F.pad", "pad", "mode", "value")(args, attrs, state)
    pairs = [amounts[i : i + 2] for i in range(0, len(amounts), 2)]  # last dim first
    slices = [f"{max(0, -low)}:{-max(0, -high) or None}" for low, high in reversed(pairs)]
    cropped = f"{args[0]}[..., {', '.join(slices)}]"
    rest = {**attrs, "pad": [max(0, a) for a in amounts]}
    del rest["crop_by_slice"]
    return _call("F.pad", "pad", "mode", "value")([cropped], rest, state)


def _sdpa(args, attrs, state):
    """Scaled dot-product attention of query, key and value (``args``), with
    an additive float mask read from ``state`` when there is one."""
    mask = f", attn_mask=self.{state}" if state else ""
    return f"F.scaled_dot_product_attention({', '.join(args[:3])}{mask}{_kw(attrs, 'is_causal', 'scale')})"


def _var(args, attrs):
    """``in_float32``: the variance computed in float32 and cast back (what
    eager does inside for half types; a neutralization)."""
    if attrs.get("in_float32"):
        return f"torch.var({args[0]}.float(){_kw(attrs, 'dim', 'correction', 'keepdim')}).to({args[0]}.dtype)"
    return f"torch.var({args[0]}{_kw(attrs, 'dim', 'correction', 'keepdim')})"


_OUT_OF_PLACE = {
    "add": "(self.{s} + {x})",
    "mul": "(self.{s} * {x})",
    "copy": "{x}.expand_as(self.{s}).to(self.{s}.dtype)",
}


def _state_update(args, attrs, state):
    """In-place update of a buffer; the expression's value is the updated buffer.
    With ``in_place`` false, the same value without the write; with
    ``expand_source``, the value written broadcast to the buffer's shape first
    (the same values; neutralizations)."""
    source = f"{args[0]}.expand_as(self.{state})" if attrs.get("expand_source") else args[0]
    if attrs.get("in_place", True):
        return f"self.{state}.{attrs['how']}_({source})"
    return _OUT_OF_PLACE[attrs["how"]].format(s=state, x=source)


REQUIRED = object()  # an argument without a default (no ignore_argument mutant)


@dataclass(frozen=True)
class Op:
    """Everything etprop knows about one op of the vocabulary; the other
    tables (the builder's rounding classes, the quantized reference's, the
    semantic mutants, the coverage space, the strategies' GEMM and twin
    lists) are derived from these records.

    - ``family`` groups ops for coverage reports and for the claims flows
      make (oracles/coverage.py); ``render`` writes a node as an expression.
    - ``arguments``: every argument a strategy draws, with its default
      (``REQUIRED`` when it has none); None for ops whose arguments live
      elsewhere (a layer's per type, semantic_mutants.LAYER_ARGUMENTS).
    - ``rounding`` (the tolerance model, docs/tolerance.md): ``exact`` (the
      result is exact given the operands), ``sums`` (the rounding error scales
      with the sum of the terms' sizes), ``terms`` (the textbook formula
      cancels terms, whose size ``terms`` renders from the operands and
      ``aten_terms`` computes from the ATen op's arguments), or ``ulp``.
    - ``relative``: the nearest other op of the same signature (a semantic
      mutant); ``axis``: it works along an axis; ``binary``: two operands,
      the second a value, state or scalar; ``gemm``, ``bias``: a GEMM, one
      with a bias operand; ``state_operand``: it reads a parameter a mutant
      can swap; ``twinnable``: a twin with its own parameters can be drawn.
    - ``own_output_via_float64``: its renderer places the output cast of
      that neutralization itself; ``neutralizations``: the rewrite attributes
      its renderer accepts (etprop/program/neutralize.py).
    - ``operands``: how many values (``args``) it reads at least."""

    family: str
    render: Render
    arguments: dict | None = field(default_factory=dict)
    rounding: str = "ulp"
    terms: Callable[[list[str], dict], str] | None = None
    aten_terms: Callable | None = None
    relative: str | None = None
    axis: bool = False
    binary: bool = False
    gemm: bool = False
    bias: bool = False
    state_operand: bool = False
    twinnable: bool = False
    own_output_via_float64: bool = False
    neutralizations: tuple[str, ...] = ()
    operands: int = 1


ROUNDING_CLASSES = ("exact", "sums", "terms", "ulp")


_CONV_ARGS = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1}
_POOL_ARGS = {"kernel_size": REQUIRED, "stride": None, "padding": 0, "ceil_mode": False}
_REDUCE_ARGS = {"dim": REQUIRED, "keepdim": False}
_CONV_NEUTRALIZATIONS = ("input_via_float64", "input_copy", "same_padding_explicit", "pad_output", "pad_by_cat")


def _abs(tensor):
    return tensor.double().abs()


def _gemm(render: Render, relative: str | None, arguments: dict, bias: bool = False, **facts) -> Op:
    return Op(
        "gemm",
        render,
        arguments,
        rounding="sums",
        relative=relative,
        gemm=True,
        bias=bias,
        state_operand=True,
        twinnable=True,
        **facts,
    )


def _conv_op(dims: int, transposed: bool) -> Op:
    """A functional convolution; its relative is its transposed twin (and back)."""
    return _gemm(
        _conv_functional(dims, transposed),
        f"conv{dims}d" if transposed else f"conv_transpose{dims}d",
        {**_CONV_ARGS, "output_padding": 0} if transposed else dict(_CONV_ARGS),
        bias=True,
        own_output_via_float64=True,
        neutralizations=_CONV_NEUTRALIZATIONS,
    )


def _values_along_dim(fn: str, relative: str) -> Op:
    """``torch.max`` or ``torch.min`` along one dim: its values (not its
    indices). ``as_amax``: the same values as ``amax`` / ``amin`` (a
    neutralization)."""

    def render(args, attrs, state):
        keepdim = attrs.get("keepdim", False)
        if attrs.get("as_amax"):
            return f"torch.a{fn}({args[0]}, {attrs['dim']!r}, keepdim={keepdim!r})"
        return f"torch.{fn}({args[0]}, {attrs['dim']!r}, keepdim={keepdim!r}).values"

    return Op(
        "reduction",
        render,
        dict(_REDUCE_ARGS),
        rounding="exact",
        relative=relative,
        axis=True,
        neutralizations=("as_amax",),
    )


def _binary_op(render: Render, relative: str, arguments: dict, rounding: str = "ulp") -> Op:
    return Op(
        "binary",
        render,
        arguments,
        rounding=rounding,
        relative=relative,
        binary=True,
        state_operand=True,
        twinnable=True,
        neutralizations=("input_via_float64",),
    )


OP_TABLE: dict[str, Op] = {
    # GEMMs
    "layer": Op(
        "gemm",
        _layer,
        None,
        rounding="sums",
        own_output_via_float64=True,
        neutralizations=(
            "two_pass",
            "layer_norm_two_pass",
            "input_copy",
            "input_via_float64",
            "by_hand",
            "pad_output",
            "pad_by_cat",
            "same_padding_explicit",
            "circular_padding_explicit",
        ),
    ),  # nn.Linear / ConvNd / ConvTransposeNd / norms
    "linear": _gemm(
        _linear_functional, "matmul", {}, bias=True, neutralizations=("separate_bias", "input_via_float64")
    ),
    "conv1d": _conv_op(1, transposed=False),
    "conv2d": _conv_op(2, transposed=False),
    "conv_transpose1d": _conv_op(1, transposed=True),
    "conv_transpose2d": _conv_op(2, transposed=True),
    "addmm": _gemm(_addmm, None, {"alpha": 1, "beta": 1}, neutralizations=("separate_bias",)),
    "mm": _gemm(_gemm_functional("torch.mm"), "matmul", {}),
    "bmm": _gemm(_gemm_functional("torch.bmm"), "matmul", {}),
    "matmul": _gemm(_gemm_functional("torch.matmul"), "mm", {}),
    # unary elementwise and activations
    "relu": Op("activation", _call("torch.relu"), rounding="exact", relative="leaky_relu"),
    "gelu": Op(
        "activation",
        _call("F.gelu", "approximate"),
        {"approximate": "none"},
        rounding="terms",
        terms=lambda a, at: f"{a[0]}.abs()",
        aten_terms=lambda x, *rest: _abs(x),
        relative="silu",
    ),
    "sigmoid": Op("activation", _call("torch.sigmoid"), relative="hardsigmoid"),
    "tanh": Op("activation", _call("torch.tanh"), relative="hardtanh"),
    "silu": Op("activation", _call("F.silu"), relative="gelu"),
    "hardswish": Op(
        "activation",
        _call("F.hardswish"),
        rounding="terms",
        terms=lambda a, at: f"{a[0]}.abs() * ({a[0]}.abs() + 3) / 6",
        aten_terms=lambda x, *rest: _abs(x) * (_abs(x) + 3) / 6,
        relative="silu",
    ),
    "hardsigmoid": Op(
        "activation",
        _call("F.hardsigmoid"),
        rounding="terms",
        terms=lambda a, at: f"({a[0]}.abs() + 3) / 6",
        aten_terms=lambda x, *rest: (_abs(x) + 3) / 6,
        relative="sigmoid",
    ),
    "hardtanh": Op(
        "activation",
        _call("F.hardtanh", "min_val", "max_val"),
        {"min_val": -1.0, "max_val": 1.0},
        rounding="exact",
        relative="tanh",
    ),
    "leaky_relu": Op("activation", _call("F.leaky_relu", "negative_slope"), {"negative_slope": 0.01}, relative="relu"),
    "elu": Op(
        "activation",
        _call("F.elu", "alpha"),
        {"alpha": 1.0},
        rounding="terms",
        terms=lambda a, at: f"torch.full_like({a[0]}, {abs(at.get('alpha', 1.0))!r})",
        aten_terms=lambda x, alpha=1.0, *rest: _abs(x).new_full(x.shape, abs(alpha)),
        relative="leaky_relu",
    ),
    "softplus": Op(
        "activation",
        _call("F.softplus", "beta", "threshold"),
        {"beta": 1.0, "threshold": 20.0},
        rounding="terms",
        terms=lambda a, at: f"torch.full_like({a[0]}, {1 / abs(at.get('beta', 1.0))!r})",
        aten_terms=lambda x, beta=1.0, *rest: _abs(x).new_full(x.shape, 1 / abs(beta)),
        relative="relu",
    ),
    "clamp": Op(
        "elementwise",
        _call("torch.clamp", "min", "max"),
        {"min": None, "max": None},
        rounding="exact",
        relative="hardtanh",
    ),
    "abs": Op("elementwise", _call("torch.abs"), rounding="exact", relative="relu"),
    "neg": Op("elementwise", _call("torch.neg"), rounding="exact", relative="abs"),
    "square": Op("elementwise", _call("torch.square"), relative="abs"),
    "sqrt_abs": Op("elementwise", lambda a, at, s: f"torch.sqrt(torch.abs({a[0]}))", relative="abs"),
    "exp_bounded": Op("elementwise", lambda a, at, s: f"torch.exp(torch.tanh({a[0]}))", relative="tanh"),
    "floor": Op("elementwise", _call("torch.floor"), rounding="exact", relative="ceil"),
    "ceil": Op("elementwise", _call("torch.ceil"), rounding="exact", relative="floor"),
    "round": Op("elementwise", _call("torch.round"), rounding="exact", relative="floor"),
    # dtype round trips: a float64 and an int64 intermediate, what Core AI's
    # default passes narrow to 32 bits at delegate boundaries
    "via_float64": Op(
        "dtype", lambda a, at, s: f"({a[0]}.to(torch.float64) * 1.5).to({a[0]}.dtype)", relative="via_int64"
    ),
    "via_int64": Op(
        "dtype",
        lambda a, at, s: f"torch.trunc({a[0]} * 4).to(torch.int64).to({a[0]}.dtype)",
        rounding="exact",
        relative="via_float64",
    ),
    # binary elementwise
    "add": _binary_op(_binary_with_state("torch.add", "alpha"), "sub", {"alpha": 1}, rounding="sums"),
    "sub": _binary_op(_binary_with_state("torch.sub", "alpha"), "add", {"alpha": 1}, rounding="sums"),
    "mul": _binary_op(_binary_with_state("torch.mul"), "div", {}),
    "div": _binary_op(_binary_with_state("torch.div", "rounding_mode"), "mul", {"rounding_mode": None}),
    "maximum": _binary_op(_binary_with_state("torch.maximum"), "minimum", {}, rounding="exact"),
    "minimum": _binary_op(_binary_with_state("torch.minimum"), "maximum", {}, rounding="exact"),
    # reductions and softmax-like
    "sum": Op(
        "reduction", _call("torch.sum", "dim", "keepdim"), dict(_REDUCE_ARGS), "sums", relative="mean", axis=True
    ),
    "mean": Op(
        "reduction", _call("torch.mean", "dim", "keepdim"), dict(_REDUCE_ARGS), "sums", relative="sum", axis=True
    ),
    "amax": Op(
        "reduction", _call("torch.amax", "dim", "keepdim"), dict(_REDUCE_ARGS), "exact", relative="amin", axis=True
    ),
    "amin": Op(
        "reduction", _call("torch.amin", "dim", "keepdim"), dict(_REDUCE_ARGS), "exact", relative="amax", axis=True
    ),
    "var": Op(
        "reduction",
        lambda a, at, s: _var(a, at),
        {**_REDUCE_ARGS, "correction": 1},
        rounding="terms",
        terms=lambda a, at: f"_var_terms({a[0]}, {at.get('dim')!r}, {at.get('keepdim', False)!r})",
        relative="mean",
        axis=True,
        neutralizations=("in_float32",),
    ),
    "softmax": Op("softmax", _call("torch.softmax", "dim"), {"dim": REQUIRED}, relative="log_softmax", axis=True),
    "log_softmax": Op(
        "softmax",
        _call("torch.log_softmax", "dim"),
        {"dim": REQUIRED},
        rounding="terms",
        terms=lambda a, at: f"{a[0]}.abs() + torch.logsumexp({a[0]}, dim={at['dim']!r}, keepdim=True).abs()",
        aten_terms=lambda x, dim, *rest: _abs(x) + x.double().logsumexp(dim=dim, keepdim=True).abs(),
        relative="softmax",
        axis=True,
    ),
    # views and data movement
    "reshape": Op(
        "view", lambda a, at, s: f"{a[0]}.reshape({tuple(at['shape'])!r})", {"shape": REQUIRED}, rounding="exact"
    ),
    "permute": Op(
        "view", lambda a, at, s: f"{a[0]}.permute({tuple(at['dims'])!r})", {"dims": REQUIRED}, rounding="exact"
    ),
    "transpose": Op(
        "view",
        lambda a, at, s: f"{a[0]}.transpose({at['dim0']!r}, {at['dim1']!r})",
        {"dim0": REQUIRED, "dim1": REQUIRED},
        rounding="exact",
    ),
    "flatten": Op(
        "view", _call("torch.flatten", "start_dim", "end_dim"), {"start_dim": 0, "end_dim": -1}, "exact", axis=True
    ),
    "unsqueeze": Op("view", lambda a, at, s: f"{a[0]}.unsqueeze({at['dim']!r})", {"dim": REQUIRED}, rounding="exact"),
    "squeeze": Op("view", lambda a, at, s: f"{a[0]}.squeeze({at['dim']!r})", {"dim": REQUIRED}, rounding="exact"),
    "slice": Op("view", _slice, {"dim": 0, "start": None, "end": None, "step": 1}, rounding="exact", axis=True),
    "cat": Op("view", _cat, {"dim": 0}, rounding="exact", axis=True),
    # pooling
    "max_pool1d": Op(
        "pool",
        _call("F.max_pool1d", "kernel_size", "stride", "padding", "dilation", "ceil_mode"),
        {**_POOL_ARGS, "dilation": 1},
        rounding="exact",
        relative="avg_pool1d",
    ),
    "max_pool2d": Op(
        "pool",
        _call("F.max_pool2d", "kernel_size", "stride", "padding", "dilation", "ceil_mode"),
        {**_POOL_ARGS, "dilation": 1},
        rounding="exact",
        relative="avg_pool2d",
    ),
    "avg_pool1d": Op(
        "pool",
        _avg_pool("F.avg_pool1d", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad"),
        {**_POOL_ARGS, "count_include_pad": True},
        rounding="sums",
        relative="max_pool1d",
        neutralizations=("by_sums",),
    ),
    "avg_pool2d": Op(
        "pool",
        _avg_pool(
            "F.avg_pool2d", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override"
        ),
        {**_POOL_ARGS, "count_include_pad": True, "divisor_override": None},
        rounding="sums",
        relative="max_pool2d",
        neutralizations=("by_sums",),
    ),
    "adaptive_avg_pool2d": Op(
        "pool", _call("F.adaptive_avg_pool2d", "output_size"), {"output_size": REQUIRED}, rounding="sums"
    ),
    # resampling
    "interpolate": Op(
        "resample",
        lambda a, at, s: _interpolate(a, at),
        {
            "mode": "nearest",
            "size": REQUIRED,
            "scale_factor": REQUIRED,
            "align_corners": None,
            "recompute_scale_factor": None,
            "antialias": False,
        },
        rounding="sums",
        neutralizations=("by_index", "antialias_widened"),
    ),
    "pixel_shuffle": Op(
        "resample", _call("F.pixel_shuffle", "upscale_factor"), {"upscale_factor": REQUIRED}, rounding="exact"
    ),
    "pixel_unshuffle": Op(
        "resample", _call("F.pixel_unshuffle", "downscale_factor"), {"downscale_factor": REQUIRED}, rounding="exact"
    ),
    # state
    "buffer_update": Op("state", _state_update, None, neutralizations=("in_place", "expand_source")),
    # ExecuTorch's backend suite: its float ops beyond the above
    "log": Op("elementwise", _call("torch.log"), relative="log2"),
    "log2": Op("elementwise", _call("torch.log2"), relative="log"),
    "log10": Op("elementwise", _call("torch.log10"), relative="log"),
    "log1p": Op("elementwise", _call("torch.log1p"), relative="log"),
    "rsqrt": Op("elementwise", _call("torch.rsqrt"), relative="sqrt_abs"),
    "pow": Op("elementwise", lambda a, at, s: f"torch.pow({a[0]}, {at['exponent']!r})", {"exponent": REQUIRED}),
    "trunc": Op("elementwise", _call("torch.trunc"), rounding="exact", relative="floor"),
    "threshold": Op(
        "activation",
        lambda a, at, s: f"F.threshold({a[0]}, {at['threshold']!r}, {at['value']!r})",
        {"threshold": REQUIRED, "value": REQUIRED},
        rounding="exact",
        relative="relu",
    ),
    # log(sigmoid(x)) computed as such loses -exp(-x) to 1 - sigmoid: terms of size 1.
    "logsigmoid": Op(
        "activation",
        _call("F.logsigmoid"),
        rounding="terms",
        terms=lambda a, at: f"torch.ones_like({a[0]})",
        relative="sigmoid",
    ),
    "glu": Op("activation", _call("F.glu", "dim"), {"dim": -1}, axis=True),
    "prelu": Op("activation", _prelu, {}, state_operand=True, neutralizations=("as_4d",)),
    # Not twinnable: flooring hides most of the difference between two twins' parameters.
    "floor_divide": replace(_binary_op(_binary_with_state("torch.floor_divide"), "div", {}), twinnable=False),
    "max_dim": _values_along_dim("max", relative="min_dim"),
    "min_dim": _values_along_dim("min", relative="max_dim"),
    "select": Op(
        "view",
        lambda a, at, s: f"{a[0]}.select({at['dim']!r}, {at['index']!r})",
        {"dim": REQUIRED, "index": REQUIRED},
        rounding="exact",
    ),
    "split": Op(
        "view",
        lambda a, at, s: f"torch.split({a[0]}, {at['split_size']!r}, dim={at.get('dim', 0)!r})[{at['chunk']!r}]",
        {"split_size": REQUIRED, "dim": 0, "chunk": REQUIRED},
        rounding="exact",
    ),
    "stack": Op(
        "view", lambda a, at, s: f"torch.stack([{', '.join(a)}], dim={at.get('dim', 0)!r})", {"dim": 0}, "exact"
    ),
    "expand": Op(
        "view", lambda a, at, s: f"{a[0]}.expand({tuple(at['shape'])!r})", {"shape": REQUIRED}, rounding="exact"
    ),
    # XNNPACK claims these beyond the suite's list: constant padding (and the
    # other pad modes beside it), sine and cosine, attention with a 2-D mask
    "pad": Op(
        "view",
        _pad,
        {"pad": REQUIRED, "mode": "constant", "value": None},
        rounding="exact",
        neutralizations=("crop_by_slice",),
    ),
    "sin": Op("elementwise", _call("torch.sin"), relative="cos"),
    "cos": Op("elementwise", _call("torch.cos"), relative="sin"),
    # The logits' rounding moves the softmax weights, each moving its value row:
    # max|v| times (1 + scale * max of |q| |k|^T), plus the weighted sum's own.
    "sdpa": Op(
        "attention",
        _sdpa,
        {"is_causal": False, "scale": None},
        rounding="terms",
        operands=3,
        terms=lambda a, at: (
            f"(torch.matmul({a[0]}.abs(), {a[1]}.abs().transpose(-2, -1)).amax(-1, keepdim=True)"
            f" * {at.get('scale') if at.get('scale') is not None else f'{a[0]}.shape[-1] ** -0.5'} + 1)"
            f" * {a[2]}.abs().amax(-2, keepdim=True)"
        ),
    ),
    "adaptive_avg_pool1d": Op(
        "pool",
        _adaptive_avg_pool1d,
        {"output_size": REQUIRED},
        rounding="sums",
        neutralizations=("batched",),
    ),
    # Integer and bool values (etprop-spec/3): indices out of float values,
    # ids and indices read, masks made and applied.
    "argmax": Op(
        "index", _call("torch.argmax", "dim", "keepdim"), dict(_REDUCE_ARGS), "exact", relative="argmin", axis=True
    ),
    "argmin": Op(
        "index", _call("torch.argmin", "dim", "keepdim"), dict(_REDUCE_ARGS), "exact", relative="argmax", axis=True
    ),
    "embedding": Op("index", lambda a, at, s: f"F.embedding({a[0]}, self.{s}.weight)", {}, "exact", state_operand=True),
    "index_select": Op(
        "index",
        lambda a, at, s: f"torch.index_select({a[0]}, {at['dim']!r}, {a[1]})",
        {"dim": REQUIRED},
        rounding="exact",
        axis=True,
        operands=2,
    ),
    # args: the tensor, the values, then one index per leading dim. Written
    # (not accumulated), no index repeats: eager's pick among repeats is not unique.
    "index_put": Op(
        "index", _index_put, {"accumulate": False}, rounding="sums", operands=3, neutralizations=("by_one_hot",)
    ),
    "masked_fill": Op(
        "index",
        lambda a, at, s: f"{a[0]}.masked_fill({a[1]}, {at['value']!r})",
        {"value": REQUIRED},
        rounding="exact",
        operands=2,
    ),
    "gt": Op("compare", _binary_with_state("torch.gt"), {}, "exact", relative="lt", binary=True),
    "lt": Op("compare", _binary_with_state("torch.lt"), {}, "exact", relative="gt", binary=True),
}
# The views the older code reads: op -> (family, renderer).
OPS: dict[str, tuple[str, Render]] = {name: (op.family, op.render) for name, op in OP_TABLE.items()}

CONTROL_FLOW_OPS = ("cond", "map", "scan", "while_loop")

# The dtypes in which the strategies draw an (op, argument) when not every
# dtype: PyTorch has no half-precision CPU kernel for antialiased resampling.
ARGUMENT_DTYPES = {("interpolate", "antialias"): ("float32",)}


def family(op: str) -> str:
    if op in CONTROL_FLOW_OPS:
        return "control_flow"
    return OPS[op][0]


def render(node: dict, args: list[str]) -> str:
    """``fit_shape`` (set by mutation analysis, never drawn): the result
    written into a buffer of the shape the unmutated node had;
    ``input_channels`` (the same): the first operand cut to its first
    channels; ``output_via_float64`` (a neutralization): the result cast to
    float64 and back."""
    _, renderer = OPS[node["op"]]
    attrs = node.get("attrs", {})
    if "input_channels" in attrs:
        args = [f"{args[0]}[:, :{attrs['input_channels']}]", *args[1:]]
    expression = renderer(args, attrs, node.get("state"))
    if attrs.get("output_via_float64") and not OP_TABLE[node["op"]].own_output_via_float64:
        expression = f"_via_float64({expression})"
    if "fit_shape" in attrs:
        expression = f"_fit_shape({expression}, {tuple(attrs['fit_shape'])!r})"
    return expression
