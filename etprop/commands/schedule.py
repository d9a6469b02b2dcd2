"""A campaign's power schedule: each test item's share of the next round,
from the new lowering code its recent examples reached per CPU-second.

Coverage-guided fuzzers give more energy to the seeds that keep finding new
edges; here the unit is a property x flow test item and the edges are the
branch arcs of ExecuTorch's lowering code (etprop/lowering/reach.py). Every
item keeps a floor (``FLOOR`` share units, or its designed share when that is
smaller), so no item starves; the rest of the campaign's designed total is
split in proportion to what each item earned over its last ``WINDOW``
measured examples. An item with no measured example yet earns the campaign's
mean rate (a prior worth ``PRIOR_SECONDS``), so it is tried before it is judged.
"""

from __future__ import annotations

from dataclasses import dataclass

FLOOR = 1.0
WINDOW = 8
PRIOR_SECONDS = 30.0


@dataclass
class ItemShare:
    designed: float
    floor: float
    earned: float  # the share the schedule gives it
    rate: float  # new arcs per CPU-second, recent examples (prior included)
    measured: int  # measured examples the rate is read from

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def shares(records: list[dict], designed: dict[str, float]) -> dict[str, ItemShare]:
    """Per item of ``designed`` (item -> designed share), its share of the
    next round. Without any measured example, the designed shares."""
    recent: dict[str, list[dict]] = {}
    for record in records:
        if "new_arcs" in record and record.get("item") in designed:
            recent.setdefault(record["item"], []).append(record)
    arcs = {item: sum(sum(r["new_arcs"].values()) for r in rows[-WINDOW:]) for item, rows in recent.items()}
    seconds = {item: sum(max(r.get("seconds", 0.0), 0.1) for r in rows[-WINDOW:]) for item, rows in recent.items()}
    floors = {item: min(FLOOR, share) for item, share in designed.items()}
    if not recent:
        return {item: ItemShare(share, floors[item], share, 0.0, 0) for item, share in designed.items()}
    mean = sum(arcs.values()) / max(sum(seconds.values()), 1e-9)
    rates = {
        item: (arcs.get(item, 0) + mean * PRIOR_SECONDS) / (seconds.get(item, 0.0) + PRIOR_SECONDS) for item in designed
    }
    pool = max(sum(designed.values()) - sum(floors.values()), 0.0)
    total = sum(rates.values())
    return {
        item: ItemShare(
            designed[item],
            floors[item],
            floors[item] + (pool * rates[item] / total if total > 0 else pool / len(designed)),
            rates[item],
            len(recent.get(item, [])[-WINDOW:]),
        )
        for item in designed
    }


def text(scheduled: dict[str, ItemShare], shown: int = 12) -> list[str]:
    """The summary's schedule lines: each item's floor and earned share, most earned first."""
    if not scheduled or not any(s.measured for s in scheduled.values()):
        return []
    total = sum(s.earned for s in scheduled.values()) or 1.0
    rows = sorted(scheduled.items(), key=lambda kv: -kv[1].earned)
    lines = [
        f"schedule (share of a round: floor / designed / earned; new arcs per CPU-second over the last "
        f"{WINDOW} measured examples):"
    ]
    for item, share in rows[:shown]:
        lines.append(
            f"  {item.split('::')[-1]:64} {share.floor / total:5.1%} / {share.designed / total:5.1%} / "
            f"{share.earned / total:5.1%}  ({share.rate:.1f}/s, {share.measured} measured)"
        )
    if len(rows) > shown:
        lines.append(f"  ... {len(rows) - shown} more items in schedule.json")
    return lines
