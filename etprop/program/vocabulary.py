"""The op vocabulary of program specs: how each spec op becomes Python source.

A node is ``{"id", "op", "args": [value refs], "attrs": {...}}`` (plus
``"state"`` for ops that call a stateful layer). Each op here renders a node as
one Python expression; the builder assembles those into the module's source.
Rendering to source (rather than building modules from closures) means the
program a repro file describes and the standalone repro script are the same
code, and shape inference can evaluate that very expression on meta tensors.
"""

from __future__ import annotations

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


def _cat(args, attrs, state):
    return f"torch.cat([{', '.join(args)}], dim={attrs['dim']!r})"


def _slice(args, attrs, state):
    bounds = f"{attrs.get('start')!r}, {attrs.get('end')!r}, {attrs.get('step', 1)!r}"
    index = ["slice(None)"] * attrs.get("dim", 0) + [f"slice({bounds})"]
    return f"{args[0]}[{', '.join(index)}]"


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


# Ops rendered from the node. Families group ops for coverage reports and
# for the claims flows make (see oracles/coverage.py).
OPS: dict[str, tuple[str, Render]] = {
    # GEMMs
    "layer": ("gemm", _layer),  # nn.Linear / ConvNd / ConvTransposeNd / norms
    "linear": ("gemm", _linear_functional),
    "conv1d": ("gemm", _conv_functional(1, False)),
    "conv2d": ("gemm", _conv_functional(2, False)),
    "conv_transpose1d": ("gemm", _conv_functional(1, True)),
    "conv_transpose2d": ("gemm", _conv_functional(2, True)),
    "addmm": ("gemm", _addmm),
    "mm": ("gemm", _gemm_functional("torch.mm")),
    "bmm": ("gemm", _gemm_functional("torch.bmm")),
    "matmul": ("gemm", _gemm_functional("torch.matmul")),
    # unary elementwise and activations
    "relu": ("activation", _call("torch.relu")),
    "gelu": ("activation", _call("F.gelu", "approximate")),
    "sigmoid": ("activation", _call("torch.sigmoid")),
    "tanh": ("activation", _call("torch.tanh")),
    "silu": ("activation", _call("F.silu")),
    "hardswish": ("activation", _call("F.hardswish")),
    "hardsigmoid": ("activation", _call("F.hardsigmoid")),
    "hardtanh": ("activation", _call("F.hardtanh", "min_val", "max_val")),
    "leaky_relu": ("activation", _call("F.leaky_relu", "negative_slope")),
    "elu": ("activation", _call("F.elu", "alpha")),
    "softplus": ("activation", _call("F.softplus", "beta", "threshold")),
    "clamp": ("elementwise", _call("torch.clamp", "min", "max")),
    "abs": ("elementwise", _call("torch.abs")),
    "neg": ("elementwise", _call("torch.neg")),
    "square": ("elementwise", _call("torch.square")),
    "sqrt_abs": ("elementwise", lambda a, at, s: f"torch.sqrt(torch.abs({a[0]}))"),
    "exp_bounded": ("elementwise", lambda a, at, s: f"torch.exp(torch.tanh({a[0]}))"),
    "floor": ("elementwise", _call("torch.floor")),
    "ceil": ("elementwise", _call("torch.ceil")),
    "round": ("elementwise", _call("torch.round")),
    # dtype round trips: a float64 and an int64 intermediate, what Core AI's
    # default passes narrow to 32 bits at delegate boundaries
    "via_float64": ("dtype", lambda a, at, s: f"({a[0]}.to(torch.float64) * 1.5).to({a[0]}.dtype)"),
    "via_int64": ("dtype", lambda a, at, s: f"torch.trunc({a[0]} * 4).to(torch.int64).to({a[0]}.dtype)"),
    # binary elementwise
    "add": ("binary", _binary_with_state("torch.add", "alpha")),
    "sub": ("binary", _binary_with_state("torch.sub", "alpha")),
    "mul": ("binary", _binary_with_state("torch.mul")),
    "div": ("binary", _binary_with_state("torch.div", "rounding_mode")),
    "maximum": ("binary", _binary_with_state("torch.maximum")),
    "minimum": ("binary", _binary_with_state("torch.minimum")),
    # reductions and softmax-like
    "sum": ("reduction", _call("torch.sum", "dim", "keepdim")),
    "mean": ("reduction", _call("torch.mean", "dim", "keepdim")),
    "amax": ("reduction", _call("torch.amax", "dim", "keepdim")),
    "amin": ("reduction", _call("torch.amin", "dim", "keepdim")),
    "var": ("reduction", lambda a, at, s: _var(a, at)),
    "softmax": ("softmax", _call("torch.softmax", "dim")),
    "log_softmax": ("softmax", _call("torch.log_softmax", "dim")),
    # views and data movement
    "reshape": ("view", lambda a, at, s: f"{a[0]}.reshape({tuple(at['shape'])!r})"),
    "permute": ("view", lambda a, at, s: f"{a[0]}.permute({tuple(at['dims'])!r})"),
    "transpose": ("view", lambda a, at, s: f"{a[0]}.transpose({at['dim0']!r}, {at['dim1']!r})"),
    "flatten": ("view", _call("torch.flatten", "start_dim", "end_dim")),
    "unsqueeze": ("view", lambda a, at, s: f"{a[0]}.unsqueeze({at['dim']!r})"),
    "squeeze": ("view", lambda a, at, s: f"{a[0]}.squeeze({at['dim']!r})"),
    "slice": ("view", _slice),
    "cat": ("view", _cat),
    # pooling
    "max_pool1d": ("pool", _call("F.max_pool1d", "kernel_size", "stride", "padding", "dilation", "ceil_mode")),
    "max_pool2d": ("pool", _call("F.max_pool2d", "kernel_size", "stride", "padding", "dilation", "ceil_mode")),
    "avg_pool1d": (
        "pool",
        _avg_pool("F.avg_pool1d", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad"),
    ),
    "avg_pool2d": (
        "pool",
        _avg_pool(
            "F.avg_pool2d", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override"
        ),
    ),
    "adaptive_avg_pool2d": ("pool", _call("F.adaptive_avg_pool2d", "output_size")),
    # resampling
    "interpolate": ("resample", lambda a, at, s: _interpolate(a, at)),
    "pixel_shuffle": ("resample", _call("F.pixel_shuffle", "upscale_factor")),
    "pixel_unshuffle": ("resample", _call("F.pixel_unshuffle", "downscale_factor")),
    # state
    "buffer_update": ("state", _state_update),
}

CONTROL_FLOW_OPS = ("cond", "map", "scan", "while_loop")

# The dtypes in which the strategies draw an (op, argument) when not every
# dtype: PyTorch has no half-precision CPU kernel for antialiased resampling.
ARGUMENT_DTYPES = {("interpolate", "antialias"): ("float32",)}

# Ops whose renderer places ``output_via_float64`` itself (before an output
# padding); any other op's result is wrapped whole.
_OWN_OUTPUT_VIA_FLOAT64 = ("layer", "conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d")


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
    if attrs.get("output_via_float64") and node["op"] not in _OWN_OUTPUT_VIA_FLOAT64:
        expression = f"_via_float64({expression})"
    if "fit_shape" in attrs:
        expression = f"_fit_shape({expression}, {tuple(attrs['fit_shape'])!r})"
    return expression
