"""Eager equivalence: the real lowered program, run on several inputs, matches eager.

Inputs per method: random normal, negative, zeros, large and small magnitudes
(builder.INPUT_KINDS). The .pte is run by the ExecuTorch runtime (Core AI
programs by etprop's Core AI interpreter); comparison follows oracles/tolerance.
"""

from __future__ import annotations

import torch

from etprop.builder import INPUT_KINDS_DEFAULT
from etprop.oracles import Verdict
from etprop.oracles.tolerance import tolerance
from etprop.outcomes import Outcome

NAME = "eager equivalence"


def compare(expected: list, actual: list, base: dict | None = None) -> str | None:
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
        try:
            torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError as exc:
            detail = " ".join(line.strip() for line in str(exc).splitlines()[1:4])
            return f"output {index} {tuple(want.shape)}: {detail} (rtol={rtol:g}, atol={atol:g})"
    return None


def check(lowering, runner=None, kinds=INPUT_KINDS_DEFAULT, base: dict | None = None) -> Verdict:
    from etprop.runtime import runner_for

    built = lowering.built
    try:
        runner = runner or runner_for(lowering)
    except Exception as exc:
        return Verdict.failed(NAME, f"program failed to load: {type(exc).__name__}: {exc}", Outcome.LOAD_ERROR)
    if base is None and lowering.flow.runtime == "coreai":
        from etprop.coreai_runtime import coreai_tolerance
        from etprop.oracles.tolerance import BASE

        base = {dtype: coreai_tolerance(dtype) for dtype in BASE}
    checked = 0
    for method in built.methods:
        for kind in kinds:
            inputs = built.inputs(method, kind)
            expected = built.eager(method, inputs)
            try:
                actual = runner.run(method, inputs)
            except Exception as exc:
                return Verdict.failed(NAME, f"method '{method}' failed on {kind} inputs: "
                                            f"{type(exc).__name__}: {exc}", Outcome.RUN_ERROR)
            problem = compare(expected, actual, base)
            if problem:
                return Verdict.failed(NAME, f"method '{method}', {kind} inputs: {problem}",
                                      Outcome.MISMATCH, method=method, inputs=kind)
            checked += 1
    return Verdict.passed(NAME, f"{checked} (method, input) pairs match", runs=checked)
