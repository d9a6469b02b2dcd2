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

A flow may override the base (rtol, atol) pair: Core AI on Linux does (``coreai_tolerance``).
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


def coreai_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """Base (rtol, atol) for Core AI delegates run on Linux CPU (coreai-core 1.0.0b2).

    Measured on x86-64 against a float64 reference, error as max|err|/max|ref|:

    - float32 computes in float32: Linear(1024->64) 1.0e-6 (eager 4.3e-7;
      float16 rounding of the inputs alone gives 2.8e-4); sum over 4096 1.2e-6
      (eager 1.1e-7, a different summation order); exp/sigmoid/gelu/div
      within 1-2 ulp of eager. The shared float32 policy holds.
    - float16 GEMMs accumulate in float16: Linear error grows with the inner
      dimension K, 9e-4 at K=16 to 1.25e-2 at K=4096 (eager stays at 2.6e-4,
      one output rounding). Reductions (sum) match eager bit for bit. So
      atol is 2e-2 of the output scale, not 1e-2: it covers K <= 4096.
    - bfloat16 GEMMs accumulate wider: 3e-3 to 4.8e-3 over K=16..4096, about
      twice eager's output rounding; sums match eager bit for bit. The shared
      bfloat16 policy holds.
    """
    if dtype == torch.float16:
        return 1e-2, 2e-2
    return BASE.get(dtype, (0.0, 0.0))
