"""The reach meter (etprop/lowering/reach.py), its report section and the
power schedule it feeds (etprop/commands/schedule.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from etprop import flows
from etprop.commands import reach_report, schedule
from etprop.commands.report import Summary
from etprop.lowering import reach
from etprop.oracles.sets import SINGLE_FLOW
from etprop.program.spec import FORMAT
from etprop.verdicts.session import Session

LINEAR = {
    "format": FORMAT,
    "state": {"w": {"kind": "weight", "shape": [8, 8], "seed": 1, "scale": 0.3}},
    "methods": {
        "forward": {
            "inputs": [{"name": "x", "shape": [3, 8], "dtype": "float32"}],
            "nodes": [
                {"id": "v0", "op": "linear", "args": ["x"], "state": "w"},
                {"id": "v1", "op": "relu", "args": ["v0"]},
            ],
            "outputs": ["v1"],
        }
    },
}


@pytest.fixture
def metered(tmp_path, monkeypatch):
    """This process's meter, writing under tmp_path/reach, reset afterwards."""
    monkeypatch.setenv(reach.ENV, str(tmp_path / "reach"))
    monkeypatch.setenv(reach.SAMPLE_ENV, "1")
    monkeypatch.setattr(reach, "_METER", None)
    yield tmp_path
    monkeypatch.setattr(reach, "_METER", None)


def test_every_component_is_found_in_the_installed_packages():
    paths = reach.component_paths()
    missing = set(reach.COMPONENTS) - set(paths)
    assert not missing, f"components not installed here: {missing}"
    inside = paths["xnnpack passes"] / "fuse_batch_norm.py"
    assert reach.component_of(str(inside), paths) == "xnnpack passes"
    assert reach.component_of(str(paths["xnnpack passes"].parent / "test" / "x.py"), paths) is None


def test_a_lowering_reaches_the_partitioner_once_and_the_report_counts_it(metered):
    session = Session(metered / "artifacts", isolated=False)
    first = session.run(LINEAR, [flows.get("xnnpack")], "mixed", SINGLE_FLOW)
    again = session.run(LINEAR, [flows.get("xnnpack")], "mixed", SINGLE_FLOW)
    session.close()
    assert first.results[0].outcome.value == "pass"
    assert first.reach["new_arcs"].get("xnnpack partitioner", 0) > 50, first.reach
    assert sum(again.reach["new_arcs"].values()) < 5, "the same program counted as new code twice"
    records = Summary.load(metered / "artifacts").records
    assert [("new_arcs" in r) for r in records] == [True, True]

    combined = reach.combine([metered / "reach"], metered / "combined.db")
    found = reach.read(combined)
    partitioner = found.components["xnnpack partitioner"]
    assert 0 < partitioner.branches_reached < partitioner.branches
    assert found.components["coreai-torch converter"].branches_reached == 0
    assert found.functions["xnnpack passes"], "no unreached function named"
    series = reach.over_time(combined, found)
    assert len(series["xnnpack partitioner"]) == 2
    assert abs(series["xnnpack partitioner"][-1][1] - partitioner.branches_reached) <= 2

    section = reach_report.section(metered, records)
    text = "\n".join(section.text())
    assert "xnnpack partitioner" in text and "2 of 2 examples measured" in text
    assert "<svg" in section.html() and "<polyline" in section.plot()
    assert section.to_json()["components"]["xnnpack partitioner"]["branches_reached"] == partitioner.branches_reached


def test_a_new_process_does_not_count_what_earlier_processes_reached(metered):
    """A campaign's rounds are new processes: each meter starts from the data already written."""
    session = Session(metered / "artifacts", isolated=False)
    session.run(LINEAR, [flows.get("xnnpack")], "mixed", SINGLE_FLOW)
    session.close()
    code = (
        "from pathlib import Path; from etprop.lowering import reach; "
        f"m = reach.Meter(Path({str(metered / 'reach')!r})); "
        "print(sum(len(arcs) for arcs in m.seen.values()))"
    )
    seen = int(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()[-1]
    )
    assert seen > 1000


def test_a_sampled_meter_measures_one_example_in_n(tmp_path):
    meter = reach.Meter(tmp_path, every=4)
    chosen = [meter.measures(f"mixed|{index:04x}|xnnpack") for index in range(400)]
    assert 60 < sum(chosen) < 140
    with meter.example("key-not-measured" if not meter.measures("key-not-measured") else "other") as found:
        pass
    assert not found.measured and found.as_record() == {}


def _records(item: str, arcs: int, seconds: float, count: int) -> list[dict]:
    return [{"item": item, "seconds": seconds, "new_arcs": {"xnnpack passes": arcs}} for _ in range(count)]


def test_the_schedule_gives_the_items_that_earn_new_code_more_and_keeps_every_floor():
    designed = {"quantized": 12, "mixed": 1, "control_flow": 1, "never_measured": 1}
    records = _records("quantized", 0, 20.0, 8) + _records("mixed", 40, 4.0, 8) + _records("control_flow", 2, 4.0, 8)
    shares = schedule.shares(records, designed)
    assert shares["mixed"].earned > shares["control_flow"].earned > shares["quantized"].earned
    assert all(share.earned >= share.floor for share in shares.values())
    assert shares["quantized"].floor == 1.0 and shares["quantized"].earned < 12
    assert abs(sum(s.earned for s in shares.values()) - sum(designed.values())) < 1e-6
    # An item with nothing measured yet is given the mean rate, not starved.
    assert shares["never_measured"].earned > shares["quantized"].earned


def test_without_measurements_the_schedule_is_the_designed_shares():
    designed = {"a": 12, "b": 1}
    assert {item: s.earned for item, s in schedule.shares([{"item": "a", "seconds": 1}], designed).items()} == designed


def test_a_round_runs_first_the_items_the_schedule_favours(tmp_path, monkeypatch):
    """The plugin orders a round by examples served over the scheduled share."""
    from etprop.commands import pytest_plugin

    served = tmp_path / "served.json"
    served.write_text(json.dumps({"big": 6, "small": 1}))
    scheduled = tmp_path / "schedule.json"
    scheduled.write_text(json.dumps({"big": {"earned": 1.0}, "small": {"earned": 12.0}}))
    values = {"etprop_served": str(served), "etprop_round": "1", "etprop_schedule": str(scheduled)}
    config = SimpleNamespace(
        getoption=lambda name, default=None: values.get(name),
        hook=SimpleNamespace(pytest_deselected=lambda items: None),
    )
    items = [
        SimpleNamespace(nodeid=name, function=SimpleNamespace(etprop_share=share))
        for name, share in (("big", 12), ("small", 1))
    ]
    pytest_plugin.pytest_collection_modifyitems(config, items)
    assert [item.nodeid for item in items] == ["small"], "the item earning more was not run first"
