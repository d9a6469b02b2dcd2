"""Eager equivalence: the real lowered program, run on several inputs, matches eager.

Inputs per method: random normal, negative, zeros, large and small magnitudes
(builder.INPUT_KINDS), and for dynamic dims normal inputs at both bounds. The
.pte is run by the ExecuTorch runtime (Core AI programs by etprop's Core AI
interpreter); comparison follows oracles/tolerance.
"""

from __future__ import annotations

import torch

from etprop.lowering import stages
from etprop.program.builder import INPUT_KINDS_DEFAULT
from etprop.oracles import Verdict
from etprop.oracles.tolerance import BASE, NOISE_FACTOR, coreai_tolerance, tolerance
from etprop.verdicts.outcomes import Outcome

NAME = "eager equivalence"


def compare(expected: list, actual: list, base: dict | None = None, noise: list | None = None) -> str | None:
    """None when ``actual`` matches ``expected`` under the policy, else why not."""
    if len(expected) != len(actual):
        return f"{len(actual)} outputs, eager has {len(expected)}"
    for index, (want, got) in enumerate(zip(expected, actual)):
        if not isinstance(got, torch.Tensor):
            return f"output {index} is {type(got).__name__}, eager gives a tensor"
        if got.shape != want.shape or got.dtype != want.dtype:
            return (f"output {index}: {tuple(got.shape)} {got.dtype}, eager gives "
                    f"{tuple(want.shape)} {want.dtype}")
        rtol, atol = tolerance(want, base)
        if not want.is_floating_point():
            if not torch.equal(got, want):
                return f"output {index} {tuple(want.shape)}: integer values differ"
            continue
        problem = _compare_float(want, got, rtol, atol, None if noise is None else noise[index])
        if problem:
            return f"output {index} {tuple(want.shape)}: {problem} (rtol={rtol:g}, atol={atol:g})"
    return None


def _compare_float(want, got, rtol, atol, noise) -> str | None:
    want64, got64 = want.double(), got.double()
    nan_want, nan_got = want64.isnan(), got64.isnan()
    if not torch.equal(nan_want, nan_got):
        where = (nan_want != nan_got).nonzero()[0].tolist()
        return f"NaN positions differ (first at {where}: eager {want64[tuple(where)]}, got {got64[tuple(where)]})"
    inf_want, inf_got = want64.isinf(), got64.isinf()
    if not torch.equal(inf_want, inf_got) or not torch.equal(want64[inf_want], got64[inf_got]):
        return "infinities differ in position or sign"
    finite = ~(nan_want | inf_want)
    allowed = atol + rtol * want64.abs()
    if noise is not None:
        allowed = allowed + NOISE_FACTOR * noise
    excess = torch.where(finite, (got64 - want64).abs() - allowed, torch.zeros_like(want64))
    bad = excess > 0
    if bool(bad.any()):
        worst = int(excess.argmax())
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), want.shape))
        return (f"{int(bad.sum())} / {want.numel()} elements differ; worst at {list(index)}: "
                f"eager {want64[index]:.6g}, got {got64[index]:.6g}, allowed difference {allowed[index]:.3g}")
    return None


def check(lowering, runner=None, kinds=INPUT_KINDS_DEFAULT, base: dict | None = None) -> Verdict:
    from etprop.lowering.executorch_runtime import runner_for

    built = lowering.built
    try:
        with stages.timed("executorch"):
            runner = runner or runner_for(lowering)
    except Exception as exc:
        return Verdict.failed(NAME, f"program failed to load: {type(exc).__name__}: {exc}", Outcome.LOAD_ERROR)
    if base is None and lowering.flow.runtime == "coreai":
        base = {dtype: coreai_tolerance(dtype) for dtype in BASE}
    # A stateful program is compared as a sequence of calls: the runtime keeps
    # mutable buffers across executions, and so does eager here, both starting
    # from the initial values the module was built with.
    sequence = built.stateful and getattr(runner, "keeps_state", True)
    try:
        return _run_all(built, runner, kinds, base, sequence)
    finally:
        built.reset_state()


def _run_all(built, runner, kinds, base, sequence) -> Verdict:
    checked = 0
    for method in built.methods:
        # Each method of a program owns its mutable buffers in ExecuTorch;
        # eager shares them, so each method's sequence starts afresh.
        if sequence:
            built.reset_state()
        for kind, inputs in built.input_cases(method, kinds):
            with stages.timed("torch"):
                expected = built.eager(method, inputs, restore=not sequence)
                noise = built.noise(method, inputs, expected, restore=not sequence)
            try:
                with stages.timed("executorch"):
                    actual = runner.run(method, inputs)
            except Exception as exc:
                return Verdict.failed(NAME, f"method '{method}' failed on {kind} inputs: "
                                            f"{type(exc).__name__}: {exc}", Outcome.RUN_ERROR)
            problem = compare(expected, actual, base, noise)
            if problem:
                where = f"call {checked + 1} of a stateful sequence, " if sequence else ""
                return Verdict.failed(NAME, f"method '{method}', {where}{kind} inputs: {problem}",
                                      Outcome.MISMATCH, method=method, inputs=kind)
            checked += 1
    return Verdict.passed(NAME, f"{checked} (method, input) pairs match", runs=checked)
