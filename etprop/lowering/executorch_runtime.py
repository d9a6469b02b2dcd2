"""Running a lowered program: the real .pte in the ExecuTorch runtime, or, for
Core AI delegates (which that runtime cannot run), etprop's Core AI interpreter."""

from __future__ import annotations

from typing import Protocol

import torch

from etprop.lowering import stages


class ProgramRunner(Protocol):
    def run(self, method: str, inputs: tuple) -> list[torch.Tensor]: ...


class PteRunner:
    """Runs .pte bytes with executorch.runtime.

    ``Runtime.load_program(bytes)`` does not keep the buffer alive in 1.5.1
    (the program segfaults once it is collected), so the runner holds it.
    Mutable buffers persist across runs of one runner (the runtime's Method is
    stateful), so the equivalence oracle compares stateful programs as a
    sequence of calls.
    """

    keeps_state = True

    def __init__(self, pte: bytes, flow: str = ""):
        from executorch.runtime import Runtime

        self._buffer = pte
        self._flow = flow
        stages.enter("runtime load", flow)
        self._program = Runtime.get().load_program(self._buffer)

    def run(self, method: str, inputs: tuple) -> list[torch.Tensor]:
        stages.enter(f"runtime execution of '{method}'", self._flow)
        loaded = self._program.load_method(method)
        if loaded is None:
            raise RuntimeError(f"method '{method}' could not be loaded from the .pte")
        outputs = loaded.execute(list(inputs))
        return [t.clone() if isinstance(t, torch.Tensor) else t for t in outputs]


def runner_for(lowering) -> ProgramRunner:
    if lowering.flow.make_runner is not None:
        return lowering.flow.make_runner(lowering)
    if lowering.flow.runtime == "coreai":
        stages.enter("Core AI execution", lowering.flow.name)
        from etprop.lowering.coreai_runtime import CoreAIProgram

        return CoreAIProgram(lowering.executorch)
    return PteRunner(lowering.pte, lowering.flow.name)
