"""Candidate (a): XNNPACK GEMMs whose weight or bias is computed from parameters.

executorch 1.5.1's GEMM configs accept a convolution, linear, addmm or mm only
when weight and bias are parameters, so ``weight_norm``, ``spectral_norm`` or
any ``parametrize`` parametrization sends the GEMM and its weight computation to
portable kernels (941x on wav2vec2's positional conv). The top-level program
is left as it is; instead:

* the GEMM configs of :class:`FoldingXnnpackPartitioner` accept a weight or
  bias computed with pure, deterministic ops from parameters, unmutated buffers
  or constants, when folding it can only shrink the program (counting the
  folded weight as the delegate stores it: half precision widened to
  float32); they partition
  the computation together with the GEMM and tag it with a token that the GEMM
  node also carries;
* :func:`install_fold` wraps ``XnnpackBackend.preprocess`` (1.5.1 has no hook
  for backend passes) so that, first thing in the XNNPACK preprocessing, the
  tagged computation is evaluated on the sub-program's real parameter values
  and replaced by one new parameter, when its tagging GEMM is in the same
  delegate. From then on the delegate is built exactly as for a parameter
  weight; its data is keyed by content, so identical folds deduplicate.

executorch is imported only inside functions, so the registry loads fast.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
from typing import Any, Iterator, Optional

from etprop.flows import register
from etprop.flows.base import Flow, Promises
from etprop.flows.stock import XNNPACK_GEMMS_WITH_PARAMETER_WEIGHTS

# node.meta keys. A GEMM carries {operand index: token}; the nodes computing
# that operand carry the token in a tuple (a node may sit in nested folds).
GEMM_KEY = "etprop_fold_gemm"
COMPUTATION_KEY = "etprop_fold"

_tokens = itertools.count()
_ALLOWED_NAMESPACES = ("aten", "prims", "dim_order_ops")
_UNINITIALISED = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "empty_permuted",
    }
)


def _overload(target: Any):
    """The torch OpOverload behind an aten or edge target, else None."""
    import torch

    if isinstance(target, torch._ops.OpOverload):
        return target
    op = getattr(target, "_op", None)
    return op if isinstance(op, torch._ops.OpOverload) else None


def _is_pure_call(node) -> bool:
    """True for a call whose result depends only on its inputs and touches nothing else."""
    import operator

    import torch

    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    op = _overload(node.target)
    if op is None or op.namespace not in _ALLOWED_NAMESPACES:
        return False
    if op._schema.is_mutable or op.name().split("::")[-1].split(".")[0] in _UNINITIALISED:
        return False
    banned = {
        torch.Tag.nondeterministic_seeded,
        torch.Tag.inplace,
        torch.Tag.inplace_view,
        torch.Tag.out,
        torch.Tag.data_dependent_output,
        torch.Tag.dynamic_output_shape,
        torch.Tag.maybe_aliasing_or_mutating,
    }
    return not banned.intersection(op.tags)


def _static_tensor_val(node):
    """The node's fake value when it is one tensor of static shape, else None."""
    import torch

    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    if any(not isinstance(d, int) for d in val.shape):
        return None
    return val


def _static_tensors(node) -> bool:
    """True when the node yields tensors of static shape only (one or several)."""
    import torch

    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else (val,)
    return bool(vals) and all(isinstance(v, torch.Tensor) and all(isinstance(d, int) for d in v.shape) for v in vals)


def _nbytes(val) -> int:
    return val.numel() * val.element_size()


def _delegate_nbytes(val) -> int:
    """What the XNNPACK delegate stores for a static weight: half-precision
    weights are widened to float32 (a float16 Conv2d's weight takes float32's
    bytes in the .pte), so a folded float16 weight costs twice its own size."""
    import torch

    if val.dtype in (torch.float16, torch.bfloat16):
        return val.numel() * 4
    return _nbytes(val)


def _is_external(node) -> bool:
    """Sources tagged for an external data file stay where the tag puts them."""
    custom = node.meta.get("custom") or {}
    return "constant_tag" in node.meta or "delegate_constant_tag" in custom


def _constant_source(ep, node) -> bool:
    """A parameter, unmutated buffer or lifted constant with no external-data tag."""
    from torch._export.utils import is_buffer, is_lifted_tensor_constant, is_param

    if node.op != "placeholder" or _is_external(node):
        return False
    sig = ep.graph_signature
    if is_buffer(ep, node):
        return sig.inputs_to_buffers[node.name] not in set(sig.buffers_to_mutate.values())
    return is_param(ep, node) or is_lifted_tensor_constant(ep, node)


def _operand_count(gemm, value) -> int:
    """How many times ``value`` appears among the GEMM's arguments."""
    import torch

    count = 0

    def visit(arg):
        nonlocal count
        if arg is value:
            count += 1
        return arg

    torch.fx.node.map_arg((gemm.args, gemm.kwargs), visit)
    return count


def _computation(ep, gemm, root, member=None) -> Optional[list]:
    """The nodes computing ``root`` for ``gemm`` (sources included), if foldable.

    Foldable means: pure calls over constant sources only, every node used
    only inside the computation, ``root`` used only by ``gemm`` and exactly once
    there, and the folded tensor, as the delegate stores it, no larger than the
    sources it frees. With
    ``member``, only nodes it accepts may belong (the fold pass uses this to
    follow the partitioner's tags).
    """
    import torch

    if not isinstance(root, torch.fx.Node) or root.op != "call_function":
        return None
    root_val = _static_tensor_val(root)
    if root_val is None or set(root.users) != {gemm} or _operand_count(gemm, root) != 1:
        return None
    nodes, stack = {root}, [root]
    while stack:
        for inp in stack.pop().all_input_nodes:
            if inp not in nodes:
                nodes.add(inp)
                stack.append(inp)
    freed = 0
    for node in nodes:
        if member is not None and node.op != "placeholder" and not member(node):
            return None
        if node.op == "placeholder":
            if not _constant_source(ep, node):
                return None
            val = _static_tensor_val(node)
            if val is None:
                return None
            freed += _nbytes(val)
        elif not _is_pure_call(node) or not _static_tensors(node):
            return None
        if node is not root and not set(node.users) <= nodes:
            return None
    if freed == 0 or _delegate_nbytes(root_val) > freed:
        return None
    order = {n: i for i, n in enumerate(root.graph.nodes)}
    return sorted(nodes, key=order.__getitem__)


def _exact_call(gemm) -> bool:
    """True when XNNPACK represents every argument of this GEMM call.

    The XNNPACK lowering drops addmm's beta/alpha (see
    findings/repros/xnnpack_addmm_alpha_beta_dropped.py) and honours
    output_padding only for transposed convolutions; such calls stay on portable.
    """
    name = gemm.target.__name__.split(".")[-2]
    args, kwargs = gemm.args, gemm.kwargs
    if name == "linear":
        return len(args) <= 3 and not kwargs
    if name == "mm":
        return len(args) == 2 and not kwargs
    if name == "addmm":
        beta = kwargs.get("beta", args[3] if len(args) > 3 else 1)
        alpha = kwargs.get("alpha", args[4] if len(args) > 4 else 1)
        return beta == 1 and alpha == 1 and set(kwargs) <= {"beta", "alpha"}
    if name == "convolution":
        transposed, output_padding = args[6], args[7]
        return not kwargs and (transposed or all(p == 0 for p in output_padding))
    return False


@functools.cache
def _config_classes() -> dict:
    """Fold-aware subclasses of the 1.5.1 GEMM configs, keyed by the class they replace."""
    from executorch.backends.xnnpack.partition.config.gemm_configs import (
        AddmmConfig,
        ConvolutionConfig,
        LinearConfig,
        MMConfig,
    )
    from executorch.backends.xnnpack.partition.config.xnnpack_config import ConfigPrecisionType
    from executorch.backends.xnnpack.utils.utils import is_param_node

    class ComputedOperandMixin:
        """Accepts a computed weight/bias where the stock config wants a parameter.

        Only while :func:`install_fold` is active: without the fold pass the
        delegate could not take the computation, so the config stays stock.
        """

        _src_partition_depth = 0

        def _computed(self, node, ep, idx):
            # Only the top-level graph is partitioned: a GEMM in a control-flow
            # body is never delegated, so accepting it would only keep it from
            # being decomposed, and portable's linear rejects a 1-D input.
            if (
                not _installed
                or idx is None
                or self._src_partition_depth
                or idx >= len(node.args)
                or node.graph is not ep.graph_module.graph
            ):
                return None
            operand = node.args[idx]
            if operand is None or is_param_node(ep, operand) or not _exact_call(node):
                return None
            return _computation(ep, node, operand)

        def _get_weight_deps(self, node, ep, precision):
            valid, deps = super()._get_weight_deps(node, ep, precision)
            if valid or precision != ConfigPrecisionType.FP32:
                return valid, deps
            nodes = self._computed(node, ep, self.weight_idx)
            return (True, nodes) if nodes else (False, [])

        def _get_bias_deps(self, node, ep, precision):
            valid, deps = super()._get_bias_deps(node, ep, precision)
            if valid or precision != ConfigPrecisionType.FP32:
                return valid, deps
            nodes = self._computed(node, ep, self.bias_idx)
            return (True, nodes) if nodes else (False, [])

        def get_node_and_deps(self, node, ep):
            """Partition the GEMM and tag each computation it takes in with a fresh token."""
            partition = super().get_node_and_deps(node, ep)
            node.meta.pop(GEMM_KEY, None)
            tags = {}
            for idx in (self.weight_idx, self.bias_idx):
                nodes = self._computed(node, ep, idx)
                if not nodes or not set(nodes) <= set(partition):
                    continue
                token = f"fold{next(_tokens)}"
                tags[idx] = token
                for dep in nodes:
                    dep.meta[COMPUTATION_KEY] = tuple(dep.meta.get(COMPUTATION_KEY, ())) + (token,)
            if tags:
                node.meta[GEMM_KEY] = tags
            return partition

    class SourcePartitionGuard:
        """Linear source partitions fake addmm's arguments; judge computed operands only on real ones."""

        def get_deps_from_src_partition(self, node, ep, src_partition):
            self._src_partition_depth += 1
            try:
                return super().get_deps_from_src_partition(node, ep, src_partition)
            finally:
                self._src_partition_depth -= 1

    class FoldLinearConfig(ComputedOperandMixin, LinearConfig):
        pass

    class FoldConvolutionConfig(ComputedOperandMixin, ConvolutionConfig):
        pass

    class FoldAddmmConfig(ComputedOperandMixin, SourcePartitionGuard, AddmmConfig):
        pass

    class FoldMMConfig(ComputedOperandMixin, SourcePartitionGuard, MMConfig):
        pass

    return {
        LinearConfig: FoldLinearConfig,
        ConvolutionConfig: FoldConvolutionConfig,
        AddmmConfig: FoldAddmmConfig,
        MMConfig: FoldMMConfig,
    }


@functools.cache
def _partitioner_class():
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    class FoldingXnnpackPartitioner(XnnpackPartitioner):
        """XnnpackPartitioner whose GEMM configs accept foldable computed weights."""

        def __init__(self, configs=None, **kwargs):
            swap = _config_classes()
            chosen = [swap.get(c, c) for c in (configs or ALL_PARTITIONER_CONFIGS)]
            super().__init__(configs=chosen, **kwargs)

    return FoldingXnnpackPartitioner


def FoldingXnnpackPartitioner(*args, **kwargs):
    """Build the fold-aware partitioner (the class is made on first use)."""
    return _partitioner_class()(*args, **kwargs)


def _unique_target(ep, base: str) -> str:
    """A state_dict name no parameter, buffer or constant of ``ep`` uses."""
    taken = set(ep.state_dict) | set(ep.constants)
    taken |= {spec.target for spec in ep.graph_signature.input_specs if spec.target}
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    return name


def _evaluate(ep, nodes):
    """Run the computation on the sub-program's real parameter values."""
    import torch
    from executorch.backends.xnnpack.utils.utils import get_param_tensor

    env = {}
    with torch.no_grad():
        for node in nodes:
            if node.op == "placeholder":
                env[node] = get_param_tensor(ep, node).detach()
            else:
                args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), env.__getitem__)
                env[node] = node.target(*args, **kwargs)
    return env[nodes[-1]].detach().contiguous().clone()


def _replace_with_parameter(ep, gemm, nodes, value) -> None:
    """Swap the folded computation for one new parameter and drop what it frees."""
    import torch
    from torch.export.graph_signature import InputKind, InputSpec, TensorArgument

    graph, root = ep.graph, nodes[-1]
    sig = ep.graph_signature
    specs = {spec.arg.name: spec for spec in sig.input_specs}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    after_params = [p for p in placeholders if specs.get(p.name) is None or specs[p.name].kind != InputKind.PARAMETER]
    anchor = after_params[0] if after_params else None
    inserting = (
        graph.inserting_before(anchor)
        if anchor is not None
        else graph.inserting_after(placeholders[-1])
        if placeholders
        else graph.inserting_before(None)
    )
    target = _unique_target(ep, f"{root.name}_folded")
    with inserting:
        param = graph.placeholder(target.replace(".", "_"))
    param.meta["val"] = root.meta["val"]
    if "tensor_meta" in root.meta:
        param.meta["tensor_meta"] = root.meta["tensor_meta"]
    gemm.replace_input_with(root, param)
    specs[param.name] = InputSpec(
        kind=InputKind.PARAMETER, arg=TensorArgument(name=param.name), target=target, persistent=None
    )
    for node in reversed(nodes):
        if node.op == "placeholder":
            spec = specs.pop(node.name)
            ep.state_dict.pop(spec.target, None)
            ep.constants.pop(spec.target, None)
        graph.erase_node(node)
    ep.state_dict[target] = torch.nn.Parameter(value, requires_grad=False)
    sig.input_specs[:] = [specs[n.name] for n in graph.nodes if n.op == "placeholder"]


def fold_tagged_computations(ep) -> int:
    """Fold every tagged computation whose tagging GEMM is in this (sub-)program.

    Outermost GEMMs go first, so a computation nested inside another one's
    disappears with it. Returns how many computations were folded.
    """
    gemms = [n for n in ep.graph.nodes if n.op == "call_function" and GEMM_KEY in n.meta]
    erased: set = set()
    folded = 0
    for gemm in reversed(gemms):
        if gemm in erased:
            continue
        for idx, token in sorted(gemm.meta[GEMM_KEY].items()):
            if idx >= len(gemm.args):
                continue
            nodes = _computation(
                ep, gemm, gemm.args[idx], member=lambda n, t=token: t in n.meta.get(COMPUTATION_KEY, ())
            )
            if not nodes:
                continue
            value = _evaluate(ep, nodes)
            erased.update(nodes)
            _replace_with_parameter(ep, gemm, nodes, value)
            folded += 1
    if folded:
        ep.graph.lint()
        ep.graph_module.recompile()
    return folded


_install_lock = threading.Lock()
_installed: dict = {}


@contextlib.contextmanager
def install_fold() -> Iterator[None]:
    """Run :func:`fold_tagged_computations` first in every XNNPACK preprocess, while entered.

    1.5.1 offers no hook for a backend pass, so ``XnnpackBackend.preprocess``
    is wrapped; the exact original attribute is put back on exit, exceptions
    included. Installing twice is an error, not a silent no-op.
    """
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    with _install_lock:
        current = XnnpackBackend.__dict__["preprocess"]
        if _installed or getattr(current.__func__, "_etprop_fold", False):
            raise RuntimeError("the xnnpack+fold preprocess hook is already installed")
        original = current.__func__

        def preprocess(edge_program, compile_specs):
            fold_tagged_computations(edge_program)
            return original(edge_program, compile_specs)

        preprocess._etprop_fold = True
        preprocess.__wrapped__ = original
        XnnpackBackend.preprocess = staticmethod(preprocess)
        _installed["original"] = current
    try:
        yield
    finally:
        with _install_lock:
            XnnpackBackend.preprocess = _installed.pop("original")


def upstream_has_fold() -> bool:
    """Whether the installed ExecuTorch already folds computed GEMM weights itself."""
    import importlib

    try:
        passes = importlib.import_module("executorch.backends.xnnpack._passes")
    except ImportError:
        return False
    return any("fold" in name.lower() and "weight" in name.lower() for name in dir(passes))


# Standalone repro scripts have no context hook: their partitioners() installs
# the fold for the rest of the (short-lived) script.
FOLD_RECIPE = """
_fold_hook = []


def partitioners():
    from etprop.candidates.xnnpack_fold import FoldingXnnpackPartitioner, install_fold, upstream_has_fold

    if upstream_has_fold():
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        return [XnnpackPartitioner()]
    if not _fold_hook:
        _fold_hook.append(install_fold())
        _fold_hook[0].__enter__()
    return [FoldingXnnpackPartitioner()]


def transform_passes():
    return []


def compile_config():
    return None
"""


def _partitioners() -> list:
    if upstream_has_fold():
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        return [XnnpackPartitioner()]
    return [FoldingXnnpackPartitioner()]


def _context():
    return contextlib.nullcontext() if upstream_has_fold() else install_fold()


XNNPACK_FOLD = register(
    Flow(
        name="xnnpack+fold",
        description="XNNPACK with GEMM weights/biases computed from parameters folded into the delegate",
        partitioners=_partitioners,
        context=_context,
        baseline="xnnpack",
        repro_recipe=FOLD_RECIPE,
        # Not "gemm_computed_weight": oracles.coverage counts every weight computed
        # from constants, and this flow refuses some by design (low-rank products,
        # shared computations, sources used elsewhere, mutated buffers).
        promises=Promises(delegates=XNNPACK_GEMMS_WITH_PARAMETER_WEIGHTS),
    )
)
