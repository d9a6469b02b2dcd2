"""The numeric policy for comparing a lowering's outputs with eager: one bound
per output element, from how sensitive that element is (docs/tolerance.md).

For each (method, input) call the oracle has a ``Reference`` (etprop.program.builder):
eager outputs ``y``, a float64 run ``y64`` and jittered eager runs, in which every
input, parameter, buffer and node value was moved by about u ulps: u = +C and
-C (the directional runs, C = SPREAD_FACTOR), u = +-C with a random sign per
element (the scattered runs: one element near a rounding op's boundary
crossing it without all of its neighbours, whose jumps could cancel
downstream) and two patterns of random u in {-1, 0, 1}; sums by u*eps times
the sum of their terms' magnitudes. A spread is
the largest distance of such runs from ``y``: how far rounding differences
anywhere in the program (another summation order, another vector unit) move
that element, with ill-conditioning and the jumps of rounding ops and
branches included.

    allowed = max(directional and scattered spread, SPREAD_FACTOR * max(random spread, |y - y64|))
              + RELATIVE_FLOOR * eps * |y| + SCALE_FLOOR * eps32 * max|y| + ZERO_FLOOR * tiny

- The scale floor (float32 eps times the output's largest finite magnitude,
  whatever the dtype) covers what the jitter does not model: a backend's own
  approximations of transcendental functions (XNNPACK's vectorized exp and
  tanh are a few float32 ulps from eager's) amplified by a normalization of a
  nearly constant group, seen at 1e-6 to 4e-6 of the output scale. At 64 ulps
  it is 130 times tighter than the old 1e-3 of the scale, and a float32
  element moved by 3e-4 is still caught unless it is 40 times smaller than
  the output's largest.

- Unstable elements: the up and down runs move the element asymmetrically by
  more than rounding could (a rounding op, an integer cast, a branch near its
  threshold, rounding noise through abs): their bound is SPREAD_FACTOR times
  the whole jitter range (a gross difference still fails), and the verdict
  counts them.
- Integer and bool outputs: exact unless jittered runs change them (then the
  same bound, those elements counted as unstable).
- Non-finite values, per element against float64: where float64 is finite and
  fits the dtype, a NaN/inf from the lowering is a mismatch; where eager is
  non-finite but float64 finite (overflow, inf-inf), or a jittered run leaves
  the finite range, the element is at the edge: masked (a finite lowered value
  must still be within a factor EDGE_RATIO of float64, or one ulp of the
  output's scale in its dtype) and counted; where float64 is non-finite too,
  NaN positions and infinity signs must agree, unless a jittered (or, when
  quantized, flipped) run gives that element another value: then it is at
  the edge as well (0/0 whose numerator's sign is rounding noise).
- Shapes and dtypes must agree exactly.
- ``OP_ULPS`` widens the jitter where a runtime's arithmetic is coarser than
  eager's by design (Core AI float16 GEMMs accumulate in float16).

This module imports only torch: a standalone repro script carries its source
verbatim and judges with exactly this policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Chosen with benchmarks/sensitivity.py (figures in benchmarks/RESULTS.md).
SPREAD_FACTOR = 4.0
RELATIVE_FLOOR = 2.0
SCALE_FLOOR = 64.0
FLOAT32_EPS = torch.finfo(torch.float32).eps
ZERO_FLOOR = 16.0
# A masked (edge) element's finite lowered value must be within this factor of float64.
EDGE_RATIO = 2.0
# Error budgets for the jittered runs where a runtime computes less accurately
# than eager by design, keyed by (runtime, program dtype); "sums" is the
# rounding error of sums of terms (GEMMs, reductions, pooling) in units of
# float32 eps times the sum of |terms| (1 when accumulating in float32).
# - bfloat16 everywhere: ExecuTorch's portable kernels (which XNNPACK and Core
#   AI fall back to) accumulate a bfloat16 convolution in bfloat16: a grouped
#   Conv2d of 48 terms differed from eager by 9 ulps (0.018 at 0.35) on
#   portable and xnnpack, where float32 accumulation differs by 1.
# - Core AI float16 GEMMs accumulate in float16: Linear(K -> 64) error grows
#   with the inner dimension K, 7e-4 / 4e-3 / 1.4e-2 of the output scale at
#   K = 16 / 256 / 4096 (eager stays at 2.6e-4, one output rounding). Without
#   this budget the K=4096 case fails (0.023 off where 0.006 is allowed); with
#   it all three pass.
# - float32 on the ExecuTorch runtime: XNNPACK's vectorized transcendental
#   functions are approximations a few ulps from eager's. GroupNorm of
#   abs(exp(tanh(x))) on small inputs, a nearly constant group, came out
#   1.5e-5 off at -0.0254 on xnnpack where one-ulp jitter spread 3e-6;
#   8 ulps per such op covers it.
# - float16 var on the ExecuTorch runtime: its var kernel computes in float16
#   (finding KERNELS-002, whose overflow stays a mismatch; sum and mean
#   accumulate in float32): var over 396 terms was 6.6e-3 relative off
#   float64 (13 float16 ulps) where eager is 4e-4 off; 8 ulps per var, moved
#   SPREAD_FACTOR times in the directional runs, covers it.
BFLOAT16_SUMS = 2.0**16  # bfloat16 eps / float32 eps
FLOAT16_SUMS = 2.0**13
TRANSCENDENTAL_ULPS = 8.0
TRANSCENDENTAL = ("tanh", "exp_bounded", "sigmoid", "silu", "gelu", "elu", "softplus", "softmax", "log_softmax")
OP_ULPS: dict[tuple[str, str], dict[str, float]] = {
    ("executorch", "float32"): {op: TRANSCENDENTAL_ULPS for op in TRANSCENDENTAL},
    ("executorch", "bfloat16"): {"sums": BFLOAT16_SUMS},
    ("executorch", "float16"): {"var": 8.0},
    ("coreai", "bfloat16"): {"sums": BFLOAT16_SUMS},
    ("coreai", "float16"): {"sums": FLOAT16_SUMS},
}


# Quantized programs (etprop/program/quantize.py) are judged against their
# converted Q/DQ program, whose perturbed runs replace the jittered ones:
# - TIE_STEPS: each activation entering a quantization moves by this many of
#   its steps, so elements that close to a rounding boundary round the other
#   way in some run. A correct backend moves them by far less: XNNPACK's int32
#   bias (0.5 of input scale times weight scale) and its float32 requantization
#   scale are about 0.01 to 0.02 output steps. A lowering that uses another
#   scale or zero point for a tensor, or skips a requantization, moves every
#   element of it by up to a whole step and is caught.
# - QUANTIZED_FLOAT_ULPS: the float ops around and between quantized
#   patterns, as TRANSCENDENTAL_ULPS for float programs.
# - DYNAMIC_STEPS: an activation entering a dynamic quantization moves by up
#   to half a step: XNNPACK picks quantization parameters per row, not per
#   tensor as the reference does, so any element may round the other way.
#   Dynamic schemes also add a run with those activations left unrounded and
#   one with them rounded per row, what XNNPACK computes.
# - QUANTIZED_RANDOM_RUNS: random patterns of those moves. The actual
#   differences are one such pattern; a bound SPREAD_FACTOR times the largest
#   of 8 samples leaves it a negligible chance per element to be exceeded.
# - QUANTIZED_FLIP_SHARE: a backend's integer arithmetic (average pooling,
#   requantization of a sum, a lookup table) can round a value the other way
#   that no tie run moved: up to this share of an output's elements (at least
#   one) may then differ by what a whole step (FLIP_STEPS) anywhere upstream
#   produces, SPREAD_FACTOR times. A wrong scale or zero point, or a dropped
#   requantization, moves far more elements and is still caught. Seen: one of
#   1,440 elements of a static per-tensor program one output step off on
#   XNNPACK (-0.091 where the converted program gives -0.114).
TIE_STEPS = 0.05
DYNAMIC_STEPS = 0.5
FLIP_STEPS = 1.0
QUANTIZED_FLIP_SHARE = 0.01
QUANTIZED_FLOAT_ULPS = TRANSCENDENTAL_ULPS
QUANTIZED_RANDOM_RUNS = 8


def op_ulps(runtime: str, dtype: str) -> dict[str, float]:
    """Error budgets for the jittered runs of a program run by ``runtime``;
    the up and down runs move every value SPREAD_FACTOR times as far as the
    random ones (so they cross a rounding op's or a branch's boundary
    wherever a difference the bound allows would)."""
    return {
        "directional": SPREAD_FACTOR,
        "tie_steps": TIE_STEPS,
        "dynamic_steps": DYNAMIC_STEPS,
        "flip_steps": FLIP_STEPS,
        "quantized_float_ops": QUANTIZED_FLOAT_ULPS,
        "random_runs": QUANTIZED_RANDOM_RUNS,
        **OP_ULPS.get((runtime, dtype), {}),
    }


@dataclass
class Judgement:
    """``problem`` is None when the outputs match; ``unstable`` counts elements
    whose value jumps under jitter or sits at the edge of the dtype's range."""

    problem: str | None = None
    unstable: int = 0


def judge(reference, actual: list, runtime: str = "executorch") -> Judgement:
    """Compare a lowering's outputs for one call with its eager ``reference``."""
    expected = reference.expected
    if len(expected) != len(actual):
        return Judgement(f"{len(actual)} outputs, eager has {len(expected)}")
    unstable = 0
    for index, want in enumerate(expected):
        got = actual[index]
        if not isinstance(got, torch.Tensor):
            return Judgement(f"output {index} is {type(got).__name__}, eager gives a tensor", unstable)
        if got.shape != want.shape or got.dtype != want.dtype:
            return Judgement(
                f"output {index}: {tuple(got.shape)} {got.dtype}, eager gives {tuple(want.shape)} {want.dtype}",
                unstable,
            )
        runs = [run[index] for run in reference.jittered]
        flips = [run[index] for run in getattr(reference, "flips", None) or []]
        problem, count = _judge_output(
            want, got, reference.wide[index], runs, flips, getattr(reference, "directional", 2)
        )
        unstable += count
        if problem:
            note = f"; {unstable} unstable elements" if unstable else ""
            return Judgement(f"output {index} {tuple(want.shape)}: {problem}{note}", unstable)
    return Judgement(None, unstable)


@dataclass
class Bound:
    """Per element: ``allowed`` distance from eager; ``unstable`` (jumps or at
    the edge of the range); ``edge`` (masked: eager or a jittered run is
    non-finite where float64 is finite); ``special`` (eager and float64 both
    non-finite: the lowering must give the same value)."""

    allowed: torch.Tensor
    unstable: torch.Tensor
    edge: torch.Tensor
    special: torch.Tensor
    spread: torch.Tensor


def bound(want, wide, runs, directional: int = 2, flips=()) -> Bound:
    """The per-element bound for one eager output ``want`` (see the module
    docstring); the first ``directional`` runs (up, down, then any scattered
    ones) moved values SPREAD_FACTOR times as far as the rest. ``flips``
    (quantized) only decide whether a non-finite value is stable."""
    floating = want.is_floating_point()
    info = torch.finfo(want.dtype) if floating else None
    eps, tiny, top = (info.eps, info.tiny, info.max) if floating else (0.0, 0.0, float("inf"))
    y, y64 = want.double(), wide.double()
    runs = [r.double() for r in runs]
    finite_y, finite_64 = torch.isfinite(y), torch.isfinite(y64)
    runs_finite = torch.stack([torch.isfinite(r) for r in runs]).all(0) if runs else torch.ones_like(finite_y)
    fits = finite_64 & (y64.abs() <= top)
    # A non-finite value that some run does not reproduce (a division by a
    # value that rounding makes 0, or not) has no stable value to agree with.
    non_finite = ~finite_y & ~finite_64
    special = non_finite
    for run in list(runs) + [f.double() for f in flips]:
        special = special & _same_special(y, run)
    edge = (fits & ~(finite_y & runs_finite)) | (finite_y & ~fits) | (non_finite & ~special)
    zero = torch.zeros_like(y)
    deviations = [torch.where(finite_y & torch.isfinite(r), r - y, zero) for r in runs]
    spread = torch.stack([d.abs() for d in deviations]).amax(0) if runs else zero
    scaled = (
        torch.stack([d.abs() * (1.0 if i < directional else SPREAD_FACTOR) for i, d in enumerate(deviations)]).amax(0)
        if runs
        else zero
    )
    rounding = torch.where(finite_y & finite_64, (y - y64).abs(), zero)
    magnitude = torch.where(finite_y, y.abs(), zero)
    scale = float(magnitude.max()) if floating and magnitude.numel() else 0.0
    allowed = (
        torch.maximum(scaled, SPREAD_FACTOR * rounding)
        + RELATIVE_FLOOR * eps * magnitude
        + SCALE_FLOOR * FLOAT32_EPS * scale
        + ZERO_FLOOR * tiny
    )
    jumps = _jumps(y, deviations, eps) if floating else spread > 0
    # Where the value is not a smooth function of the rounding (a jump, noise
    # rectified by abs), the directional runs are one sample: widen them too.
    allowed = torch.where(jumps, torch.maximum(allowed, SPREAD_FACTOR * spread), allowed)
    return Bound(allowed, jumps | edge, edge, special, spread)


def _judge_output(want, got, wide, runs, flips=(), directional: int = 2) -> tuple[str | None, int]:
    limits = bound(want, wide, runs, directional, flips)
    tiny = torch.finfo(want.dtype).tiny if want.is_floating_point() else 0.0
    y, y64, g = want.double(), wide.double(), got.double()
    allowed, edge = limits.allowed, limits.edge
    count = int(limits.unstable.sum())
    special = limits.special & ~_same_special(y, g)
    if bool(special.any()):
        at = _first(special)
        return f"non-finite values differ at {at}: eager {y[at]}, got {g[at]}", count
    compared = torch.isfinite(y) & ~edge
    lost = compared & ~torch.isfinite(g)
    if bool(lost.any()):
        at = _first(lost)
        return (
            f"{int(lost.sum())} / {want.numel()} elements are non-finite where eager and float64 are "
            f"finite; first at {at}: eager {y[at]:.6g}, float64 {y64[at]:.6g}, got {g[at]}"
        ), count
    eps = torch.finfo(want.dtype).eps if want.is_floating_point() else 0.0
    finite = y64[torch.isfinite(y64)]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    # At the edge even eager may be far from float64 (a jittered run
    # overflowed): a finite lowered value is judged against float64 only
    # coarsely, by EDGE_RATIO or one ulp of the output's scale in its dtype.
    # Where eager is NaN, an intermediate overflowed to infinities of both
    # signs: what it gives depends on the order of the overflowing sums, so
    # no value in the program's dtype is wrong there.
    far = (
        edge
        & ~torch.isnan(y)
        & torch.isfinite(g)
        & torch.isfinite(y64)
        & ((g - y64).abs() > (EDGE_RATIO - 1) * y64.abs() + eps * scale + tiny)
    )
    if bool(far.any()):
        at = _first(far)
        return f"eager is at the edge of the range at {at} but got {g[at]:.6g}, float64 {y64[at]:.6g}", count
    excess = torch.where(compared, (g - y).abs() - allowed, torch.full_like(y, -1.0))
    bad = excess > 0
    if flips and bool(bad.any()):
        # Quantized: a few elements may round the other way (QUANTIZED_FLIP_SHARE).
        reach = SPREAD_FACTOR * torch.stack([(f.double() - y).abs() for f in flips]).amax(0)
        flipped = bad & ((g - y).abs() <= reach)
        if int(flipped.sum()) <= max(1, int(QUANTIZED_FLIP_SHARE * want.numel())):
            bad, count = bad & ~flipped, count + int(flipped.sum())
    if bool(bad.any()):
        at = _first(excess == excess.max())
        return (
            f"{int(bad.sum())} / {want.numel()} elements differ; worst at {at}: eager {y[at]:.6g}, "
            f"got {g[at]:.6g}, allowed difference {allowed[at]:.3g} (jitter spread {limits.spread[at]:.3g}, "
            f"float64 {y64[at]:.6g})"
        ), count
    return None, count


def _jumps(y, deviations, eps):
    """Elements the up and down runs move asymmetrically, beyond what the final
    rounding of a smooth function allows: a rounding op or a branch flipped."""
    if len(deviations) < 2:
        return torch.zeros_like(y, dtype=torch.bool)
    up, down = deviations[0], deviations[1]
    ulp = eps * y.abs().nan_to_num(0.0, 0.0, 0.0)
    return (up + down).abs() > (up - down).abs() / 2 + 4 * ulp


def _same_special(y, g):
    return (y.isnan() & g.isnan()) | (y == g)


def _first(mask) -> tuple:
    flat = int(mask.reshape(-1).nonzero()[0])
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), mask.shape))
