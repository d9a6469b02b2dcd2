"""One lowering per (program, flow), every stage's artifact kept for the oracles.

export → to_edge_transform_and_lower → to_executorch → .pte bytes. The export
is shared between flows lowering the same program (a baseline and a candidate
cost one export and two lowerings). Each stage's failure is classified, so a
report can say *where* a lowering broke.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from etprop.flows.base import Flow
from etprop.lowering import reach, stages
from etprop.program.builder import BuiltProgram
from etprop.program.spec import all_nodes
from etprop.verdicts.outcomes import Outcome


@dataclass
class Lowering:
    flow: Flow
    built: BuiltProgram
    exported: dict[str, Any]
    edge: Any = None  # EdgeProgramManager (after partitioning)
    executorch: Any = None  # ExecutorchProgramManager
    pte: Optional[bytes] = None
    outcome: Optional[Outcome] = None  # set when a stage failed
    error: str = ""
    # Partitioner results recorded at partition time (see oracles/cycles.py).
    partitions: list = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    # What the runtime returned, per (method, input kind) the equivalence
    # oracle checked: the campaign corpus mutation analysis scores.
    observed: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.outcome is None


class ExportFailed(Exception):
    """torch.export rejected a drawn program: a strategy bug, never a finding."""


def export_program(built: BuiltProgram) -> dict[str, Any]:
    exported = {}
    for method in built.methods:
        try:
            exported[method] = torch.export.export(
                built.method_module(method),
                built.inputs(method),
                dynamic_shapes=built.dynamic_shapes(method),
                strict=False,
            )
        except Exception as exc:
            raise ExportFailed(f"torch.export rejected method '{method}': {type(exc).__name__}: {exc}") from exc
    return exported


def _mutable_buffer_names(built: BuiltProgram) -> list[str]:
    return [name for name, entry in built.spec["state"].items() if entry["kind"] == "buffer" and entry.get("mutable")]


def backend_config(flow: Flow, built: BuiltProgram):
    """The flow's ExecutorchBackendConfig, plus serialized initial values for
    mutable buffers: 1.5.1 leaves them uninitialized by default, and eager
    starts from the values the module was built with."""
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    config = flow.backend_config() if flow.backend_config else ExecutorchBackendConfig()
    mutable = _mutable_buffer_names(built)
    if mutable:
        config.passes = list(config.passes) + [InitializedMutableBufferPass(mutable)]
    return config


def _raised_in(exc: BaseException, filename_suffix: str, function: str) -> bool:
    """Whether ``exc`` was raised by ``function`` of the file ending in ``filename_suffix``."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and frames[-1].filename.endswith(filename_suffix) and frames[-1].name == function


def _is_emitter_while_loop_limitation(exc: BaseException, stage: str, built: BuiltProgram) -> bool:
    """The one known limitation of executorch 1.5.1: its emitter has no
    while_loop (``_emit_control_flow`` raises InternalError for it). Decided by
    the stage, the exception type and where it was raised, never by a word."""
    try:
        from executorch.exir.error import InternalError
    except ImportError:
        return False
    return (
        stage == "to_executorch"
        and isinstance(exc, InternalError)
        and _raised_in(exc, "exir/emit/_emitter.py", "_emit_control_flow")
        and any(node["op"] == "while_loop" for _, node in all_nodes(built.spec))
    )


def _classify_lowering_error(exc: BaseException, stage: str, lowering: "Lowering") -> Outcome:
    if stage == "serialization":
        return Outcome.SERIALIZATION_ERROR
    if _is_emitter_while_loop_limitation(exc, stage, lowering.built):
        return Outcome.UNSUPPORTED
    # A partitioner whose recorded partitions form a cycle: the evidence, not the message.
    if any(record["cycle"] or record["not_convex"] for record in lowering.partitions):
        return Outcome.VIOLATION
    return Outcome.LOWERING_ERROR


def _recording(partitioner, records: list):
    """Make ``partitioner`` record each result's tags before they are fused.
    The instance keeps its class, so nothing downstream sees a wrapper."""
    from etprop.lowering.partition_facts import snapshot

    inner = partitioner.partition

    def partition(exported_program):
        result = inner(exported_program)
        records.extend(snapshot(result.tagged_exported_program.graph_module, result.partition_tags))
        return result

    partitioner.partition = partition
    return partitioner


def lower(built: BuiltProgram, flow: Flow, exported: Optional[dict] = None) -> Lowering:
    """Lower once; never raises for ExecuTorch's failures (they are outcomes)."""
    from executorch.exir import to_edge_transform_and_lower

    started = time.perf_counter()
    if exported is None:
        with stages.timed("torch"):
            exported = export_program(built)
    lowering = Lowering(flow=flow, built=built, exported=exported)
    lowering.seconds["export"] = time.perf_counter() - started
    with flow.context(), stages.timed("executorch"), reach.measuring():
        stage = "lowering"
        try:
            stages.enter("lowering", flow.name)
            t0 = time.perf_counter()
            lowering.edge = to_edge_transform_and_lower(
                dict(exported),
                partitioner=[_recording(p, lowering.partitions) for p in flow.partitioners()] or None,
                transform_passes=flow.transform_passes() or None,
                compile_config=flow.compile_config() if flow.compile_config else None,
            )
            t1 = time.perf_counter()
            stage = "to_executorch"
            stages.enter("to_executorch", flow.name)
            lowering.executorch = lowering.edge.to_executorch(backend_config(flow, built))
            stage = "serialization"
            stages.enter("serialization", flow.name)
            t2 = time.perf_counter()
            lowering.pte = lowering.executorch.buffer
            lowering.seconds.update(lower=t1 - t0, to_executorch=t2 - t1, serialize=time.perf_counter() - t2)
        except Exception as exc:
            lowering.outcome = _classify_lowering_error(exc, stage, lowering)
            if stage == "to_executorch":
                lowering.error = "to_executorch: "
            first, _, rest = str(exc).partition("\n")
            lowering.error += (
                f"{type(exc).__name__}: {first}{_cause(exc)}"
                + (f"\n{rest}" if rest else "")
                + f"\n{_short_traceback(exc)}"
            )
    return lowering


def _cause(exc: BaseException) -> str:
    """The innermost exception a wrapper re-raised from, on the message's
    first line: ExecuTorch's pass manager says only which pass failed, and
    failures of one pass for different reasons are different defects."""
    inner = exc
    while inner.__cause__ is not None:
        inner = inner.__cause__
    if inner is exc:
        return ""
    frames = traceback.extract_tb(inner.__traceback__)
    where = f" in {frames[-1].name}" if frames else ""
    return f" (cause: {type(inner).__name__}: {str(inner).splitlines()[0] if str(inner) else ''}{where})"


def _short_traceback(exc: BaseException, limit: int = 6) -> str:
    return "".join(traceback.format_exception(exc, limit=-limit)[-limit:])
