"""Eager equivalence: the real lowered program, run on several inputs, matches eager.

Inputs per method: random normal, negative, zeros, large and small magnitudes
(builder.INPUT_KINDS), and for dynamic dims normal inputs at both bounds. The
.pte is run by the ExecuTorch runtime (Core AI programs by etprop's Core AI
interpreter); comparison follows oracles/tolerance.
"""

from __future__ import annotations

import torch

from etprop.lowering import stages
from etprop.oracles import Verdict, tolerance
from etprop.program.builder import INPUT_KINDS_DEFAULT
from etprop.verdicts.outcomes import Outcome

NAME = "eager equivalence"


def check(lowering, runner=None, kinds=INPUT_KINDS_DEFAULT) -> Verdict:
    from etprop.lowering.executorch_runtime import runner_for

    built = lowering.built
    try:
        with stages.timed("executorch"):
            runner = runner or runner_for(lowering)
    except Exception as exc:
        return Verdict.failed(NAME, f"program failed to load: {type(exc).__name__}: {exc}", Outcome.LOAD_ERROR)
    # A stateful program is compared as a sequence of calls: the runtime keeps
    # mutable buffers across executions, and so does eager here, both starting
    # from the initial values the module was built with.
    sequence = built.stateful and getattr(runner, "keeps_state", True)
    lowering.observed = []
    try:
        return _run_all(built, runner, kinds, lowering.flow.runtime, sequence, lowering.observed)
    finally:
        built.reset_state()


def cases(built, kinds=INPUT_KINDS_DEFAULT, sequence: bool | None = None):
    """(method, input kind, inputs) in the order the oracle runs them. Each
    method of a program owns its mutable buffers in ExecuTorch; eager shares
    them, so a stateful program's eager state restarts with each method."""
    sequence = built.stateful if sequence is None else sequence
    for method in built.methods:
        if sequence:
            built.reset_state()
        for kind, inputs in built.input_cases(method, kinds):
            yield method, kind, inputs


def _run_all(built, runner, kinds, runtime, sequence, observed: list) -> Verdict:
    checked = unstable = 0
    for method, kind, inputs in cases(built, kinds, sequence):
        with stages.timed("torch"):
            reference = built.reference(
                method,
                inputs,
                restore=not sequence,
                ulps=tolerance.op_ulps(runtime, built.spec.get("dtype", "float32")),
            )
        try:
            with stages.timed("executorch"):
                actual = runner.run(method, inputs)
        except Exception as exc:
            return Verdict.failed(
                NAME, f"method '{method}' failed on {kind} inputs: {type(exc).__name__}: {exc}", Outcome.RUN_ERROR
            )
        observed.append((method, kind, [t.detach().clone() if isinstance(t, torch.Tensor) else t for t in actual]))
        judgement = tolerance.judge(reference, actual, runtime)
        unstable += judgement.unstable
        if judgement.problem:
            where = f"call {checked + 1} of a stateful sequence, " if sequence else ""
            return Verdict.failed(
                NAME,
                f"method '{method}', {where}{kind} inputs: {judgement.problem}",
                Outcome.MISMATCH,
                method=method,
                inputs=kind,
                unstable=unstable,
            )
        checked += 1
    note = f" ({unstable} unstable elements, bounded by their jitter range)" if unstable else ""
    return Verdict.passed(NAME, f"{checked} (method, input) pairs match{note}", runs=checked, unstable=unstable)
