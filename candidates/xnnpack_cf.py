"""Candidate (b): XNNPACK GEMMs inside ``cond``, ``map`` and ``scan`` bodies.

torch.export lifts a parameter used in a body to the top-level program and
passes it to the higher-order op as an operand; inside the body it is a plain
placeholder. executorch 1.5.1's XnnpackPartitioner tags the top-level graph
only, so those GEMMs run on portable kernels (and when a body placeholder
happens to share a top-level parameter's name, the partitioner's
do-not-decompose check accepts a linear nobody delegates and the lowering
fails). This flow:

* :class:`ControlFlowXnnpackPartitioner` partitions the top level exactly as
  stock, then every control-flow body at every depth, through a view of the
  body in which a placeholder that always receives the same top-level
  parameter, buffer or constant *is* that tensor. Per-iteration values (the
  mapped slice, scan carries and inputs) never are. An alias is kept only when
  every use of the tensor, at top level and in every body it reaches (both
  cond branches), is a delegate that embeds it; otherwise the tensor would be
  stored twice, so the alias is dropped and the partitioning redone.
* :func:`install_control_flow_weights` (the flow's context) makes the lowering
  embed such a weight in the body's delegate (the delegate call no longer
  passes it) and, after ``to_backend``, removes what became unused: the
  higher-order op's operand, the body placeholder (in both cond branches), the
  top-level parameter and its signature entry.

Promise: weights are *embedded* in the body's delegate, not kept as top-level
constants passed to it at run time (an upstream design might do that). XNNPACK
keys embedded data by content, so a weight used in a body and at top level, or
in several bodies, is still stored once: ``Promises.weights_stored_once``.

executorch is imported only inside functions, so the registry loads fast.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
from dataclasses import dataclass
from typing import Any, Iterator

from etprop.flows import register
from etprop.flows.base import Flow, Promises
from etprop.flows.stock import XNNPACK_GEMMS_WITH_PARAMETER_WEIGHTS

# node.meta keys set by the partitioner and read by the installed lowering.
ALIAS_KEY = "etprop_cf_alias"  # body placeholder -> top-level InputSpec it stands for
EDGES_KEY = "etprop_cf_consumed"  # higher-order op -> operand positions whose weight is embedded
SOURCE_KEY = "etprop_cf_source"  # top-level placeholder whose uses in bodies are embedded

_tags = itertools.count()


@dataclass(frozen=True)
class Edge:
    """One invariant operand position of a higher-order op and the body placeholders receiving it."""

    hop: Any
    index: int
    placeholders: tuple


def _hop_layout(node):
    """(body graph modules, operands in placeholder order, first invariant position), or None.

    cond passes its operands unchanged to both branches; map_impl slices its
    ``xs`` and passes ``pos_args`` unchanged; scan passes carries and slices
    first, then ``additional_inputs`` unchanged.
    """
    import torch

    if node.op != "call_function":
        return None
    owner = node.graph.owning_module
    hop = torch.ops.higher_order
    if node.target is hop.cond:
        bodies, operands, start = node.args[1:3], list(node.args[3]), 0
    elif node.target is hop.map_impl:
        bodies, operands, start = node.args[:1], list(node.args[1]) + list(node.args[2]), len(node.args[1])
    elif node.target is hop.scan:
        init, xs, extra = node.args[1], node.args[2], node.args[3]
        bodies, operands, start = node.args[:1], list(init) + list(xs) + list(extra), len(init) + len(xs)
    else:
        return None
    modules = [getattr(owner, b.target) for b in bodies]
    return modules, operands, start


def _placeholders(gm) -> list:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _static_specs(ep) -> dict:
    """Top-level placeholder name -> InputSpec for parameters, unmutated buffers and constants."""
    from torch.export.graph_signature import InputKind, TensorArgument

    sig = ep.graph_signature
    mutated = set(sig.buffers_to_mutate.values())
    kinds = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
    return {
        spec.arg.name: spec
        for spec in sig.input_specs
        if spec.kind in kinds
        and isinstance(spec.arg, TensorArgument)
        and not (spec.kind == InputKind.BUFFER and spec.target in mutated)
    }


def _edges(gm) -> list[Edge]:
    """Every invariant operand edge in ``gm`` and in its bodies, outermost first."""
    found = []
    for node in gm.graph.nodes:
        layout = _hop_layout(node)
        if layout is None:
            continue
        modules, operands, start = layout
        for index in range(start, len(operands)):
            phs = tuple(_placeholders(m)[index] for m in modules)
            found.append(Edge(node, index, phs))
        for module in dict.fromkeys(modules):
            found.extend(_edges(module))
    return found


def _operand(edge: Edge):
    return _hop_layout(edge.hop)[1][edge.index]


class _BodyView:
    """What the XNNPACK configs read of an ExportedProgram, for one body graph.

    Aliased placeholders are parameters/buffers/constants of the view, with the
    top-level target, so ``is_param_node``/``get_param_tensor`` see the real
    weight; every other placeholder is a user input.
    """

    def __init__(self, gm, aliases: dict, ep):
        from torch.export.graph_signature import (
            ExportGraphSignature,
            InputKind,
            InputSpec,
            OutputKind,
            OutputSpec,
            TensorArgument,
        )

        inputs = []
        for ph in _placeholders(gm):
            spec = aliases.get(ph)
            if spec is None:
                inputs.append(InputSpec(InputKind.USER_INPUT, TensorArgument(ph.name), None))
            else:
                inputs.append(InputSpec(spec.kind, TensorArgument(ph.name), spec.target, spec.persistent))
        outputs = [
            OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(a.name), None)
            for a in gm.graph.output_node().args[0]
            if hasattr(a, "name")
        ]
        self.graph_module = gm
        self.graph = gm.graph
        self.graph_signature = ExportGraphSignature(inputs, outputs)
        self.state_dict = ep.state_dict
        self.constants = ep.constants
        self.verifier = getattr(ep, "verifier", None)


def _is_clone(node) -> bool:
    parts = getattr(node.target, "__name__", "").split(".")
    return node.op == "call_function" and len(parts) > 1 and parts[-2] in ("clone", "_clone_dim_order")


def _without_passthrough_clones(part: list) -> list:
    """Leave out a clone whose result and input would both leave the partition.

    XNNPACK's preprocess removes the clone, the delegate then returns one
    value twice and 1.5.1 rejects it as a pass-through (also at top level:
    findings/repros/xnnpack_clone_output_passthrough.py). Scan bodies return
    ``carry, carry.clone()``, so every scan would hit it.
    """
    members = set(part)
    while True:
        drop = {
            n
            for n in members
            if _is_clone(n)
            and n.args[0] in members
            and not set(n.users) & members
            and set(n.args[0].users) - members - {n}
        }
        if not drop:
            return [n for n in part if n in members]
        members -= drop


@dataclass
class Plan:
    """Which body partitions to tag and which operand edges embed their weight."""

    partitions: dict  # body graph module -> list of node lists
    edges: list  # usable Edges
    sources: set  # top-level placeholders consumed through edges
    aliases: dict  # body placeholder -> top-level InputSpec


def _bodies(gm) -> list:
    """Every control-flow body graph module under ``gm``, at any depth, once each."""
    found = {}
    for node in gm.graph.nodes:
        layout = _hop_layout(node)
        if layout is not None:
            for module in layout[0]:
                if module not in found:
                    found[module] = None
                    found.update(dict.fromkeys(_bodies(module)))
    return list(found)


def _plan(partitioner, ep, top_tagged=None) -> Plan:
    """Partition every body under aliases, dropping aliases until each aliased
    tensor is wholly consumed by delegates (the fixpoint only ever drops)."""
    top = ep.graph_module
    bodies = _bodies(top)
    if not bodies:
        return Plan({}, [], set(), {})
    static = _static_specs(ep)
    edges = _edges(top)
    if top_tagged is None:
        top_tagged = {n for p in partitioner.generate_partitions(ep) for n in p.nodes}
    blocked: set = set()
    while True:
        aliases, source_of, live = {}, {}, []
        for edge in edges:  # outermost first: a nested operand's alias is already known
            if (edge.hop, edge.index) in blocked:
                continue
            operand = _operand(edge)
            if operand.graph is top.graph:
                spec = static.get(operand.name) if operand.op == "placeholder" else None
                source = operand
            else:
                spec, source = aliases.get(operand), source_of.get(operand)
            if spec is None:
                continue
            live.append(edge)
            for ph in edge.placeholders:
                aliases[ph], source_of[ph] = spec, source
        partitions = {}
        for gm in bodies:
            view = _BodyView(gm, {p: s for p, s in aliases.items() if p.graph is gm.graph}, ep)
            partitions[gm] = [
                _without_passthrough_clones([n for n in p.nodes if n.op != "placeholder"])
                for p in partitioner.generate_partitions(view)
            ]
        tagged = set(top_tagged)
        for parts in partitions.values():
            for part in parts:
                tagged.update(part)
        live_at = {(e.hop, e.index): e for e in live}

        @functools.cache
        def consumed(node) -> bool:
            """Every use embeds ``node``: a body delegate always does (the
            lowering turns the aliased input into its constant); a top-level
            delegate only when the partition took the placeholder itself."""
            embeds = node.graph is not top.graph or node in top_tagged
            for user in node.users:
                if user in tagged and embeds:
                    continue
                layout = _hop_layout(user)
                if layout is None:
                    return False
                for index, operand in enumerate(layout[1]):
                    if operand is node:
                        edge = live_at.get((user, index))
                        if edge is None or not all(consumed(ph) for ph in edge.placeholders):
                            return False
            return True

        newly = set()
        sources = {source_of[ph] for e in live for ph in e.placeholders}
        for source in sources:
            if not consumed(source):
                newly.update((e.hop, e.index) for e in live if source_of[e.placeholders[0]] is source)
        for edge in live:
            if not all(consumed(ph) for ph in edge.placeholders):
                newly.add((edge.hop, edge.index))
        if not newly:
            return Plan(partitions, live, sources, aliases)
        blocked |= newly


@functools.cache
def _partitioner_class():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    class ControlFlowXnnpackPartitioner(XnnpackPartitioner):
        """XnnpackPartitioner that also delegates inside control-flow bodies."""

        def partition(self, exported_program):
            result = super().partition(exported_program)
            if not _installed:
                return result
            top_tagged = {
                n
                for n in exported_program.graph_module.graph.nodes
                if n.meta.get("delegation_tag") in result.partition_tags
            }
            plan = _plan(self, exported_program, top_tagged)
            for parts in plan.partitions.values():
                for part in parts:
                    tag = f"cf_tag{next(_tags)}"
                    for node in part:
                        node.meta["delegation_tag"] = tag
                    result.partition_tags[tag] = self.delegation_spec
            for ph, spec in plan.aliases.items():
                ph.meta[ALIAS_KEY] = spec
            for edge in plan.edges:
                edge.hop.meta.setdefault(EDGES_KEY, set()).add(edge.index)
            for source in plan.sources:
                source.meta[SOURCE_KEY] = True
            return result

        def ops_to_not_decompose(self, ep):
            """Stock answer at top level; in a body, only what the plan delegates.

            The stock filter judges body nodes against the top-level signature
            by name, so it keeps a body linear whose weight placeholder shares a
            parameter's name although nothing delegates it, and the lowering fails.
            """
            ops, stock_filter = super().ops_to_not_decompose(ep)
            if not _installed:
                return ops, stock_filter
            top = ep.graph_module.graph
            delegated = {}

            def filter_fn(node) -> bool:
                if node.graph is top:
                    return stock_filter(node)
                if "nodes" not in delegated:
                    plan = _plan(self, ep)
                    delegated["nodes"] = {n for parts in plan.partitions.values() for p in parts for n in p}
                return node in delegated["nodes"]

            return ops, filter_fn

    return ControlFlowXnnpackPartitioner


def ControlFlowXnnpackPartitioner(*args, **kwargs):
    """Build the control-flow-aware partitioner (the class is made on first use)."""
    return _partitioner_class()(*args, **kwargs)


def _embed_aliased_inputs(program, call_module_node, owning_program) -> None:
    """Turn the fused body partition's aliased user inputs into its own constants.

    The delegate then serializes the weight, and the call no longer passes it.
    """
    from torch.export.graph_signature import InputKind, InputSpec, TensorArgument
    from torch.utils import _pytree as pytree

    aliased = [a for a in call_module_node.args if hasattr(a, "meta") and ALIAS_KEY in a.meta]
    if not aliased:
        return
    graph, sig = program.graph_module.graph, program.graph_signature
    by_name = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    specs = {s.arg.name: s for s in sig.input_specs}
    for arg in aliased:
        ph = by_name.get(arg.name)
        if ph is None or specs[ph.name].kind != InputKind.USER_INPUT:
            continue
        top = arg.meta[ALIAS_KEY]
        specs[ph.name] = InputSpec(top.kind, TensorArgument(ph.name), top.target, top.persistent)
        if top.target in owning_program.state_dict:
            program.state_dict[top.target] = owning_program.state_dict[top.target]
        else:
            program.constants[top.target] = owning_program.constants[top.target]
        call_module_node.args = tuple(a for a in call_module_node.args if a is not arg)
    rank = {InputKind.PARAMETER: 0, InputKind.BUFFER: 1, InputKind.CONSTANT_TENSOR: 2}
    ordered = sorted(by_name.values(), key=lambda n: rank.get(specs[n.name].kind, 3))
    _reorder_placeholders(graph, ordered)
    sig.input_specs[:] = [specs[n.name] for n in ordered]
    for entry in program.module_call_graph[:1]:
        entry.signature.in_spec = pytree.tree_flatten((tuple(sig.user_inputs), {}))[1]
    program.graph_module.recompile()


def _reorder_placeholders(graph, ordered) -> None:
    """Put the placeholders first, in ``ordered`` order."""
    anchor = None
    for node in ordered:
        if anchor is None:
            next(iter(graph.nodes)).prepend(node)
        else:
            anchor.append(node)
        anchor = node


def _remove_consumed(program) -> None:
    """Drop operands, body placeholders and top-level inputs that embedding left unused."""
    top = program.graph_module
    for edge in reversed(_edges(top)):  # innermost first: outer placeholders free up
        consumed = edge.hop.meta.get(EDGES_KEY, set())
        if edge.index not in consumed or any(ph.users for ph in edge.placeholders):
            continue
        _drop_operand(edge)
    sig = program.graph_signature
    dropped = []
    for node in list(top.graph.nodes):
        if node.op == "placeholder" and node.meta.get(SOURCE_KEY) and not node.users:
            dropped.append(node.name)
            top.graph.erase_node(node)
    if dropped:
        gone = {s.target for s in sig.input_specs if s.arg.name in dropped}
        sig.input_specs[:] = [s for s in sig.input_specs if s.arg.name not in dropped]
        still = {s.target for s in sig.input_specs}
        for target in gone - still:
            program.state_dict.pop(target, None)
            program.constants.pop(target, None)
    for gm in _graph_modules(top):
        for node in gm.graph.nodes:
            for key in (ALIAS_KEY, EDGES_KEY, SOURCE_KEY):
                node.meta.pop(key, None)
        gm.graph.lint()
        gm.recompile()


def _graph_modules(gm):
    yield gm
    for child in gm.children():
        if hasattr(child, "graph"):
            yield from _graph_modules(child)


def _drop_operand(edge: Edge) -> None:
    import torch

    hop, index = edge.hop, edge.index
    for ph in edge.placeholders:
        if ph.graph is not None and ph in ph.graph.nodes:
            ph.graph.erase_node(ph)
    args = list(hop.args)
    if hop.target is torch.ops.higher_order.cond:
        operands = list(args[3])
        del operands[index]
        args[3] = type(hop.args[3])(operands)
    elif hop.target is torch.ops.higher_order.map_impl:
        pos = list(args[2])
        del pos[index - len(args[1])]
        args[2] = type(hop.args[2])(pos)
    else:
        extra = list(args[3])
        del extra[index - len(args[1]) - len(args[2])]
        args[3] = type(hop.args[3])(extra)
    hop.args = tuple(args)
    consumed = hop.meta.get(EDGES_KEY, set())
    hop.meta[EDGES_KEY] = {i - 1 if i > index else i for i in consumed if i != index}


_install_lock = threading.Lock()
_installed: dict = {}


@contextlib.contextmanager
def install_control_flow_weights() -> Iterator[None]:
    """Let delegates in control-flow bodies embed their aliased weights, while entered.

    1.5.1 offers no hook for any of this, so three attributes are replaced:

    * ``backend_api.create_exported_program_from_submodule`` (private): it
      builds a body partition's program with every input a user input;
    * ``EdgeProgramManager.to_backend``: afterwards, remove what the embedding
      left unused;
    * ``_program.get_control_flow_submodules`` (private), as seen by
      ``to_edge_transform_and_lower`` only: its do-not-decompose handling looks
      one level deep, so a linear in a nested body was decomposed before any
      partitioner saw it. The recursive version is what the other caller there
      (named-data collection, content-keyed) tolerates.

    The exact originals are put back on exit, exceptions included. Installing
    twice is an error.
    """
    from executorch.exir.backend import backend_api
    from executorch.exir.program import _program
    from executorch.exir.program._program import EdgeProgramManager

    with _install_lock:
        if _installed or getattr(backend_api.create_exported_program_from_submodule, "_etprop_cf", False):
            raise RuntimeError("the xnnpack+cf lowering hooks are already installed")
        create = backend_api.create_exported_program_from_submodule
        to_backend = EdgeProgramManager.__dict__["to_backend"]
        submodules = _program.get_control_flow_submodules

        def all_control_flow_submodules(graph_module):
            for entry in submodules(graph_module):
                yield entry
                yield from all_control_flow_submodules(entry[1])

        def create_exported_program_from_submodule(
            submodule, owning_program, tag, call_module_node, is_submodule, *args, **kwargs
        ):
            result = create(submodule, owning_program, tag, call_module_node, is_submodule, *args, **kwargs)
            if is_submodule:
                _embed_aliased_inputs(result[0], call_module_node, owning_program)
            return result

        @functools.wraps(to_backend)
        def to_backend_then_clean(self, *args, **kwargs):
            manager = to_backend(self, *args, **kwargs)
            for method in manager.methods:
                _remove_consumed(manager.exported_program(method))
            return manager

        create_exported_program_from_submodule._etprop_cf = True
        create_exported_program_from_submodule.__wrapped__ = create
        backend_api.create_exported_program_from_submodule = create_exported_program_from_submodule
        EdgeProgramManager.to_backend = to_backend_then_clean
        _program.get_control_flow_submodules = all_control_flow_submodules
        _installed.update(create=create, to_backend=to_backend, submodules=submodules)
    try:
        yield
    finally:
        with _install_lock:
            backend_api.create_exported_program_from_submodule = _installed.pop("create")
            EdgeProgramManager.to_backend = _installed.pop("to_backend")
            _program.get_control_flow_submodules = _installed.pop("submodules")


# Standalone repro scripts have no context hook: partitioners() installs the
# hooks for the rest of the (short-lived) script.
CF_RECIPE = """
_cf_hooks = []


def partitioners():
    from etprop.candidates.xnnpack_cf import ControlFlowXnnpackPartitioner, install_control_flow_weights

    if not _cf_hooks:
        _cf_hooks.append(install_control_flow_weights())
        _cf_hooks[0].__enter__()
    return [ControlFlowXnnpackPartitioner()]


def transform_passes():
    return []


def compile_config():
    return None
"""


def _partitioners() -> list:
    return [ControlFlowXnnpackPartitioner()]


XNNPACK_CF = register(
    Flow(
        name="xnnpack+cf",
        description="XNNPACK also inside cond/map/scan bodies; body weights embedded in the body's delegate",
        partitioners=_partitioners,
        context=install_control_flow_weights,
        baseline="xnnpack",
        repro_recipe=CF_RECIPE,
        # Weights are embedded in delegates (content-keyed, so stored once), not
        # passed as top-level constants at run time.
        promises=Promises(
            delegates=XNNPACK_GEMMS_WITH_PARAMETER_WEIGHTS | {"gemm_in_control_flow"}, weights_stored_once=True
        ),
    )
)
