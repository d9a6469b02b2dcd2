"""Deliberately wrong lowerings, to measure what the equivalence oracle catches.

Each mutant stands for one backend defect. Two kinds:

- output mutants change a lowering's stored outputs directly (one element
  scaled, two channels swapped): ``mutate_outputs``.
- spec mutants change one op's semantics in the program (a bias dropped, an
  activation's approximation switched, a reduction over another axis, an
  argument reset to its default): ``mutate_spec``. Their effect on a lowering
  is the difference they make to the float64 result, added to the stored
  lowered outputs, so no extra lowering is needed and the lowering's own
  rounding stays in what the oracle sees.

A mutant counts only where it changes the result by more than the output
dtype can resolve (``visible``): scaling a zero, or switching the
approximation of a GELU whose inputs are all negligible, is not a fault.
"""

from __future__ import annotations

import copy
import random
from typing import Callable, Optional

import torch

from etprop.program.spec import all_nodes

# Relative size of the scale mutant per dtype: far above rounding noise
# (2,500 float32 ulps), a few ulps in the half types.
SCALE = {torch.float32: 3e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}

OUTPUT_MUTANTS = ("scale_element", "swap_channels")
SPEC_MUTANTS = ("drop_bias", "switch_approximation", "reduce_other_axis", "reset_argument")

# Op arguments whose default changes the value but not the shape, with that default.
ARGUMENT_DEFAULTS = {
    "add": {"alpha": 1},
    "sub": {"alpha": 1},
    "addmm": {"alpha": 1, "beta": 1},
    "leaky_relu": {"negative_slope": 0.01},
    "elu": {"alpha": 1.0},
    "softplus": {"beta": 1.0, "threshold": 20.0},
    "hardtanh": {"min_val": -1.0, "max_val": 1.0},
    "var": {"correction": 1},
    "gelu": {"approximate": "none"},
    "avg_pool1d": {"count_include_pad": True},
    "avg_pool2d": {"count_include_pad": True, "divisor_override": None},
    "div": {"rounding_mode": None},
}
REDUCTIONS = ("sum", "mean", "amax", "amin", "var", "softmax", "log_softmax")
BIAS_LAYERS = ("Linear", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d")
BIAS_OPS = ("linear", "conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d")


def _floats(outputs: list) -> list[int]:
    return [i for i, t in enumerate(outputs) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()]


def mutate_outputs(kind: str, outputs: list, rng: random.Random) -> Optional[list]:
    """``outputs`` with one output changed as ``kind`` says; None when the
    change would not show in the output's dtype."""
    candidates = _floats(outputs)
    if not candidates:
        return None
    index = rng.choice(candidates)
    tensor = outputs[index]
    if kind == "scale_element":
        flat = tensor.reshape(-1).clone()
        position = rng.randrange(flat.numel())
        value = flat[position]
        scaled = (value.double() * (1 + SCALE[tensor.dtype])).to(tensor.dtype)
        if not bool(torch.isfinite(value)) or bool(scaled == value):
            return None
        flat[position] = scaled
        changed = flat.reshape(tensor.shape)
    elif kind == "swap_channels":
        dim = 1 if tensor.dim() >= 2 else 0
        if tensor.dim() == 0 or tensor.shape[dim] < 2:
            return None
        first, second = rng.sample(range(tensor.shape[dim]), 2)
        a, b = tensor.select(dim, first), tensor.select(dim, second)
        if bool(torch.equal(a, b)):
            return None
        changed = tensor.clone()
        changed.select(dim, first).copy_(b)
        changed.select(dim, second).copy_(a)
    else:
        raise ValueError(f"unknown output mutant {kind!r}; known: {', '.join(OUTPUT_MUTANTS)}")
    result = list(outputs)
    result[index] = changed
    return result


def _drop_bias(spec: dict) -> list:
    options = []
    for name, entry in spec["state"].items():
        if entry["kind"] == "layer" and entry["type"] in BIAS_LAYERS and entry["kwargs"].get("bias", True):

            def edit(s, name=name):
                target = s["state"][name]
                target["kwargs"]["bias"] = False
                target["parametrizations"] = [p for p in target.get("parametrizations", []) if p.get("on") != "bias"]

            options.append((edit, f"layer {name} without its bias"))
    for method, node in all_nodes(spec):
        if node["op"] in BIAS_OPS and node.get("attrs", {}).get("bias_state"):

            def edit(s, method=method, nid=node["id"]):
                del _node(s, method, nid)["attrs"]["bias_state"]

            options.append((edit, f"{node['op']} {node['id']} without its bias"))
    return options


def _switch_approximation(spec: dict) -> list:
    options = []
    for method, node in all_nodes(spec):
        if node["op"] == "gelu":
            current = node.get("attrs", {}).get("approximate", "none")
            other = "tanh" if current == "none" else "none"

            def edit(s, method=method, nid=node["id"], other=other):
                _node(s, method, nid).setdefault("attrs", {})["approximate"] = other

            options.append((edit, f"gelu {node['id']} approximate={other!r}"))
    return options


def _reduce_other_axis(spec: dict) -> list:
    options = []
    for method, node in all_nodes(spec):
        dim = node.get("attrs", {}).get("dim")
        if node["op"] in REDUCTIONS and isinstance(dim, int):
            for other in (d for d in range(-4, 4) if d != dim):

                def edit(s, method=method, nid=node["id"], other=other):
                    _node(s, method, nid)["attrs"]["dim"] = other

                options.append((edit, f"{node['op']} {node['id']} over dim {other} (not {dim})"))
    return options


def _reset_argument(spec: dict) -> list:
    options = []
    for method, node in all_nodes(spec):
        attrs = node.get("attrs", {})
        for name, default in ARGUMENT_DEFAULTS.get(node["op"], {}).items():
            if name in attrs and attrs[name] != default:

                def edit(s, method=method, nid=node["id"], name=name):
                    del _node(s, method, nid)["attrs"][name]

                options.append((edit, f"{node['op']} {node['id']} with {name} back to its default"))
    return options


_SPEC_EDITS: dict[str, Callable[[dict], list]] = {
    "drop_bias": _drop_bias,
    "switch_approximation": _switch_approximation,
    "reduce_other_axis": _reduce_other_axis,
    "reset_argument": _reset_argument,
}


def _node(spec: dict, method: str, nid: str) -> dict:
    for where, node in all_nodes(spec):
        if where == method and node["id"] == nid:
            return node
    raise KeyError(nid)


def mutate_spec(kind: str, spec: dict, rng: random.Random) -> list[tuple[dict, str]]:
    """Every way of applying ``kind`` to ``spec``, in a random order, as
    (mutated copy, description); the caller takes the first that builds and
    keeps the outputs' shapes (a changed shape is caught trivially)."""
    try:
        options = _SPEC_EDITS[kind](spec)
    except KeyError:
        raise ValueError(f"unknown spec mutant {kind!r}; known: {', '.join(SPEC_MUTANTS)}") from None
    rng.shuffle(options)
    mutated = []
    for edit, description in options:
        copied = copy.deepcopy(spec)
        edit(copied)
        mutated.append((copied, description))
    return mutated


def visible(original: torch.Tensor, changed: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether ``changed`` (float64) differs from ``original`` (float64) by
    more than one ulp of ``dtype`` at some element, or in where it is finite."""
    if original.shape != changed.shape:
        return True
    if not torch.equal(original.isfinite(), changed.isfinite()):
        return True
    finite = original.isfinite()
    if not dtype.is_floating_point:
        return not torch.equal(original, changed)
    info = torch.finfo(dtype)
    gap = (changed - original).abs()[finite]
    return bool((gap > info.eps * original.abs()[finite].clamp_min(info.tiny)).any())


def apply_delta(actual: list, original_wide: list, mutated_wide: list) -> Optional[list]:
    """The lowered outputs ``actual`` moved by what the mutant changes in the
    float64 result; None when that change is not visible in any output."""
    if len(original_wide) != len(mutated_wide):
        return None
    result, seen = [], False
    for got, before, after in zip(actual, original_wide, mutated_wide):
        if before.shape != after.shape or not got.is_floating_point():
            if before.shape != after.shape or not torch.equal(before, after):
                return None
            result.append(got)
            continue
        if visible(before, after, got.dtype):
            seen = True
            delta = (after - before).nan_to_num(0.0, 0.0, 0.0)
            moved = got.double() + delta
            moved = torch.where(after.isfinite() & before.isfinite(), moved, after)
            result.append(moved.to(got.dtype))
        else:
            result.append(got)
    return result if seen else None
