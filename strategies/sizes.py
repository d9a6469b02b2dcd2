"""How many node slots a drawn graph gets.

A lowering costs about a second plus a little per op, so a campaign buys more
checking per second with bigger programs. The properties name the ranges CI's
deterministic profile draws from; a campaign (the ``fuzz`` profiles) shifts
each range up: from its midpoint to twice its top. Campaign failures are
made small by the spec shrinker, which deletes nodes regardless of these
ranges, so bigger draws do not cost bigger repros.
"""

from __future__ import annotations

import contextlib

from hypothesis import strategies as st

_campaign = False
# Whether a campaign's draws shift the ranges up (off while quantized() draws).
_shifted = True
# A campaign's range never starts below 8 slots nor ends below 16, so the
# small top-level graphs around control flow grow too.
CAMPAIGN_MIN_LOW, CAMPAIGN_MIN_HIGH = 8, 16


def use_campaign_sizes(enabled: bool) -> None:
    """Set by the pytest plugin from the active Hypothesis profile."""
    global _campaign
    _campaign = enabled


@contextlib.contextmanager
def property_ranges():
    """Draw from the ranges the properties name, campaign or not: the coverage
    corpus is one set of programs for CI, campaigns and the gate alike."""
    global _campaign
    saved, _campaign = _campaign, False
    try:
        yield
    finally:
        _campaign = saved


@contextlib.contextmanager
def unshifted():
    """Draw the properties' own ranges while keeping a campaign's vocabulary
    and swarm: a quantized lowering costs two to three times a float one per
    op (PT2E's prepare, calibration and convert, and the perturbed runs that
    bound it), so shifting its ranges up buys fewer ops per second, not more
    (a 30-minute campaign spent 477 s on one dynamically quantized
    example)."""
    global _shifted
    saved, _shifted = _shifted, False
    try:
        yield
    finally:
        _shifted = saved


def campaign_range(low: int, high: int) -> tuple[int, int]:
    """The slot range a campaign draws for a property's ``low``..``high``."""
    return max(low, (low + high + 1) // 2, CAMPAIGN_MIN_LOW), max(2 * high, CAMPAIGN_MIN_HIGH)


def exploring() -> bool:
    """Whether a campaign draws (the ``fuzz`` profiles): the whole vocabulary
    and every input rank. The properties' own ranges (CI, the coverage corpus)
    draw the vocabulary whose failures are triaged (``ops.CAMPAIGN_ONLY``)."""
    return _campaign


def swarming() -> bool:
    """Swarm testing (each graph drawn from a random subset of the ops) in
    campaigns, unless ETPROP_SWARM=0; never in the properties' own ranges (CI)."""
    import os

    return _campaign and os.environ.get("ETPROP_SWARM", "1") != "0"


def slot_count(draw, low: int, high: int) -> int:
    """Draw how many node slots a graph gets (each slot may stay empty)."""
    if _campaign and _shifted:
        low, high = campaign_range(low, high)
    return draw(st.integers(low, high))
