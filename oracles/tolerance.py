"""The written tolerance policy for comparing a lowering's outputs to eager.

- float32 on XNNPACK/portable: rtol 1e-3; atol 1e-3 times the output's largest
  eager magnitude (at least 1). Backends reorder sums (GEMM blocking, fused
  reductions), so an element that is the small difference of large terms can
  differ by an amount proportional to the terms, not to itself: the absolute
  part scales with the output. Normalizing a nearly constant input (GroupNorm
  of tiny values, seen here with 2e-4 differences between eager and portable
  kernels) is ill-conditioned in the same way, which is why atol is not 1e-4.
- float16 / bfloat16: rtol 1e-2 / 2e-2 and the same scaled atol rule with 1e-2.
- Conditioning: on top of that, each element may differ by NOISE_FACTOR times
  the distance between the float32 eager result and a float64 eager run of the
  same program (its rounding noise). Normalizing a nearly constant tensor or
  rounding a value near .5 amplifies rounding; a backend that rounds
  differently then differs by about as much as float32 differs from float64.
  Without this, fuzzing reports GroupNorm/LayerNorm of tiny inputs (2e-4 to
  2e-3 differences, seen here) as mismatches.
- NaN and Inf: positions must agree exactly (eager NaN where the runtime gives
  a number is a mismatch, and the reverse); infinities must have equal signs.
- Shapes and dtypes must agree exactly.

A flow may override the base (rtol, atol) pair, e.g. Core AI on Linux.
"""

from __future__ import annotations

import torch

BASE = {
    torch.float32: (1e-3, 1e-3),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 1e-2),
}


NOISE_FACTOR = 8.0


def tolerance(expected: torch.Tensor, base: dict | None = None) -> tuple[float, float]:
    """(rtol, atol) for comparing against ``expected`` (an eager output)."""
    rtol, atol = (base or BASE).get(expected.dtype, (0.0, 0.0))
    if not expected.dtype.is_floating_point:
        return 0.0, 0.0
    finite = expected[torch.isfinite(expected)]
    scale = float(finite.abs().max()) if finite.numel() else 1.0
    return rtol, atol * max(1.0, scale)
