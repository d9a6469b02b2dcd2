"""Delegation coverage: which ops a lowering left on portable kernels.

Counts, per method (control-flow submodules included), the ops of the lowered
edge program that run outside any delegate, and enforces what the flow
promises to delegate (``Promises.delegates``):

- ``gemm_static_weight``: a convolution, linear, addmm or mm whose weight (and
  bias, if any) is a parameter, buffer or constant (through views/permutes)
  runs in a delegate;
- ``gemm_computed_weight``: the same for a weight or bias computed only from
  such tensors (weight_norm & co.), and the computation goes with it;
- ``gemm_quantized_weight``: a GEMM whose weight is dequantized from a
  static int8 tensor (a PT2E-quantized program's Q/DQ pattern) runs in a
  delegate: left outside, the pattern was not fused into a quantized operator;
- ``gemm_in_control_flow``: the claims above also hold inside cond/map/scan
  bodies, where a weight placeholder that always receives a top-level
  parameter, buffer or constant is static (without it, only top-level GEMMs
  are judged, so stock XNNPACK is not blamed for bodies it never enters).

Claims hold for the dtypes the flow names (``Promises.delegate_dtypes``).
A GEMM left outside a delegate that the flow claims is a silent slow fallback:
the failure names the node, its op and its weight.
"""

from __future__ import annotations

from collections import Counter

import torch.fx

from etprop.lowering.partition_facts import graph_modules
from etprop.oracles import Verdict

NAME = "delegation coverage"
_IGNORED = {"getitem", "executorch_call_delegate", "alloc", "_assert_tensor_metadata"}
# GEMM op → index of its weight argument.
GEMM_WEIGHT_ARG = {"convolution": 1, "linear": 1, "addmm": 2, "mm": 1}
# GEMM op → index of its bias argument (when it has one).
GEMM_BIAS_ARG = {"convolution": 2, "linear": 2, "addmm": 0}
_VIEWS = {
    "permute_copy",
    "permute",
    "t_copy",
    "t",
    "view_copy",
    "view",
    "reshape",
    "transpose",
    "expand_copy",
    "unsqueeze_copy",
    "squeeze_copy",
    "_to_copy",
    "clone",
}


def op_name(node) -> str:
    target = node.target
    schema = getattr(target, "_schema", None)
    name = schema.name if schema is not None else getattr(target, "__name__", str(target))
    return name.split("::")[-1].split(".")[0]


def portable_ops(lowering) -> Counter:
    """Ops outside delegates across all methods: {op name: count}."""
    counts: Counter = Counter()
    for method in lowering.built.methods:
        program = lowering.edge.exported_program(method)
        for _, gm in graph_modules(program.graph_module):
            for node in gm.graph.nodes:
                if node.op == "call_function" and op_name(node) not in _IGNORED:
                    counts[op_name(node)] += 1
    return counts


def delegate_calls(lowering) -> int:
    """Delegate calls across all methods, control-flow submodules included."""
    return sum(
        1
        for method in lowering.built.methods
        for _, gm in graph_modules(lowering.edge.exported_program(method).graph_module)
        for node in gm.graph.nodes
        if node.op == "call_function" and op_name(node) == "executorch_call_delegate"
    )


# Matrix products count as one kind when comparing two lowerings: a flow that
# keeps ``linear`` whole leaves a ``linear`` where another decomposed it into
# ``addmm`` (plus a transpose), and neither is worse.
_MATMULS = {"linear", "addmm", "mm", "bmm", "matmul"}
_MATMUL_KIND = "matrix product (" + "/".join(sorted(_MATMULS)) + ")"


def grouped(counts: Counter) -> Counter:
    """Ops outside delegates, every matrix product counted as one kind."""
    result: Counter = Counter()
    for op, n in counts.items():
        result[_MATMUL_KIND if op in _MATMULS else op] += n
    return result


def _static_inputs(program) -> set[str]:
    signature = program.graph_signature
    return (
        set(signature.inputs_to_parameters)
        | set(signature.inputs_to_buffers)
        | set(signature.inputs_to_lifted_tensor_constants)
    )


_DEQUANTIZE = {"dequantize_per_tensor", "dequantize_per_channel"}


def _source_kind(node, static: set[str], depth: int = 0, known: dict | None = None) -> str:
    """'static' (a parameter through views), 'quantized' (dequantized from a
    static tensor), 'computed' (only from static tensors), or 'dynamic'
    (depends on a user input). Each node is classified once per call: an
    unrolled loop reaches its nodes along exponentially many paths."""
    known = {} if known is None else known
    if node not in known:
        known[node] = _classify(node, static, depth, known)
    return known[node]


def _classify(node, static: set[str], depth: int, known: dict) -> str:
    if node.op == "placeholder":
        return "static" if node.name in static else "dynamic"
    if node.op == "get_attr":
        return "static"
    if node.op != "call_function" or depth > 64:
        return "dynamic"
    # Positional operands only: after to_executorch, ``out=`` kwargs name alloc nodes.
    operands = [arg for arg in node.args if isinstance(arg, torch.fx.Node)]
    kinds = {_source_kind(arg, static, depth + 1, known) for arg in operands}
    if "dynamic" in kinds or not kinds:
        return "dynamic"
    if len(kinds) == 1 and kinds <= {"static", "quantized"} and op_name(node) in _VIEWS:
        return kinds.pop()
    if op_name(node) in _DEQUANTIZE and _source_kind(operands[0], static, depth + 1, known) == "static":
        return "quantized"
    return "computed"


def _invariant_operands(node):
    """(body modules, operands in body-placeholder order, first operand every
    iteration receives unchanged) for cond/map/scan, else None. The mapped
    slice, scan carries and scanned inputs change per iteration."""
    hop = torch.ops.higher_order
    if node.op != "call_function":
        return None
    if node.target is hop.cond:
        bodies, operands, start = node.args[1:3], list(node.args[3]), 0
    elif node.target is hop.map_impl:
        bodies, operands, start = node.args[:1], list(node.args[1]) + list(node.args[2]), len(node.args[1])
    elif node.target is hop.scan:
        init, xs, extra = node.args[1:4]
        bodies, operands, start = node.args[:1], list(init) + list(xs) + list(extra), len(init) + len(xs)
    else:
        return None
    owner = node.graph.owning_module
    return [getattr(owner, b.target) for b in bodies], operands, start


def _body_graphs(graph_module, static: set[str], prefix: str):
    """(path, body graph, names of its placeholders that always receive a
    top-level parameter, buffer or constant) for every control-flow body."""
    for node in graph_module.graph.nodes:
        layout = _invariant_operands(node)
        if layout is None:
            continue
        bodies, operands, start = layout
        for index, body in enumerate(bodies):
            placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
            inner = {
                ph.name
                for i, (ph, operand) in enumerate(zip(placeholders, operands))
                if i >= start
                and isinstance(operand, torch.fx.Node)
                and operand.op == "placeholder"
                and operand.name in static
            }
            path = f"{prefix}/{node.name}[{index}]"
            yield path, body.graph, inner
            yield from _body_graphs(body, inner, path)


def undelegated_gemms(
    lowering, in_control_flow: bool = False, dtypes=None, weight_only: bool = False
) -> list[tuple[str, str, str, str]]:
    """(method, node, op, weight kind) for GEMMs with non-dynamic weights left on portable.

    With ``in_control_flow``, GEMMs in cond/map/scan bodies count too: a body
    placeholder is a static weight when it always receives one. With
    ``dtypes``, only GEMMs producing one of those dtypes count. The kind is
    the least static of weight and bias, or with ``weight_only`` the weight's.
    """
    return [
        (where, node.name, name, kind)
        for where, node, name, kind in _undelegated_nodes(lowering, in_control_flow, dtypes, weight_only)
    ]


def _undelegated_nodes(lowering, in_control_flow: bool, dtypes, weight_only: bool):
    for method in lowering.built.methods:
        program = lowering.edge.exported_program(method)
        static = _static_inputs(program)
        graphs = [(method, program.graph_module.graph, static)]
        if in_control_flow:
            graphs += [
                (f"{method}{path}", graph, inner)
                for path, graph, inner in _body_graphs(program.graph_module, static, "")
            ]
        for where, graph, names in graphs:
            for node, name, kind in _undelegated_in(graph, names, dtypes, weight_only):
                yield where, node, name, kind


def _dtype_of(node) -> str:
    value = node.meta.get("val")
    return str(value.dtype).removeprefix("torch.") if isinstance(value, torch.Tensor) else ""


def _undelegated_in(graph, static: set[str], dtypes=None, weight_only: bool = False):
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if dtypes is not None and _dtype_of(node) not in dtypes:
            continue
        name = op_name(node)
        index = GEMM_WEIGHT_ARG.get(name)
        if index is None or len(node.args) <= index:
            continue
        if name == "convolution" and len(node.args) > 6 and node.args[6]:
            continue  # transposed convolutions are not claimed
        kind = _source_kind(node.args[index], static)
        bias = GEMM_BIAS_ARG.get(name)
        if (
            not weight_only
            and kind in ("static", "quantized")
            and bias is not None
            and len(node.args) > bias
            and isinstance(node.args[bias], torch.fx.Node)
        ):
            # A GEMM is as static as its least static parameter: stock XNNPACK
            # packs weight and bias together and declines a computed bias,
            # a quantized weight's float bias (dynamic quantization) included.
            bias_kind = _source_kind(node.args[bias], static)
            if bias_kind not in ("static", "quantized"):
                kind = bias_kind
        if kind != "dynamic":
            yield node, name, kind


def check(lowering, lowerings=None) -> Verdict:
    ops = portable_ops(lowering)
    claims = lowering.flow.promises.delegates
    wanted = {"static"} if "gemm_static_weight" in claims else set()
    if "gemm_computed_weight" in claims:
        wanted.add("computed")
    if "gemm_quantized_weight" in claims:
        wanted.add("quantized")
    in_control_flow = "gemm_in_control_flow" in claims
    dtypes = lowering.flow.promises.delegate_dtypes
    missed = [g for g in undelegated_gemms(lowering, in_control_flow, dtypes) if g[3] in wanted] if wanted else []
    if missed:
        listed = ", ".join(f"{method}/{node} ({op}, {kind} weight)" for method, node, op, kind in missed[:10])
        if any(kind == "quantized" for *_, kind in missed):
            listed += "; a quantized GEMM outside a delegate means its Q/DQ pattern was not fused"
        return Verdict.failed(
            NAME,
            f"{len(missed)} GEMM(s) that {lowering.flow.name} promises to delegate run on portable kernels: {listed}",
            missed=missed,
            portable=dict(ops),
        )
    patterns = quantized_patterns(lowering)
    note = ""
    if patterns:
        listed = ", ".join(
            f"{pattern} {delegated} of {total}" for pattern, (delegated, total) in sorted(patterns.items())
        )
        note = f"; GEMMs with a quantized weight inside a delegate: {listed}"
    return Verdict.passed(
        NAME, f"{sum(ops.values())} ops outside delegates{note}", portable=dict(ops), quantized_patterns=patterns
    )


# The claimed GEMMs as torch.export writes them (before edge decompositions).
_EXPORTED_GEMMS = {"linear": 1, "conv1d": 1, "conv2d": 1, "convolution": 1, "addmm": 2, "mm": 1}


def _gemm_pattern(name: str, node, index: int) -> str:
    """The quantized operator a GEMM's Q/DQ pattern fuses into: ``linear`` for
    a matrix product, ``conv1d``/``conv2d`` by the convolution weight's rank."""
    if name not in ("convolution", "conv1d", "conv2d"):
        return "linear"
    weight = node.args[index].meta.get("val") if isinstance(node.args[index], torch.fx.Node) else None
    return f"conv{weight.dim() - 2}d" if isinstance(weight, torch.Tensor) else name


def quantized_gemms(lowering) -> Counter:
    """Per pattern, GEMMs whose weight is a dequantized constant in the exported
    (not yet partitioned) program, control-flow bodies included."""
    counts: Counter = Counter()
    for method, program in lowering.exported.items():
        static = _static_inputs(program)
        graphs = [(program.graph_module.graph, static)] + [
            (graph, inner) for _, graph, inner in _body_graphs(program.graph_module, static, "")
        ]
        for graph, names in graphs:
            for node in graph.nodes:
                index = _EXPORTED_GEMMS.get(op_name(node)) if node.op == "call_function" else None
                if (
                    index is not None
                    and len(node.args) > index
                    and _source_kind(node.args[index], names) == "quantized"
                ):
                    counts[_gemm_pattern(op_name(node), node, index)] += 1
    return counts


def quantized_patterns(lowering) -> dict[str, tuple[int, int]]:
    """Per quantized pattern (``linear``, ``conv1d``, ``conv2d``): (inside a
    delegate, in the program), what a campaign reports per flow."""
    total = quantized_gemms(lowering)
    left: Counter = Counter()
    for _, node, name, kind in _undelegated_nodes(lowering, True, None, True):
        if kind == "quantized":
            left[_gemm_pattern(name, node, GEMM_WEIGHT_ARG[name])] += 1
    return {pattern: (max(0, count - left[pattern]), count) for pattern, count in total.items()}
