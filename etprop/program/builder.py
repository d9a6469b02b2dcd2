"""The one builder: a spec becomes Python source, the source becomes an nn.Module.

Generating source (instead of assembling closures) gives three things from one
mechanism: the module etprop lowers, the standalone repro script (the same
source, plus lowering code), and readable counterexamples.
"""

from __future__ import annotations

import collections
import copy
import linecache
import sys
import types
from dataclasses import dataclass, field
from typing import Optional

import torch

from etprop.program import spec as specmod
from etprop.program import vocabulary

# Helpers every generated program may use. They are part of the generated
# source so that a repro script needs nothing but torch.
PRELUDE = '''\
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils import parametrizations
from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.scan import scan as hop_scan
from torch._higher_order_ops.while_loop import while_loop as hop_while_loop

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _randn(shape, seed, scale=1.0, min_abs=0.0):
    generator = torch.Generator().manual_seed(seed)
    value = torch.randn(shape, generator=generator) * scale
    return value + torch.where(value < 0, -min_abs, min_abs) if min_abs else value


def _fit_shape(x, shape):
    """``x`` written row-major into a buffer of ``shape``: cut where it is
    longer, zeros where it is shorter (a backend whose op computes another
    shape than the graph declares; mutation analysis only)."""
    flat = x.reshape(-1)
    count = torch.Size(shape).numel()
    if flat.numel() < count:
        flat = torch.cat([flat, flat.new_zeros(count - flat.numel())])
    return flat[:count].reshape(shape)


def _avg_pool_by_sums(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                      divisor_override=None):
    """F.avg_pool1d/2d with no padding and no ceil mode of its own: the input
    padded explicitly, each window averaged whole in floor mode, over the
    average of a mask counting what PyTorch's divisor counts (the implicit
    padding with ``count_include_pad``, never a ceil-mode window's overhang).
    The same values; a neutralization's equivalent form."""
    dims = x.dim() - 2

    def per_dim(value):
        return list(value) if isinstance(value, (list, tuple)) else [value] * dims

    kernel = per_dim(kernel_size)
    step = per_dim(stride) if stride not in (None, [], ()) else kernel
    pad = per_dim(padding)
    implicit, overhang = [], []
    for dim in reversed(range(dims)):
        length = x.shape[2 + dim]
        span = length + 2 * pad[dim] - kernel[dim]
        count = (-(-span // step[dim]) if ceil_mode else span // step[dim]) + 1
        if ceil_mode and (count - 1) * step[dim] >= length + pad[dim]:
            count -= 1
        implicit += [pad[dim], pad[dim]]
        overhang += [0, max(0, (count - 1) * step[dim] + kernel[dim] - length - 2 * pad[dim])]
    pool = F.avg_pool1d if dims == 1 else F.avg_pool2d
    whole = pool(F.pad(F.pad(x, implicit), overhang), kernel, step)
    if divisor_override:
        window = 1
        for k in kernel:
            window *= k
        return whole * (window / divisor_override)
    mask = F.pad(torch.ones_like(x), implicit, value=1.0 if count_include_pad else 0.0)
    return whole / pool(F.pad(mask, overhang), kernel, step)


def _nearest_by_index(x, size):
    """F.interpolate(x, size, mode='nearest') as gathers: source index
    floor(dst * in / out) per resized dim, in float32 as ATen's CPU kernel
    computes it, so the form gives F.interpolate's values (a neutralization's
    equivalent form). Not in float64: ExecuTorch lifts the scale as a float32
    constant (EXIR-008), and a 10 -> 12 resize then reads source 4 for
    output 6 where eager reads 5."""
    for offset, out in enumerate(size):
        dim = x.dim() - len(size) + offset
        count = x.shape[dim]
        index = (torch.arange(out, dtype=torch.float32) * (count / out)).floor().long().clamp(max=count - 1)
        x = x.index_select(dim, index)
    return x


def _interpolate_widened(x, **kwargs):
    """F.interpolate, but an antialiased resize that keeps a width of 1 runs on
    the input widened to 2 and is cut back: ATen's antialiased kernels repeat
    the first row there (finding TORCH-002); these are the values they give
    at any other width (a neutralization's equivalent form)."""
    plain = F.interpolate(x, **kwargs)
    if x.shape[-1] != 1 or plain.shape[-1] != 1:
        return plain
    if kwargs.get("size") is not None:
        size = kwargs["size"]
        kwargs["size"] = (size[0] if isinstance(size, (list, tuple)) else size, 2)
    else:
        scale = kwargs["scale_factor"]
        kwargs["scale_factor"] = (scale[0] if isinstance(scale, (list, tuple)) else scale, 1.0)
    return F.interpolate(x.expand(*x.shape[:-1], 2), **kwargs)[..., :1]


def _output_padded(full, padding, output_padding, bias, by_cat=False):
    """A transposed convolution from its full result (no padding, no
    output_padding, no bias): ``padding`` cropped from each end of every
    spatial dim, the end extended by ``output_padding`` (positions no input
    reaches beyond the full result are zeros), then the bias (a
    neutralization's equivalent form). ``by_cat``: the zeros concatenated,
    not padded on (XNNPACK cannot load a constant pad of a quantized tensor)."""
    dims = full.dim() - 2
    crops = [padding] * dims if isinstance(padding, int) else list(padding)
    extra = [output_padding] * dims if isinstance(output_padding, int) else list(output_padding)
    if by_cat:
        y = full
        for offset, (crop, amount) in enumerate(zip(crops, extra)):
            tail = max(0, amount - crop)
            if tail:
                shape = list(y.shape)
                shape[2 + offset] = tail
                y = torch.cat([y, y.new_zeros(shape)], 2 + offset)
    else:
        tails = []
        for crop, amount in zip(reversed(crops), reversed(extra)):
            tails += [0, max(0, amount - crop)]
        y = F.pad(full, tails)
    for offset, (crop, amount) in enumerate(zip(crops, extra)):
        y = y.narrow(2 + offset, crop, full.shape[2 + offset] - 2 * crop + amount)
    if bias is not None:
        y = y + bias.reshape([1, -1] + [1] * dims)
    return y


def _conv_transpose_output_padded(layer, x, by_cat=False, via_float64=False):
    """A ConvTranspose layer with an output_padding as its full transposed
    convolution, cropped by padding and extended by output_padding, then the
    bias; other layers as they are (a neutralization's equivalent form).
    ``via_float64``: the convolution's result cast to float64 and back."""
    if not isinstance(layer, (nn.ConvTranspose1d, nn.ConvTranspose2d)) or not any(layer.output_padding):
        return _via_float64(layer(x)) if via_float64 else layer(x)
    convolve = F.conv_transpose1d if isinstance(layer, nn.ConvTranspose1d) else F.conv_transpose2d
    full = convolve(x, layer.weight, None, layer.stride, 0, 0, layer.groups, layer.dilation)
    if via_float64:
        full = _via_float64(full)
    return _output_padded(full, list(layer.padding), list(layer.output_padding), layer.bias, by_cat)


def _conv_same_padded_explicitly_functional(x, weight, bias, dilation, groups, via_float64=False):
    """A convolution with padding 'same' (stride 1) as the zeros padded on,
    before then after (the odd one after, as PyTorch does), then the
    convolution without padding: the same values (a neutralization's
    equivalent form). ``via_float64``: the padded input read through a cast
    to float64 and back."""
    dims = weight.dim() - 2
    dilations = [dilation] * dims if isinstance(dilation, int) else list(dilation)
    pads = []
    for k, d in zip(reversed(weight.shape[2:]), reversed(dilations)):
        total = d * (k - 1)
        pads += [total // 2, total - total // 2]
    convolve = F.conv1d if dims == 1 else F.conv2d
    padded = F.pad(x, pads)
    if via_float64:
        padded = padded.to(torch.float64).to(padded.dtype)
    return convolve(padded, weight, bias, 1, 0, dilations, groups)


def _conv_same_padded_explicitly(layer, x):
    """A Conv1d or Conv2d layer with padding 'same' (zeros) in the explicit
    form above; other layers as they are."""
    if not isinstance(layer, (nn.Conv1d, nn.Conv2d)) or layer.padding != "same" or layer.padding_mode != "zeros":
        return layer(x)
    return _conv_same_padded_explicitly_functional(x, layer.weight, layer.bias, layer.dilation, layer.groups)


def _conv_circular_padded_explicitly(layer, x):
    """A Conv1d or Conv2d layer with padding_mode 'circular' as the wrapped
    slices concatenated on each side, then the convolution without padding:
    the same values with no padding op (a neutralization's equivalent form);
    other layers as they are."""
    if not isinstance(layer, (nn.Conv1d, nn.Conv2d)) or layer.padding_mode != "circular":
        return layer(x)
    pads = layer._reversed_padding_repeated_twice
    for axis, (before, after) in enumerate(zip(pads[::2], pads[1::2])):
        dim = x.dim() - 1 - axis
        size = x.shape[dim]
        x = torch.cat([x.narrow(dim, size - before, before), x, x.narrow(dim, 0, after)], dim)
    convolve = F.conv1d if isinstance(layer, nn.Conv1d) else F.conv2d
    return convolve(x, layer.weight, layer.bias, layer.stride, 0, layer.dilation, layer.groups)


def _pooled_with_batch_dim(x, output_size):
    """F.adaptive_avg_pool1d, an unbatched (C, L) input given a batch dim of
    one for the pooling (a neutralization: the same values)."""
    if x.dim() == 2:
        return F.adaptive_avg_pool1d(x.unsqueeze(0), output_size).squeeze(0)
    return F.adaptive_avg_pool1d(x, output_size)


def _index_put_summed(tensor, values, *indices):
    """``index_put(..., accumulate=True)`` written without it (a
    neutralization): integer indices as one-hot rows over the indexed dims
    times the values, a bool mask as itself times the one row of values it
    broadcasts; the same sums, in another order."""
    if indices[0].dtype == torch.bool:
        mask = indices[0].reshape(indices[0].shape + (1,) * (tensor.dim() - indices[0].dim()))
        return tensor + mask.to(values.dtype) * values[0]
    rows, flat = 1, torch.zeros_like(indices[0], dtype=torch.int64)
    for dim, index in enumerate(indices):
        flat = flat * tensor.shape[dim] + index.long()
        rows *= tensor.shape[dim]
    product = F.one_hot(flat, rows).to(values.dtype).transpose(0, 1) @ values.reshape(values.shape[0], -1)
    return (tensor.reshape(rows, -1) + product).reshape(tensor.shape)


def _via_float64(y):
    """``y`` cast to float64 and back: the same values, through a cast no
    delegate takes, so no delegate fuses the op before it with a quantization
    after it (a neutralization's equivalent form)."""
    return y.to(torch.float64).to(y.dtype)


def _norm_two_pass(norm, x, kinds, batch_norm_by_hand=False):
    """A GroupNorm or LayerNorm layer (of the kinds named) with its variance
    taken about the mean (two passes, as eager computes it); a batch norm by
    hand when asked; other layers as they are (neutralizations' equivalent forms)."""
    if isinstance(norm, nn.GroupNorm) and "GroupNorm" in kinds:
        return _group_norm_two_pass(norm, x)
    if not (isinstance(norm, nn.LayerNorm) and "LayerNorm" in kinds):
        return _batch_norm_by_hand(norm, x) if batch_norm_by_hand else norm(x)
    dims = tuple(range(-len(norm.normalized_shape), 0))
    work = _at_least_float32(x)
    centered = work - work.mean(dims, keepdim=True)
    var = (centered * centered).mean(dims, keepdim=True)
    y = centered / torch.sqrt(var + norm.eps)
    if norm.weight is not None:
        y = y * norm.weight
    if norm.bias is not None:
        y = y + norm.bias
    return y.to(x.dtype)


def _at_least_float32(x):
    """``x`` in float32 when it is in half precision: eager computes a norm's
    statistics and output in float32 and rounds once, and a square of a
    centered half-precision value past 256 would overflow where eager does not."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _batch_norm_by_hand(norm, x):
    """An inference batch norm written out as arithmetic on its running
    statistics, so no rewrite fuses it into the convolution before it (a
    neutralization's equivalent form); other layers, and a batch norm in
    training, as they are."""
    if not isinstance(norm, nn.modules.batchnorm._BatchNorm) or norm.training or norm.running_mean is None:
        return norm(x)
    shape = [1, -1] + [1] * (x.dim() - 2)
    y = (x - norm.running_mean.reshape(shape)) / torch.sqrt(norm.running_var.reshape(shape) + norm.eps)
    if norm.affine:
        y = y * norm.weight.reshape(shape) + norm.bias.reshape(shape)
    return y


def _group_norm_two_pass(norm, x):
    """A GroupNorm layer with its variance taken about the group mean (two
    passes, as eager computes it); other layers as they are (a neutralization's
    equivalent form)."""
    if not isinstance(norm, nn.GroupNorm):
        return norm(x)
    grouped = _at_least_float32(x).reshape(x.shape[0], norm.num_groups, -1)
    centered = grouped - grouped.mean(-1, keepdim=True)
    var = (centered * centered).mean(-1, keepdim=True)
    y = (centered / torch.sqrt(var + norm.eps)).reshape(x.shape)
    if norm.affine:
        shape = [1, -1] + [1] * (x.dim() - 2)
        y = y * norm.weight.reshape(shape) + norm.bias.reshape(shape)
    return y.to(x.dtype)


def _reinit(module, seed):
    """Seeded values for every parameter and buffer, independent of global RNG."""
    generator = torch.Generator().manual_seed(seed)
    is_norm = isinstance(module, (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d))
    with torch.no_grad():
        weight = getattr(module, "weight", None)
        fan_in = weight[0].numel() if weight is not None and weight.dim() > 1 else 1
        for name, tensor in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            if name == "num_batches_tracked":
                continue
            noise = torch.randn(tensor.shape, generator=generator)
            if name == "running_var":
                tensor.copy_(0.5 + noise.abs())
            elif is_norm and name == "weight":
                tensor.copy_(1.0 + 0.1 * noise)
            elif is_norm:
                tensor.copy_(0.1 * noise)
            else:
                tensor.copy_(noise / fan_in ** 0.5)


class _Weight(nn.Module):
    """Holds one parameter, so parametrizations can compute it."""

    def __init__(self, shape, seed, scale):
        super().__init__()
        self.weight = nn.Parameter(_randn(shape, seed, scale))


class _Scale(nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def forward(self, value):
        return value * self.factor


class _AddDelta(nn.Module):
    """Sum of two parameters."""

    def __init__(self, shape, seed):
        super().__init__()
        self.delta = nn.Parameter(_randn(shape, seed, 0.05))

    def forward(self, value):
        return value + self.delta


class _BufferScale(nn.Module):
    """A buffer as one source of the computed weight. ``factor``: the buffer
    stored already multiplied by the scales of its run of multiplications (a
    neutralization's equivalent form: exact for ±powers of two)."""

    def __init__(self, shape, seed, factor=1.0):
        super().__init__()
        self.register_buffer("gain", (0.5 + _randn(shape, seed).abs()) * factor)

    def forward(self, value):
        return value * self.gain


class _LowRank(nn.Module):
    """weight = A @ B, stored as the two factors (a low-rank product)."""

    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def forward(self, left, right):
        return left @ right

    def right_inverse(self, value):
        u, s, vh = torch.linalg.svd(value, full_matrices=False)
        return u[:, : self.rank] * s[: self.rank], vh[: self.rank].contiguous()


class _Transpose(nn.Module):
    def forward(self, value):
        return value.t()

    def right_inverse(self, value):
        return value.t().contiguous()


class _Reshape(nn.Module):
    """A weight stored flat. ``clone_first`` computes the same value from a
    copy of the parameter (an equivalent form that is not a view of it)."""

    def __init__(self, shape, clone_first=False):
        super().__init__()
        self.shape = tuple(shape)
        self.clone_first = clone_first

    def forward(self, value):
        return (value.clone() if self.clone_first else value).reshape(self.shape)

    def right_inverse(self, value):
        return value.reshape(-1)


def _parametrize(module, name, kind, **attrs):
    shape = tuple(getattr(module, name).shape)
    if kind == "weight_norm":
        parametrizations.weight_norm(module, name, dim=attrs.get("dim", 0))
    elif kind == "spectral_norm":
        # spectral_norm draws its power-iteration vectors from the global RNG.
        with torch.random.fork_rng():
            torch.manual_seed(attrs.get("n_power_iterations", 1))
            parametrizations.spectral_norm(module, name, n_power_iterations=attrs.get("n_power_iterations", 1),
                                           dim=attrs.get("dim"))
        if attrs.get("vectors_as_parameters"):
            # The power-iteration vectors held as (frozen) parameters, not
            # buffers: the same values (a neutralization's equivalent form).
            norm = module.parametrizations[name][-1]
            for vector in ("_u", "_v"):
                value = getattr(norm, vector)
                delattr(norm, vector)
                norm.register_parameter(vector, nn.Parameter(value, requires_grad=False))
    elif kind == "scale":
        parametrize.register_parametrization(module, name, _Scale(attrs["factor"]))
    elif kind == "add_delta":
        parametrize.register_parametrization(module, name, _AddDelta(shape, attrs["seed"]))
    elif kind == "buffer_scale":
        parametrize.register_parametrization(module, name, _BufferScale(shape, attrs["seed"], attrs.get("factor", 1.0)))
    elif kind == "low_rank":
        parametrize.register_parametrization(module, name, _LowRank(attrs["rank"]), unsafe=True)
    elif kind == "transpose":
        parametrize.register_parametrization(module, name, _Transpose(), unsafe=True)
    elif kind == "reshape":
        parametrize.register_parametrization(module, name, _Reshape(shape, attrs.get("clone_first", False)),
                                             unsafe=True)
    else:
        raise ValueError(f"unknown parametrization {kind!r}")




INTEGER_DTYPES = {"int64": torch.int64, "int32": torch.int32, "bool": torch.bool}


def make_input(shape, dtype, kind, seed, high=None):
    """Deterministic test inputs: random normal plus edge values. Integer
    inputs (ids, indices) are uniform in [0, high), at the edges all 0
    (zeros) or all high - 1 (large); a bool mask is random, all False
    (zeros) or all True (large)."""
    generator = torch.Generator().manual_seed(seed)
    if dtype in INTEGER_DTYPES:
        top = 2 if dtype == "bool" else high
        if kind == "zeros":
            value = torch.zeros(shape, dtype=torch.int64)
        elif kind == "large":
            value = torch.full(shape, top - 1, dtype=torch.int64)
        else:
            value = torch.randint(0, top, shape, generator=generator)
        return value.to(INTEGER_DTYPES[dtype])
    value = torch.randn(shape, generator=generator)
    if kind == "negative":
        value = -3.0 * value.abs()
    elif kind == "zeros":
        value = torch.zeros(shape)
    elif kind == "large":
        value = 1e3 * value
    elif kind == "small":
        value = 1e-3 * value
    return value.to(DTYPES[dtype])
'''


# Appended to the prelude of the jittered variant only (see ``render_source``):
# eager stand-ins for the control-flow operators, which in eager compile their
# bodies with dynamo (and could not run ``_jitter``'s random draws), and the
# jitter every node's value goes through.
JITTER_PRELUDE = '''

_JITTER = {"mode": None, "generator": None, "ulps": {}}


def _jitter(value, op=None, magnitude=None):
    """``value`` moved by u*eps*(ulps*|value| + magnitude) in its own dtype (a subnormal by u*tiny),
    u being +1 ("up"), -1 ("down") or drawn from {-1, 0, 1} per element
    ("random"). ``ulps`` is the op's error budget (1 unless the caller sets
    one); ``magnitude``, for a sum of terms, gives the same sum of the terms'
    absolute values: the scale of its rounding error in any summation order,
    float32 eps times the budget ``ulps["sums"]``."""
    mode = _JITTER["mode"]
    if mode is None or not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return value
    wide, ulps = value.double(), _JITTER["ulps"]
    info = torch.finfo(value.dtype)
    eps = info.eps
    # A subnormal may become 0 in a backend that flushes them (XNNPACK gave 0
    # for a float16 softmax that eager kept at 6e-8, so ceil gave 0, not 1):
    # subnormals move by the smallest normal.
    subnormal = (wide != 0) & (wide.abs() < info.tiny)
    scale = ulps.get(op, 1.0) * wide.abs() + torch.where(subnormal, info.tiny / eps, 0.0)
    terms = magnitude() if magnitude is not None else None
    if terms is not None:
        # Sums accumulate in float32 (ATen and the backends, half types included).
        accumulated = torch.finfo(torch.float32).eps * ulps.get("sums", 1.0) / eps
        scale = scale + accumulated * terms.double().abs().clamp_max(torch.finfo(value.dtype).max)
    return (wide + _signs(value.shape) * eps * scale).to(value.dtype)


def _any_extreme(value, dim, keepdim, largest):
    """argmax (``largest``) or argmin where a jittered run picks at random
    among equal extremes: eager's pick among ties is not the only right one
    (a backend may take the last), and exact ties (zeros, a relu's floor)
    are what no jitter of the values separates."""
    extreme = value.amax(dim, keepdim=True) if largest else value.amin(dim, keepdim=True)
    ties = value == extreme
    if _JITTER["mode"] is None or not bool((ties.sum(dim) > 1).any()):
        return value.argmax(dim, keepdim=keepdim) if largest else value.argmin(dim, keepdim=keepdim)
    scores = torch.rand(value.shape, generator=_JITTER["generator"], dtype=torch.float64)
    return torch.where(ties, scores + 1, scores.new_zeros(())).argmax(dim, keepdim=keepdim)


def _abs_value(value):
    """|value| for a float operand of a sum; an index or mask stays itself."""
    return value.abs() if value.is_floating_point() else value


def _var_terms(value, dim, keepdim):
    """The rounding scale of a variance: mean of squares, times sqrt(n) for
    a long sequential sum."""
    squares = value.double() ** 2
    reduced = squares.mean(dim=dim, keepdim=keepdim) if dim is not None else squares.mean()
    return reduced * (value.numel() / max(reduced.numel(), 1)) ** 0.5


def _magnitude(module, value):
    """Linear and convolution layers applied to |input| with |weights|; a
    normalization's result times the roundings after its statistics (centre,
    scale, affine: 4)."""
    if isinstance(module, (nn.GroupNorm, nn.LayerNorm)):
        return 4 * _layer(module, value).abs()
    if getattr(module, "weight", None) is None:
        return None
    weight = module.weight.abs()
    bias = None if module.bias is None else module.bias.abs()
    if isinstance(module, nn.Linear):
        return F.linear(value.abs(), weight, bias)
    if isinstance(module, (nn.Conv1d, nn.Conv2d)):
        return module._conv_forward(value.abs(), weight, bias)
    if isinstance(module, (nn.ConvTranspose1d, nn.ConvTranspose2d)):
        fn = F.conv_transpose1d if isinstance(module, nn.ConvTranspose1d) else F.conv_transpose2d
        return fn(value.abs(), weight, bias, module.stride, module.padding, module.output_padding,
                  module.groups, module.dilation)
    return None


def _signs(shape):
    """u per element: {-1, 0, 1} at random; +-``ulps["directional"]`` for
    every element ("up", "down") or with a random sign per element
    ("scattered")."""
    mode = _JITTER["mode"]
    if mode == "random":
        return torch.randint(-1, 2, shape, generator=_JITTER["generator"]).double()
    amplitude = _JITTER["ulps"].get("directional", 1.0)
    if mode == "scattered":
        return amplitude * (2 * torch.randint(0, 2, shape, generator=_JITTER["generator"]).double() - 1)
    return torch.full(shape, amplitude if mode == "up" else -amplitude, dtype=torch.float64)


def _eager_cond(operand, threshold, true_fn, false_fn, operands):
    """torch.cond on ``operand.mean() > threshold``. A mean within the
    summation error bound (eps * sum|x|) of the threshold is a tie another
    summation order may break either way: the up run takes the true branch,
    the down run the false one."""
    pred = bool(operand.mean() > threshold)
    mean = float(operand.mean())
    margin = (_JITTER["ulps"].get("directional", 1.0) * torch.finfo(operand.dtype).eps
              * float(operand.double().abs().sum()))
    if _JITTER["mode"] in ("up", "down") and abs(mean - threshold) <= margin:
        pred = _JITTER["mode"] == "up"
    return (true_fn if pred else false_fn)(*operands)


def _layer(module, value):
    """A layer; GroupNorm and LayerNorm with their mean and variance moved by
    their rounding error in a one-pass computation over n terms (E[x^2] -
    E[x]^2, as backends do), sqrt(n) * eps * E[x^2] for the variance: for a
    nearly constant input far more than eps * var."""
    if _JITTER["mode"] is None or not isinstance(module, (nn.GroupNorm, nn.LayerNorm)):
        return module(value)
    groups = module.num_groups if isinstance(module, nn.GroupNorm) else None
    dims = None if groups is not None else len(module.normalized_shape)
    from etprop.program.builder import normalized_with_moved_statistics

    return normalized_with_moved_statistics(value, groups, dims, module.weight, module.bias, module.eps, _signs)


def hop_map(body, xs, *args):
    results = [body(x, *args) for x in xs.unbind(0)]
    return tuple(torch.stack(parts) for parts in zip(*results))


def hop_scan(combine, init, xs):
    carry, ys = init, []
    for x in xs.unbind(0):
        carry, y = combine(carry, x)
        ys.append(y)
    return carry, torch.stack(ys)


def hop_while_loop(cond, body, carried):
    while cond(*carried):
        carried = body(*carried)
    return carried


# Both directions for every value; then the directional amplitude with a
# random sign per element, so that each value near a rounding op's boundary
# crosses it in some run without most of its neighbours (all of them crossing
# at once can cancel downstream: docs/tolerance.md); then two patterns of
# random u in {-1, 0, 1}. The first DIRECTIONAL_RUNS runs move values by the
# full directional amplitude (oracles/tolerance.py counts them as they are).
SCATTERED_RUNS = 8
JITTER_RUNS = ((("up", 0), ("down", 0)) + tuple(("scattered", 100 + seed) for seed in range(SCATTERED_RUNS))
               + (("random", 1), ("random", 2)))
DIRECTIONAL_RUNS = 2 + SCATTERED_RUNS


def _jittered_runs(module, state, method, inputs, ulps=None, constants=None, carried=None, sequence=False):
    """The outputs of ``method`` once per jitter run, and within a
    ``sequence`` of calls the state each run ends with (else None). Each run
    starts from ``state`` (a state dict) jittered, or from the state that run
    ended the previous call with (``carried``, one per run: a lowering's state
    carries its own differences from call to call); ``constants`` (plain
    tensor attributes) and ``inputs`` are jittered too; ``ulps`` maps ops to
    their error budget in units of eps (default 1)."""
    runs, ends = [], []
    for index, (mode, seed) in enumerate(JITTER_RUNS):
        _JITTER.update(mode=mode, generator=torch.Generator().manual_seed(seed), ulps=ulps or {})
        try:
            with torch.no_grad():
                start = carried[index] if carried else {key: _jitter(value) for key, value in state.items()}
                module.load_state_dict(start)
                for name, value in (constants or {}).items():
                    setattr(module, name, _jitter(value))
                runs.append([t.clone() for t in getattr(module, method)(*(_jitter(x) for x in inputs))])
                if sequence:
                    ends.append({key: value.clone() for key, value in module.state_dict().items()})
        finally:
            _JITTER.update(mode=None, generator=None, ulps={})
    return runs, ends if sequence else None
'''


def normalized_with_moved_statistics(value, groups, normalized_dims, weight, bias, eps, signs):
    """GroupNorm (``groups``) or LayerNorm (over the last ``normalized_dims``
    dims) of ``value`` with its mean and variance moved by ``signs(shape)``
    times their rounding error in a one-pass computation: the jittered
    programs' ``_layer``, and the quantized perturbation's float
    normalizations (quantize._Perturbed), share this one model."""
    wide = value.double()
    if groups is not None:
        grouped, dims = wide.reshape(wide.shape[0], groups, -1), (-1,)
    else:
        grouped, dims = wide, tuple(range(-normalized_dims, 0))
    mean = grouped.mean(dims, keepdim=True)
    # A sequential sum of n terms is off by about sqrt(n) roundings of their
    # magnitude (as in _var_terms): a kernel that sums a constant group of 80
    # values in order was 8 ulps off its mean, enough to move a normalized
    # near-zero result by 6e-5; a one-pass variance (E[x^2] - E[x]^2) of 42
    # values near 0.69 moved GroupNorm's output by 1 % where var << eps.
    count = grouped.numel() / max(mean.numel(), 1)
    mean = mean + (
        signs(mean.shape) * torch.finfo(value.dtype).eps * count**0.5 * grouped.abs().mean(dims, keepdim=True)
    )
    square = (grouped * grouped).mean(dims, keepdim=True)
    var = grouped.var(dims, correction=0, keepdim=True)
    var = (var + signs(var.shape) * torch.finfo(value.dtype).eps * count**0.5 * square).clamp_min(0)
    result = ((grouped - mean) / torch.sqrt(var + eps)).reshape(wide.shape)
    if weight is not None:
        shape = (1, -1) + (1,) * (wide.dim() - 2) if groups is not None else weight.shape
        result = result * weight.double().reshape(shape)
    if bias is not None:
        shape = (1, -1) + (1,) * (wide.dim() - 2) if groups is not None else bias.shape
        result = result + bias.double().reshape(shape)
    return result.to(value.dtype)


# Input kinds make_input understands; the equivalence oracle runs each of these.
INPUT_KINDS_DEFAULT = ("normal", "negative", "zeros", "large", "small")


def _dtype_expr(dtype: str) -> str:
    return f"DTYPES[{dtype!r}]"


def _state_lines(name: str, entry: dict, program_dtype: str = "float32") -> list[str]:
    kind = entry["kind"]
    lines: list[str] = []
    # The program dtype reaches parameters and buffers through one final
    # ``self.to``; a plain tensor attribute (a constant) must be cast here.
    dtype = entry.get("dtype", program_dtype if kind == "constant" else "float32")
    if kind == "layer":
        kwargs = ", ".join(f"{k}={v!r}" for k, v in entry["kwargs"].items())
        lines.append(f"self.{name} = nn.{entry['type']}({kwargs})")
        lines.append(f"_reinit(self.{name}, {entry['seed']!r})")
        if dtype != "float32":
            lines.append(f"self.{name}.to({_dtype_expr(dtype)})")
    elif kind == "weight":
        lines.append(
            f"self.{name} = _Weight({tuple(entry['shape'])!r}, {entry['seed']!r}, {entry.get('scale', 1.0)!r})"
        )
        if dtype != "float32":
            lines.append(f"self.{name}.to({_dtype_expr(dtype)})")
    else:
        value = f"_randn({tuple(entry['shape'])!r}, {entry['seed']!r}, {entry.get('scale', 1.0)!r}" + (
            f", min_abs={entry['min_abs']!r})" if entry.get("min_abs") else ")"
        )
        if dtype != "float32":
            value += f".to({_dtype_expr(dtype)})"
        if kind == "parameter":
            lines.append(f"self.{name} = nn.Parameter({value})")
        elif kind == "buffer":
            lines.append(f"self.register_buffer({name!r}, {value})")
        else:
            lines.append(f"self.{name} = {value}")
    for p in entry.get("parametrizations", []):
        attrs = {k: v for k, v in p.items() if k not in ("type", "on")}
        extra = "".join(f", {k}={v!r}" for k, v in attrs.items())
        lines.append(f"_parametrize(self.{name}, {p.get('on', 'weight')!r}, {p['type']!r}{extra})")
    if entry.get("frozen"):
        lines.append(f"self.{name}.requires_grad_(False)")
    if entry.get("batch_counter_int32"):
        # Only training reads a batch norm's counter: eval computes the same from an int32 one.
        lines.append(f"self.{name}.num_batches_tracked = self.{name}.num_batches_tracked.int()")
    return lines


def _body_lines(nodes: list[dict], indent: str, jitter: bool = False) -> list[str]:
    lines: list[str] = []
    for node in nodes:
        if node["op"] in vocabulary.CONTROL_FLOW_OPS:
            lines += _control_flow_lines(node, indent, jitter)
        else:
            expression = vocabulary.render(node, node.get("args", []))
            if jitter:
                expression = _jittered_expression(node, expression)
            lines.append(f"{indent}{node['id']} = {expression}")
    return lines


# The rounding classes of the op table (vocabulary.Op.rounding).
_SUMS = tuple(name for name, op in vocabulary.OP_TABLE.items() if op.rounding == "sums")
_TERMS = {name: op.terms for name, op in vocabulary.OP_TABLE.items() if op.terms is not None}
_EXACT = tuple(name for name, op in vocabulary.OP_TABLE.items() if op.rounding == "exact")


def _jittered_expression(node: dict, expression: str) -> str:
    """The node's expression with its rounding error widened. A fitted node
    (``fit_shape``) is jittered in the shape its op computes and then fitted,
    as the plain build fits it."""
    op, args, attrs = node["op"], node.get("args", []), node.get("attrs", {})
    if "fit_shape" in attrs:
        unfitted = {**node, "attrs": {k: v for k, v in attrs.items() if k != "fit_shape"}}
        inner = _jittered_expression(unfitted, vocabulary.render(unfitted, args))
        return f"_fit_shape({inner}, {tuple(attrs['fit_shape'])!r})"
    if op in ("argmax", "argmin"):
        keepdim = attrs.get("keepdim", False)
        return f"_any_extreme({args[0]}, {attrs['dim']!r}, {keepdim!r}, {op == 'argmax'!r})"
    if (
        op in _EXACT
        or (op == "buffer_update" and attrs.get("how") == "copy")
        or (op == "interpolate" and attrs.get("mode", "nearest") == "nearest")
    ):
        return expression
    if op == "buffer_update" and attrs.get("in_place", True):
        # The buffer keeps the jittered value: a sequence of calls carries it.
        return f"self.{node['state']}.copy_(_jitter({expression}, {op!r}))"
    if op in _TERMS:
        return f"_jitter({expression}, {op!r}, lambda: {_TERMS[op](args, node.get('attrs', {}))})"
    if op == "layer":
        state = node["state"]
        return f"_jitter(_layer(self.{state}, {args[0]}), 'layer', lambda: _magnitude(self.{state}, {args[0]}))"
    if op in _SUMS:
        absolute = vocabulary.render(node, [f"_abs_value({a})" for a in args]).replace("torch.sub(", "torch.add(")
        for name in specmod.state_refs(node):
            absolute = absolute.replace(f"self.{name}.weight", f"self.{name}.weight.abs()")
            absolute = absolute.replace(f"self.{name},", f"self.{name}.abs(),").replace(
                f"self.{name})", f"self.{name}.abs())"
            )
        return f"_jitter({expression}, {op!r}, lambda: {absolute})"
    return f"_jitter({expression}, {op!r})"


def _function_lines(
    fn_name: str,
    params: list[str],
    body: dict,
    indent: str,
    returns: Optional[str] = None,
    jitter: bool = False,
    copy_inputs: bool = False,
) -> list[str]:
    """A body function; ``copy_inputs`` starts it from copies of its inputs
    (the same values, none of them a view of what the loop passes in: a
    neutralization, see neutralize.py)."""
    lines = [f"{indent}def {fn_name}({', '.join(params)}):"]
    lines += [f"{indent}    {param} = {param}.clone()" for param in params if copy_inputs]
    lines += _body_lines(body["nodes"], indent + "    ", jitter)
    result = returns or ", ".join(body["outputs"]) + ","
    lines.append(f"{indent}    return ({result})")
    return lines


def _control_flow_lines(node: dict, indent: str, jitter: bool = False) -> list[str]:
    op, nid, args, attrs = node["op"], node["id"], node["args"], node.get("attrs", {})
    bodies = node["bodies"]
    # ``inline``: the equivalent straight-line form (a neutralization, see neutralize.py).
    inline = attrs.get("inline", False)
    lines: list[str] = []
    if op == "cond":
        for index, body in enumerate(bodies):
            lines += _function_lines(f"_{nid}_branch{index}", body["params"], body, indent, jitter=jitter)
        threshold = attrs.get("threshold", 0.0)
        # ``predicate_keepdim``: the mean kept as a one-element tensor of the
        # operand's rank, never a 0-dim one (a neutralization).
        mean = (
            f"{args[0]}.mean(tuple(range({args[0]}.dim())), keepdim=True)"
            if attrs.get("predicate_keepdim")
            else f"{args[0]}.mean()"
        )
        pred = f"{args[0]}, {threshold!r}" if jitter else f"{mean} > {threshold!r}"
        operands = ", ".join(args[1:]) + ","
        if jitter:
            lines.append(f"{indent}{nid} = _eager_cond({pred}, _{nid}_branch0, _{nid}_branch1, ({operands}))[0]")
        elif inline:
            pred = f"({pred}).reshape(())" if attrs.get("predicate_keepdim") else pred
            lines.append(
                f"{indent}{nid} = torch.where({pred}, _{nid}_branch0({operands})[0], _{nid}_branch1({operands})[0])"
            )
        else:
            lines.append(f"{indent}{nid} = torch.cond({pred}, _{nid}_branch0, _{nid}_branch1, ({operands}))[0]")
    elif op == "map":
        lines += _function_lines(
            f"_{nid}_body",
            bodies[0]["params"],
            bodies[0],
            indent,
            jitter=jitter,
            copy_inputs=attrs.get("copy_inputs", False),
        )
        if inline:
            rest = "".join(f", {a}" for a in args[1:])
            lines.append(
                f"{indent}{nid} = torch.stack([_{nid}_body(_{nid}_x{rest})[0] for _{nid}_x in {args[0]}.unbind(0)])"
            )
        else:
            lines.append(f"{indent}{nid} = hop_map(_{nid}_body, {', '.join(args)})[0]")
    elif op == "scan":
        body = bodies[0]
        lines += _function_lines(
            f"_{nid}_combine",
            body["params"],
            body,
            indent,
            returns=f"{body['outputs'][0]}, {body['outputs'][-1]}.clone()",
            jitter=jitter,
            copy_inputs=attrs.get("copy_inputs", False),
        )
        if inline:
            lines += [
                f"{indent}_{nid}_carry, _{nid}_ys = {args[0]}, []",
                f"{indent}for _{nid}_x in {args[1]}.unbind(0):",
                f"{indent}    _{nid}_carry, _{nid}_y = _{nid}_combine(_{nid}_carry, _{nid}_x)",
                f"{indent}    _{nid}_ys.append(_{nid}_y)",
                f"{indent}{nid} = (_{nid}_carry, torch.stack(_{nid}_ys))[{attrs.get('select', 1)!r}]",
            ]
        else:
            lines.append(f"{indent}{nid} = hop_scan(_{nid}_combine, {args[0]}, {args[1]})[{attrs.get('select', 1)!r}]")
    elif op == "while_loop":
        body = bodies[0]
        (param,) = body["params"]
        lines.append(f"{indent}def _{nid}_cond(step, {param}):")
        lines.append(f"{indent}    return step < {attrs['iterations']!r}")
        lines.append(f"{indent}def _{nid}_body(step, {param}):")
        lines += _body_lines(body["nodes"], indent + "    ", jitter)
        lines.append(f"{indent}    return (step + 1, {body['outputs'][0]}.clone())")
        start = f"(torch.zeros((), dtype=torch.int64), {args[0]})"
        if inline:
            lines += [
                f"{indent}_{nid}_state = {start}",
                f"{indent}for _ in range({attrs['iterations']!r}):",
                f"{indent}    _{nid}_state = _{nid}_body(*_{nid}_state)",
                f"{indent}{nid} = _{nid}_state[1]",
            ]
        else:
            lines.append(f"{indent}{nid} = hop_while_loop(_{nid}_cond, _{nid}_body, {start})[1]")
    return lines


def render_source(spec: dict, jitter: bool = False) -> str:
    """The program's Python source: prelude, one Program class, its inputs.

    ``jitter`` renders the variant the equivalence oracle measures sensitivity
    with: the same program and weights, every node's value passed through
    ``_jitter`` and control flow run as plain Python. What is exported and
    what a repro shows is always the plain rendering."""
    from etprop.program.quantize import QUANTIZE_SOURCE

    prelude = PRELUDE + (QUANTIZE_SOURCE if spec.get("quantization") and not jitter else "")
    lines = [
        prelude + (JITTER_PRELUDE if jitter else ""),
        "",
        "class Program(nn.Module):",
        "    def __init__(self):",
        "        super().__init__()",
    ]
    program_dtype = spec.get("dtype", "float32")
    for name, entry in spec["state"].items():
        lines += ["        " + line for line in _state_lines(name, entry, program_dtype)]
    if program_dtype != "float32":
        # Parametrization helpers hold their own tensors (deltas, scales).
        lines.append(f"        self.to({_dtype_expr(program_dtype)})")
    for method, body in spec["methods"].items():
        params = ["self"] + [inp["name"] for inp in body["inputs"]]
        lines.append("")
        lines += _function_lines(method, params, body, "    ", jitter=jitter)
    lines += ["", "", "INPUTS = " + repr({m: body["inputs"] for m, body in spec["methods"].items()}), ""]
    return "\n".join(lines)


@dataclass
class Reference:
    """What one call of a method gives eagerly: the outputs to compare with
    (``expected``), a float64 run (``wide``) and the outputs of each jittered
    run (``jittered``), in which every input, parameter, buffer and node value
    was moved by about one unit in the last place."""

    expected: list
    wide: list
    jittered: list = field(default_factory=list)
    # How many of the first jittered runs moved values by the directional
    # amplitude (oracles/tolerance.py): the others are scaled by SPREAD_FACTOR.
    directional: int = 2
    # Quantized programs: runs with every quantization's input moved by a
    # whole step (oracles/tolerance.py, QUANTIZED_FLIP_SHARE).
    flips: list = field(default_factory=list)


@dataclass
class BuiltProgram:
    spec: dict
    source: str
    module: torch.nn.Module
    namespace: dict = field(repr=False)
    _double: Optional[torch.nn.Module] = field(default=None, repr=False)
    _initial: Optional[dict] = field(default=None, repr=False)
    _initial_double: Optional[dict] = field(default=None, repr=False)
    _jittered: Optional[tuple] = field(default=None, repr=False)
    # Within a sequence of calls: the state each jittered run ended the last call with.
    _jittered_states: Optional[list] = field(default=None, repr=False)

    def __post_init__(self):
        self._initial = {k: v.clone() for k, v in self.module.state_dict().items()}

    @property
    def methods(self) -> list[str]:
        return list(self.spec["methods"])

    def inputs(self, method: str, kind: str = "normal", seed: int = 0, extent: str = "") -> tuple:
        """Inputs of ``kind``; ``extent`` "min"/"max" puts every dynamic dim
        at its bound instead of the spec's example size."""
        make = self.namespace["make_input"]
        return tuple(
            make(self._shape(inp, extent), inp.get("dtype", "float32"), kind, seed * 7919 + index, inp.get("high"))
            for index, inp in enumerate(self.spec["methods"][method]["inputs"])
        )

    @staticmethod
    def _shape(inp: dict, extent: str) -> tuple:
        shape = list(inp["shape"])
        for dim, low, high in inp.get("dynamic", []) if extent else ():
            shape[dim] = low if extent == "min" else high
        return tuple(shape)

    def input_cases(self, method: str, kinds=None):
        """(label, inputs) for every input kind at the spec's shapes, plus
        normal inputs at the smallest and largest dynamic sizes."""
        for kind in kinds or INPUT_KINDS_DEFAULT:
            yield kind, self.inputs(method, kind)
        if any(inp.get("dynamic") for inp in self.spec["methods"][method]["inputs"]):
            for extent in ("min", "max"):
                yield f"normal at the {extent} dynamic sizes", self.inputs(method, "normal", extent=extent)

    def method_module(self, method: str) -> torch.nn.Module:
        """A module whose forward is ``method``; parameters keep their names, so
        methods exported separately still share weights by name."""
        return _MethodView(self.module, method)

    def dynamic_shapes(self, method: str):
        inputs = self.spec["methods"][method]["inputs"]
        if not any(inp.get("dynamic") for inp in inputs):
            return None
        specs = []
        for inp in inputs:
            dims = {}
            for dim, low, high in inp.get("dynamic", []):
                dims[dim] = torch.export.Dim(f"{inp['name']}_d{dim}", min=low, max=high)
            specs.append(dims or None)
        # method_module's forward takes ``*args``: one parameter holding the tuple.
        return (tuple(specs),)

    @property
    def stateful(self) -> bool:
        """Whether a method mutates a buffer (its outputs depend on earlier calls)."""
        return any(e["kind"] == "buffer" and e.get("mutable") for e in self.spec["state"].values())

    def reset_state(self) -> None:
        """Back to the initial buffer values, in the float32 and float64 copies
        (the jittered runs start again from them too)."""
        self._jittered_states = None
        for module, saved in ((self.module, self._initial), (self._double, self._initial_double)):
            if module is not None and saved is not None:
                module.load_state_dict(saved)

    def reference(self, method: str, inputs: tuple, restore: bool = True, ulps: Optional[dict] = None) -> Reference:
        """Eager outputs with what the equivalence oracle bounds them by: a
        float64 run (rounding error) and jittered runs (how far one ulp of
        rounding anywhere moves each output: conditioning, and jumps of
        rounding ops and branches). ``restore`` as for ``eager``; the float64
        copy keeps its own sequence, the jittered runs start each call from
        the state eager started from, or within a sequence (``restore``
        False) each from the state it ended the previous call with, so that
        what the state carries from earlier calls is within the bound.
        ``ulps``: error budgets per op (see ``_jitter`` in JITTER_PRELUDE)."""
        state = self.module.state_dict()
        state = {k: v.clone() for k, v in state.items()}
        expected = self.eager(method, inputs, restore)
        if self._jittered is None:
            namespace: dict = {}
            exec(compile(render_source(self.spec, jitter=True), "<etprop jittered program>", "exec"), namespace)
            self._jittered = (namespace["Program"]().eval(), namespace["_jittered_runs"], namespace["DIRECTIONAL_RUNS"])
        module, runs, directional = self._jittered
        jittered, self._jittered_states = runs(
            module,
            state,
            method,
            inputs,
            ulps,
            self.constants(),
            None if restore else self._jittered_states,
            sequence=not restore,
        )
        return Reference(expected, self._wide(method, inputs, restore), jittered, directional)

    def constants(self) -> dict:
        return tensor_constants(self.spec, self.module)

    def _wide(self, method: str, inputs: tuple, restore: bool) -> list:
        if self._double is None:
            self._double = copy.deepcopy(self.module).double()
            self._initial_double = {k: v.clone() for k, v in self._double.state_dict().items()}
        wide = tuple(x.double() if x.is_floating_point() else x for x in inputs)
        try:
            with torch.no_grad():
                return [t.clone() for t in getattr(self._double, method)(*wide)]
        finally:
            if restore:
                self._double.load_state_dict(self._initial_double)

    def eager(self, method: str, inputs: tuple, restore: bool = True) -> list[torch.Tensor]:
        """Eager reference outputs. Mutated buffers go back to their initial
        values afterwards unless ``restore`` is False (a sequence of calls)."""
        try:
            with torch.no_grad():
                return [t.clone() for t in getattr(self.module, method)(*inputs)]
        finally:
            if restore:
                self.module.load_state_dict(self._initial)


def tensor_constants(spec: dict, module: torch.nn.Module) -> dict:
    """The module's plain tensor attributes (spec entries of kind "constant")."""
    return {name: getattr(module, name) for name, entry in spec["state"].items() if entry["kind"] == "constant"}


@dataclass
class QuantizedProgram(BuiltProgram):
    """A quantized spec's program: ``module`` is the float program, ``converted``
    each method after PT2E quantization (etprop/program/quantize.py). What is
    exported and lowered, and the eager reference, is the converted program."""

    converted: dict = field(default_factory=dict, repr=False)

    def method_module(self, method: str) -> torch.nn.Module:
        return _MethodView(self.converted[method], "forward")

    def eager(self, method: str, inputs: tuple, restore: bool = True) -> list[torch.Tensor]:
        with torch.no_grad():
            return [t.clone() for t in self.converted[method](*inputs)]

    def reference(self, method: str, inputs: tuple, restore: bool = True, ulps: Optional[dict] = None) -> Reference:
        """The converted program's outputs, bounded by its perturbed runs
        (quantize.perturbed_runs; budgets from ``ulps``, oracles/tolerance.py):
        a quantized lowering is judged against its Q/DQ program."""
        from etprop.program.quantize import flip_runs, perturbed_runs

        expected = self.eager(method, inputs)
        dynamic = self.spec["quantization"]["scheme"].startswith("dynamic")
        runs = perturbed_runs(self.converted[method], inputs, dynamic, ulps)
        flips = flip_runs(self.converted[method], inputs, ulps)
        return Reference(expected, [t.clone() for t in expected], runs, flips=flips)


class _MethodView(torch.nn.Module):
    def __init__(self, program: torch.nn.Module, method: str):
        super().__init__()
        self.program = program
        self.method = method

    def forward(self, *args):
        return getattr(self.program, self.method)(*args)


_REGISTERED: collections.deque = collections.deque()


_SHAPE_CHECK_FILE = "<etprop shape check>"
# Errors that say the meta device cannot decide, not that the program is wrong:
# a data-dependent branch (cond on a value), an op without a meta kernel, the
# tracing of control-flow bodies (dynamo) giving up.
_UNDECIDABLE = ("cannot be called on meta tensors", "data-dependent", "meta tensor", "Meta")


def check_shapes(spec: dict) -> None:
    """Run the program on the meta device (shapes and dtypes only, nothing
    allocated) and raise SpecError naming the node whose operands do not fit.
    For specs from files, after ``spec.validate`` (names are safe to render,
    sizes within the limits). Programs whose control flow branches on values
    cannot be decided this way; they are left to the build."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    source = render_source(spec)
    namespace: dict = {}
    try:
        code = compile(source, _SHAPE_CHECK_FILE, "exec")
    except SyntaxError as exc:  # a node missing what its op renders (a state, an argument)
        line = (exc.text or "").strip()
        node = line.split(" = ", 1)[0] if " = " in line else "a node"
        raise specmod.SpecError(
            f"node {node} does not render as Python ({line!r}): give it the 'state' and 'args' its op reads"
        ) from None
    exec(code, namespace)
    dtypes = {**namespace["DTYPES"], **namespace["INTEGER_DTYPES"]}
    lines = source.splitlines()
    try:
        with torch.device("meta"), torch.no_grad():
            module = namespace["Program"]().eval()
            for method, body in spec["methods"].items():
                inputs = [
                    torch.empty(inp["shape"], dtype=dtypes[inp.get("dtype", "float32")]) for inp in body["inputs"]
                ]
                getattr(module, method)(*inputs)
    except (NotImplementedError, GuardOnDataDependentSymNode):
        return
    except Exception as exc:  # the program's own error: a shape, dtype or argument that does not fit
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        if (
            isinstance(exc, AssertionError)
            or any(marker in str(exc) for marker in _UNDECIDABLE)
            or type(exc).__module__.startswith(("torch._dynamo", "torch._higher_order_ops"))
        ):
            return
        where = "the program"
        frame = exc.__traceback__
        while frame is not None:
            if frame.tb_frame.f_code.co_filename == _SHAPE_CHECK_FILE:
                line = lines[frame.tb_lineno - 1].strip()
                where = f"'{line.split(' = ')[0]}' ({line[:80]})" if " = " in line else f"'{line[:80]}'"
            frame = frame.tb_next
        raise specmod.SpecError(
            f"the program does not fit together at {where}: {type(exc).__name__}: {text[:200]}"
        ) from None


def computes(spec: dict, float_only: bool = False) -> bool:
    """Whether ``spec`` builds and its eager program runs on its first inputs
    (``float_only``: its float program, before any quantization): a rewrite
    such as a neutralization can change a shape a later op needs."""
    if float_only:
        spec = {key: value for key, value in spec.items() if key != "quantization"}
    try:
        built = build(spec, validate=not float_only)
        for method in built.methods:
            built.eager(method, built.inputs(method))
    except Exception:
        return False
    return True


def build(spec: dict, validate: bool = True) -> BuiltProgram:
    """Spec → module (in eval mode) with its generated source."""
    if validate:
        specmod.validate(spec)
    source = render_source(spec)
    filename = f"<etprop program {specmod.digest(spec)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    # A real module in sys.modules: dynamo re-imports the module of functions it
    # traces (control-flow bodies). Only the most recent programs stay registered.
    module_name = f"etprop_program_{specmod.digest(spec)}"
    program_module = types.ModuleType(module_name)
    namespace = program_module.__dict__
    sys.modules[module_name] = program_module
    _REGISTERED.append(module_name)
    while len(_REGISTERED) > 32:
        sys.modules.pop(_REGISTERED.popleft(), None)
    exec(compile(source, filename, "exec"), namespace)
    module = namespace["Program"]().eval()
    built = BuiltProgram(spec=spec, source=source, module=module, namespace=namespace)
    if spec.get("quantization"):
        from etprop.program.quantize import quantized

        return quantized(built)
    return built
