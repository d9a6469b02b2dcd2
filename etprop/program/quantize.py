"""Quantized programs: a spec's ``quantization`` entry as PT2E steps, and the
eager reference the equivalence oracle compares a quantized lowering with.

A quantized spec (format etprop-spec/2) is the float program plus::

    "quantization": {"scheme": "static_per_tensor", "modules": null, "calibration": 2}

``scheme``: static int8 activations with per-tensor or per-channel int8
weights, or dynamic int8 activations (quantization parameters computed at run
time) with per-tensor or per-channel int8 weights: the configurations
executorch's ``XNNPACKQuantizer`` offers (weights symmetric, activations
affine). ``modules``: the layers annotated (state names), or null for the whole
program. ``calibration``: how many batches of normal inputs the observers see.
``fold_computed_weights`` (set by a neutralization, never drawn): weights
computed by parametrizations are stored as their values before quantizing.

The steps (export, ``prepare_pt2e``, calibrate, ``convert_pt2e``) are Python
source, ``QUANTIZE_SOURCE``, run by etprop and written verbatim into standalone
repro scripts, so both quantize the same way. The converted (Q/DQ) program is
the reference: a lowering is judged against it, never against the float program.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math

import torch

from etprop.program import vocabulary

SCHEMES = ("static_per_tensor", "static_per_channel", "dynamic_per_tensor", "dynamic_per_channel")

QUANTIZE_SOURCE = '''

def _quantizer(scheme, modules):
    """executorch's XNNPACKQuantizer for ``scheme``, over the whole program or
    the named layers only."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer, get_symmetric_quantization_config)

    config = get_symmetric_quantization_config(is_per_channel=scheme.endswith("per_channel"),
                                               is_dynamic=scheme.startswith("dynamic"))
    quantizer = XNNPACKQuantizer()
    if modules is None:
        return quantizer.set_global(config)
    for name in modules:
        quantizer.set_module_name("program." + name, config)
    return quantizer


def fold_computed_weights(program):
    """``program`` with its parametrized weights stored as the values they
    compute (the same float program, nothing left to compute). In place, on
    a fresh instance: a copy would share the classes parametrization injects."""
    for module in program.modules():
        for name in list(getattr(module, "parametrizations", {}) or {}):
            parametrize.remove_parametrizations(module, name, leave_parametrized=True)
    return program


def calibration_inputs(inputs, count):
    """``count`` batches of normal inputs, seeded apart from the test inputs."""
    return [tuple(make_input(tuple(inp["shape"]), inp.get("dtype", "float32"), "normal",
                             (101 + batch) * 7919 + index, inp.get("high"))
                  for index, inp in enumerate(inputs)) for batch in range(count)]


def pt2e_steps(graph, calibration, scheme, modules):
    """prepare_pt2e, calibrate, convert_pt2e on an exported graph: the quantized
    (Q/DQ) program, a GraphModule taking the method's inputs."""
    import executorch.kernels.quantized  # noqa: F401  (out variants of the Q/DQ ops left outside delegates)
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    prepared = prepare_pt2e(graph, _quantizer(scheme, modules))
    with torch.no_grad():
        for inputs in calibration:
            prepared(*inputs)
    return convert_pt2e(prepared)


def quantize_pt2e(method_module, example, calibration, scheme, modules, dynamic_shapes=None):
    """export, then the PT2E steps."""
    graph = torch.export.export(method_module, example, dynamic_shapes=dynamic_shapes, strict=False).module()
    return pt2e_steps(graph, calibration, scheme, modules)
'''


_PATTERN_GRAPHS: dict = {}


def _pattern_key(pattern, example_inputs, is_cuda, kwargs):
    """What an exported pattern graph depends on: the pattern's code and the
    values it closes over, the inputs' shapes and dtypes; None when any part is
    not plain (that pattern is exported afresh)."""
    function = getattr(pattern, "fn", pattern) if isinstance(pattern, torch.nn.Module) else pattern
    code = getattr(function, "__code__", None)
    if code is None:
        return None

    def plain(value):
        if isinstance(value, torch.Tensor):
            return ("tensor", tuple(value.shape), value.dtype)
        hash(value)
        return value

    try:
        closure = tuple(plain(cell.cell_contents) for cell in function.__closure__ or ())
        key = (
            code,
            closure,
            plain(function.__defaults__),
            tuple(plain(x) for x in example_inputs),
            is_cuda,
            tuple(sorted((name, plain(value)) for name, value in kwargs.items())),
        )
        hash(key)
    except (TypeError, ValueError):
        return None
    return key


@contextlib.contextmanager
def pattern_graphs_reused():
    """While active, torchao exports each of its rewrite patterns once per
    process. ``convert_pt2e`` exports about thirty conv-batch-norm pattern graphs
    for every program that holds a batch norm (13 s of one such program's 14 s
    build), the same graphs every time; a copy of the first
    export is what a fresh export would give. The function patched is private
    to torchao, so it is restored on exit; standalone repros run unpatched."""
    from torchao.quantization.pt2e import qat_utils, utils

    original = utils._get_aten_graph_module_for_pattern

    def reused(pattern, example_inputs, is_cuda=False, **kwargs):
        key = _pattern_key(pattern, example_inputs, is_cuda, kwargs)
        if key is None:
            return original(pattern, example_inputs, is_cuda, **kwargs)
        if key not in _PATTERN_GRAPHS:
            _PATTERN_GRAPHS[key] = original(pattern, example_inputs, is_cuda, **kwargs)
        return copy.deepcopy(_PATTERN_GRAPHS[key])

    utils._get_aten_graph_module_for_pattern = qat_utils._get_aten_graph_module_for_pattern = reused
    try:
        yield
    finally:
        utils._get_aten_graph_module_for_pattern = qat_utils._get_aten_graph_module_for_pattern = original


@functools.lru_cache(maxsize=None)
def _q_ops() -> tuple[frozenset, frozenset, frozenset]:
    """(activation quantizations, the dynamic ones, dequantizations): weights
    were folded to int8 constants by convert_pt2e. The ops exist once torchao's
    PT2E module is imported."""
    # Their out variants, which to_executorch needs for Q/DQ ops left outside a delegate.
    import executorch.kernels.quantized  # noqa: F401
    import torchao.quantization.pt2e.quantize_pt2e  # noqa: F401  (registers quantized_decomposed)

    qd = torch.ops.quantized_decomposed
    dynamic = frozenset({qd.quantize_per_tensor.tensor, qd.quantize_per_tensor.tensor2})
    return (
        frozenset({qd.quantize_per_tensor.default}) | dynamic,
        dynamic,
        frozenset(
            {
                qd.dequantize_per_tensor.default,
                qd.dequantize_per_tensor.tensor,
                qd.dequantize_per_tensor.tensor2,
                qd.dequantize_per_channel.default,
            }
        ),
    )


# ATen ops whose result is exact given their operands (only their inputs'
# perturbation moves them): the op table's exact ops, and the views and
# copies export adds.
_EXACT = {name for name, op in vocabulary.OP_TABLE.items() if op.rounding == "exact"} | {
    "view",
    "t",
    "clone",
    "select",
    "getitem",
    "expand",
    "contiguous",
    "_to_copy",
}
# Float ops whose textbook formula cancels terms, as a backend may compute
# them: the size of those terms, from the ATen op's arguments (the op table's
# ``aten_terms``; the float jitter renders the same from the spec's operands).
_TERMS = {name: op.aten_terms for name, op in vocabulary.OP_TABLE.items() if op.aten_terms is not None}


class _Perturbed(torch.fx.Interpreter):
    """The converted program run with the differences a correct quantized
    lowering may have from it (the bound is docs/tolerance.md's, with
    oracles/tolerance.py's constants):

    - each activation's value entering a static quantization moves by u *
      ``tie_steps`` of its step (a NaN, which has no integer, becomes the end
      of the range u points to, or the zero point for u = 0), so elements
      that close to a rounding boundary round the other way (a backend's
      integer requantization, its int32 bias and its float32 scale products
      move values by about 0.02 steps); one entering a dynamic quantization moves by u * ``dynamic_steps`` (a backend
      computes its own quantization parameters, so any element may round the
      other way);
    - each float op's result moves by u * ``float_ulps`` ulps (the float ops
      around and between quantized patterns), scaled by the terms an op's
      textbook formula cancels (softplus, GELU, ...) as in the float jitter,
      and a subnormal result by the smallest normal;
    - ``mode`` "float" (dynamic schemes only): dynamically quantized
      activations are not rounded at all, the limit of a backend that picks
      finer quantization parameters than the reference;
    - ``mode`` "per_row" (dynamic schemes only): dynamically quantized
      activations rounded with parameters of their own per row, as XNNPACK
      does: a row is the last dim of what a linear reads, and all but the
      first dim of what a convolution reads.

    u is +1 ("up"), -1 ("down") or drawn from {-1, 0, 1} per element ("random")."""

    def __init__(self, module, mode: str, seed: int, budgets: dict):
        super().__init__(module)
        self.node: torch.fx.Node | None = None
        self.mode = mode
        self.budgets = budgets
        self.generator = torch.Generator().manual_seed(seed)
        self.tie_steps = budgets["tie_steps"]
        self.dynamic_steps = budgets["dynamic_steps"]
        self.float_ulps = budgets["quantized_float_ops"]
        # id of a dynamic quantization's result -> (that result, its unrounded
        # input); the result is kept so that its id is not reused by another.
        self.unrounded: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _signs(self, shape) -> torch.Tensor:
        if self.mode == "random":
            return torch.randint(-1, 2, tuple(shape), generator=self.generator).float()
        if self.mode in ("float", "per_row"):
            return torch.zeros(tuple(shape))
        return torch.full(tuple(shape), 1.0 if self.mode == "up" else -1.0)

    def _body(self, graph_module):
        """A control-flow body run with the same perturbations (and the same
        draws) as the graph that calls it."""

        def run(*operands):
            inner = _Perturbed(graph_module, self.mode, 0, self.budgets)
            inner.generator, inner.unrounded = self.generator, self.unrounded
            return inner.run(*operands)

        return run

    def run_node(self, n):
        self.node = n
        return super().run_node(n)

    def call_function(self, target, args, kwargs):
        if isinstance(target, torch._ops.HigherOrderOperator):
            args = tuple(self._body(a) if isinstance(a, torch.fx.GraphModule) else a for a in args)
            return target(*args, **kwargs)
        quantize, dynamic, dequantize = _q_ops()
        if target in quantize:
            value, scale = args[0], args[1]
            if self.mode in ("float", "per_row") and target in dynamic:
                result = target(*args, **kwargs)
                if self.mode == "per_row":
                    value = _rounded_per_row(value, _row_dims(self.node), *args[3:5])
                self.unrounded[id(result)] = (result, value)
                return result
            steps = self.dynamic_steps if target in dynamic else self.tie_steps
            signs = self._signs(value.shape)
            moved = value + signs * steps * torch.as_tensor(scale, dtype=value.dtype)
            if target not in dynamic:
                # A NaN has no integer: eager's cast and a backend's each pick
                # one. The perturbed runs take the ends of the range (and, at
                # random, the zero point), so what follows a NaN is bounded by
                # what any choice gives.
                ends = torch.where(signs > 0, float("inf"), torch.where(signs < 0, float("-inf"), 0.0))
                moved = torch.where(value.isnan(), ends.to(value.dtype), moved)
            return target(moved, *args[1:], **kwargs)
        if target in dequantize:
            kept, found = self.unrounded.get(id(args[0]), (None, None))
            found = found if kept is args[0] else None
            return found if found is not None else target(*args, **kwargs)
        name = getattr(target, "__name__", str(target)).split(".")[0]
        if name in ("group_norm", "layer_norm") and self.budgets["quantized_float_ops"]:
            result = self._normalized(name, *args)
        else:
            result = target(*args, **kwargs)
        if isinstance(result, torch.Tensor) and result.is_floating_point() and name not in _EXACT:
            info = torch.finfo(result.dtype)
            wide = result.double()
            # As in the float jitter: a subnormal, which a backend may flush to
            # zero, moves by the smallest normal.
            subnormal = (wide != 0) & (wide.abs() < info.tiny)
            terms = _TERMS[name](*args) if name in _TERMS else wide.abs()
            size = self.float_ulps * info.eps * torch.maximum(wide.abs(), terms) + torch.where(
                subnormal, info.tiny, 0.0
            )
            result = (wide + self._signs(result.shape).double() * size).to(result.dtype)
        return result

    def _normalized(self, name, value, shape_or_groups, weight=None, bias=None, eps=1e-5, *rest):
        """A float GroupNorm or LayerNorm with its statistics moved by their
        rounding error, as the float jitter moves them (builder._layer): over
        a nearly constant group the variance's error is far more than the
        result's own ulps."""
        from etprop.program.builder import normalized_with_moved_statistics

        if name == "group_norm":
            return normalized_with_moved_statistics(value, shape_or_groups, None, weight, bias, eps, self._signs)
        return normalized_with_moved_statistics(value, None, len(shape_or_groups), weight, bias, eps, self._signs)


def _row_dims(node: torch.fx.Node | None) -> int:
    """How many trailing dims form one row of a dynamic quantization, as
    XNNPACK picks them: three when a convolution reads the quantized value
    before any linear does, else one."""
    pending, seen = list(node.users) if node is not None else [], set()
    while pending:
        user = pending.pop(0)
        if user in seen:
            continue
        seen.add(user)
        name = str(user.target)
        if "linear" in name:
            return 1
        if "conv" in name:
            return 3
        pending.extend(user.users)
    return 1


def _rounded_per_row(value: torch.Tensor, row_dims: int, qmin: int, qmax: int) -> torch.Tensor:
    """``value`` quantized asymmetrically with a scale and zero point per row
    (its last ``row_dims`` dims; each row's range widened to hold zero), then
    dequantized."""
    if value.numel() == 0:
        return value
    rows = value.reshape(-1, math.prod(value.shape[value.dim() - min(row_dims, value.dim()) :]))
    low = rows.amin(dim=1, keepdim=True).clamp(max=0)
    high = rows.amax(dim=1, keepdim=True).clamp(min=0)
    scale = torch.where(high > low, (high - low) / (qmax - qmin), torch.ones_like(high))
    zero_point = torch.clamp(torch.round(qmin - low / scale), qmin, qmax)
    quantized = torch.clamp(torch.round(rows / scale) + zero_point, qmin, qmax)
    return ((quantized - zero_point) * scale).reshape(value.shape).to(value.dtype)


def flip_runs(converted, inputs: tuple, budgets: dict) -> list:
    """The converted program's outputs with every quantization's input moved
    up, then down, by ``budgets["flip_steps"]`` whole steps: how far a value
    that rounds the other way anywhere upstream can move each output."""
    budgets = {
        **budgets,
        "tie_steps": budgets["flip_steps"],
        "dynamic_steps": budgets["flip_steps"],
        "quantized_float_ops": 0.0,
    }
    runs = []
    with torch.no_grad():
        for mode in ("up", "down"):
            outputs = _Perturbed(converted, mode, 0, budgets).run(*inputs)
            runs.append([t.clone() for t in (outputs if isinstance(outputs, (list, tuple)) else [outputs])])
    return runs


def perturbed_runs(converted, inputs: tuple, dynamic: bool, budgets: dict) -> list:
    """The converted program's outputs under each perturbation: up, down,
    ``budgets["random_runs"]`` random patterns, and for dynamic schemes the
    unrounded activations and the activations rounded per row (the
    equivalence oracle's jittered runs; the first two are its directional
    ones). ``budgets``: oracles/tolerance.op_ulps."""
    modes = [("up", 0), ("down", 0)] + [("random", seed) for seed in range(1, int(budgets["random_runs"]) + 1)]
    modes += [("float", 0), ("per_row", 0)] if dynamic else []
    runs = []
    with torch.no_grad():
        for mode, seed in modes:
            outputs = _Perturbed(converted, mode, seed, budgets).run(*inputs)
            runs.append([t.clone() for t in (outputs if isinstance(outputs, (list, tuple)) else [outputs])])
    return runs


def _innermost(exc: BaseException) -> str:
    """Where the innermost cause was raised (file:line in function): PT2E
    wraps its passes' errors, so the outer message alone names no cause."""
    import traceback

    while exc.__cause__ is not None:
        exc = exc.__cause__
    frames = traceback.extract_tb(exc.__traceback__)
    where = (
        f" at {frames[-1].filename.rsplit('site-packages/', 1)[-1]}:{frames[-1].lineno} in {frames[-1].name}"
        if frames
        else ""
    )
    return f"cause: {type(exc).__name__}: {exc}{where}"


class QuantizationFailed(Exception):
    """Quantizing a program failed. ``stage`` "export": torch.export rejected
    the float program, or eager did (a generator defect, as for any program); "pt2e": PT2E
    failed on a program torch.export accepted, a failure of the quantization
    layer (torchao and the quantizer), judged like a lowering's."""

    def __init__(self, stage: str, message: str):
        super().__init__(message)
        self.stage = stage


def _eager_error(module, example) -> str:
    """Why the float method fails on its example inputs in eager, or ''."""
    try:
        with torch.no_grad():
            module(*example)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def quantized(built):
    """``built`` (the float program of a quantized spec) as a QuantizedProgram:
    each method quantized on its own, with the spec's calibration batches."""
    from etprop.program.builder import QuantizedProgram

    _q_ops()
    config = built.spec["quantization"]
    namespace = built.namespace
    converted = {}
    for method in built.methods:
        calibration = namespace["calibration_inputs"](
            built.spec["methods"][method]["inputs"], config.get("calibration", 1)
        )
        module, example, shapes = built.method_module(method), built.inputs(method), built.dynamic_shapes(method)
        if config.get("fold_computed_weights"):
            module = type(module)(namespace["fold_computed_weights"](namespace["Program"]().eval()), method)
        try:
            graph = torch.export.export(module, example, dynamic_shapes=shapes, strict=False).module()
        except Exception as exc:
            raise QuantizationFailed(
                "export", f"torch.export rejected method '{method}': {type(exc).__name__}: {exc}"
            ) from exc
        try:
            with pattern_graphs_reused():
                converted[method] = namespace["pt2e_steps"](graph, calibration, config["scheme"], config.get("modules"))
        except Exception as exc:
            eager_error = _eager_error(module, example)
            if eager_error:
                # torch.export can accept what eager refuses (meta addmm skips
                # its bias check at beta 0): not a failure of PT2E.
                raise QuantizationFailed("export", f"method '{method}' does not run in eager: {eager_error}") from exc
            raise QuantizationFailed(
                "pt2e",
                f"PT2E quantization ({config['scheme']}) of method '{method}' failed: "
                f"{type(exc).__name__}: {exc}\n{_innermost(exc)}",
            ) from exc
    return QuantizedProgram(
        spec=built.spec, source=built.source, module=built.module, namespace=namespace, converted=converted
    )
