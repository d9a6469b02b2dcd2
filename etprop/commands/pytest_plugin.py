"""pytest plugin: options, Hypothesis profiles and databases, flow parametrization,
and the per-flow × property summary.

Options (also settable through ETPROP_* environment variables, which is how
``etprop fuzz`` passes them to xdist workers):
  --etprop-flows a,b        flows to run (default: every available flow)
  --etprop-flow-module F    import F (.py path or module) to register more flows
  --etprop-artifacts DIR    where pending/, repros/ and results/ go (default: artifacts)
  --etprop-profile NAME     Hypothesis profile: dev, ci (deterministic) or fuzz
  --etprop-examples N       override max_examples per property
  --etprop-db URL           example database: a directory, or redis://host:port/db
  --etprop-db-readonly URL  a database to replay from without writing (e.g. CI's)
  --etprop-seed N           seed Hypothesis's generation (shards of a campaign, the gate)
  --etprop-round N          a campaign's round: where its items start among equals
  --etprop-served FILE      a campaign's examples so far per test item (JSON): who runs first
  --etprop-schedule FILE    a campaign's earned share per test item (JSON, etprop/commands/schedule.py)

Why not --hypothesis-seed: Hypothesis turns its example database off when that
option forces a seed, and a campaign's shards must share the database.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

from etprop.strategies import sizes

OPTIONS = {
    "flows": "ETPROP_FLOWS",
    "flow_module": "ETPROP_FLOW_MODULE",
    "artifacts": "ETPROP_ARTIFACTS",
    "profile": "ETPROP_PROFILE",
    "examples": "ETPROP_EXAMPLES",
    "db": "ETPROP_DB",
    "db_readonly": "ETPROP_DB_READONLY",
    "seed": "ETPROP_SEED",
    "round": "ETPROP_ROUND",
    "served": "ETPROP_SERVED",
    "schedule": "ETPROP_SCHEDULE",
    "sizes": "ETPROP_SIZES",
}


# The Hypothesis profile pytest_configure loaded (property modules are imported after it).
ACTIVE_PROFILE = ""
# The campaign round this pytest process runs (0 outside campaigns), set by pytest_configure.
CAMPAIGN_ROUND = 0


def pytest_addoption(parser):
    group = parser.getgroup("etprop", "etprop property-based lowering checks")
    for name in OPTIONS:
        group.addoption(f"--etprop-{name.replace('_', '-')}", dest=f"etprop_{name}", default=None)


def option(config, name: str, default=None):
    value = config.getoption(f"etprop_{name}", default=None) if config is not None else None
    if value is None:
        value = os.environ.get(OPTIONS[name])
    return default if value in (None, "") else value


def _database(config):
    from etprop.commands.database import open_database

    return open_database(
        option(config, "db"),
        option(config, "db_readonly"),
        default_dir=Path(option(config, "artifacts", "artifacts")) / "hypothesis-db",
    )


def _register_profiles(config) -> None:
    common = dict(deadline=None, print_blob=True, suppress_health_check=[HealthCheck.differing_executors])
    settings.register_profile("dev", max_examples=10, database=None, **common)
    # ci: bounded and deterministic; a failure is reported unshrunk (shrinking
    # a 3 s-per-example property can take many minutes), fuzz shrinks it. Two
    # examples per item: Hypothesis's simplest program (the plumbing) and one
    # drawn one; campaigns draw the rest (a third example cost the test
    # command about a tenth of its time).
    settings.register_profile(
        "ci",
        max_examples=2,
        derandomize=True,
        database=None,
        phases=(Phase.explicit, Phase.reuse, Phase.generate),
        **common,
    )
    # A campaign skips programs it already judged (one is discarded per round
    # at least: Hypothesis's simplest), so filtering is expected there.
    settings.register_profile(
        "fuzz",
        max_examples=1_000_000,
        database=_database(config),
        phases=tuple(Phase),
        **{**common, "suppress_health_check": common["suppress_health_check"] + [HealthCheck.filter_too_much]},
    )
    settings.register_profile(
        "fuzz-noshrink", settings.get_profile("fuzz"), phases=(Phase.explicit, Phase.reuse, Phase.generate)
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "etprop_family(name): the program family a property draws")
    _register_profiles(config)
    profile = option(config, "profile", "dev")
    examples = option(config, "examples")
    seed = option(config, "seed")
    if examples or seed is not None:
        overrides = {"max_examples": int(examples)} if examples else {}
        if seed is not None:
            overrides["derandomize"] = False
            _seed_generation(int(seed))
        settings.register_profile(f"{profile}-custom", settings.get_profile(profile), **overrides)
        profile = f"{profile}-custom"
    settings.load_profile(profile)
    global ACTIVE_PROFILE, CAMPAIGN_ROUND
    ACTIVE_PROFILE = profile
    CAMPAIGN_ROUND = int(option(config, "round", 0))
    drawn_sizes = option(config, "sizes", "campaign" if profile.startswith("fuzz") else "property")
    if drawn_sizes not in ("campaign", "property"):
        raise pytest.UsageError(f"ETPROP_SIZES={drawn_sizes!r}: use 'campaign' or 'property'")
    sizes.use_campaign_sizes(drawn_sizes == "campaign")
    module = option(config, "flow_module")
    if module:
        from etprop import flows

        for target in module.split(","):
            flows.load_flow_module(target)


# Among equally served items, round N starts N times this fraction of the way
# round their list (the golden ratio's: successive starts stay far apart).
ROUND_ROTATION = 0.6180339887


# A campaign round asks an item for at most this fraction of its share
# (rounded up) and runs only the items less than one such slice ahead of the
# least served: rounds stay short, so a large share cannot hold a whole
# exploration window while the items after it wait (a 30-minute campaign
# whose first round ran share-12 items first never reached the coverage corpus).
ROUND_SLICES = 4


def round_examples(weight: int, round_index: int) -> int:
    """What a campaign round asks of an item of share ``weight``, in units of
    a share-1 item's examples. Round 0 asks every item for one: each item is
    tried once before any is tried twice, and its first examples measure what
    it costs and reaches before the schedule weighs it (a 30-minute campaign
    whose round 0 gave share-12 quantized items three examples each spent 82 %
    of its flow results there and never ran 43 of its 70 items)."""
    return math.ceil(weight / ROUND_SLICES) if round_index else 1


def item_share(item) -> int:
    """An item's designed share of a campaign round (``share``; the coverage
    corpus sets its own)."""
    return getattr(getattr(item, "function", None), "etprop_share", 1)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """In a campaign, each round runs first the items furthest behind their
    designed share (examples so far over share), so a round the budget cuts
    short is made up for by the next one; among equals, larger shares first
    from round 1 on (what a cut then leaves out is single examples, owed first
    next round), then each round starting at another place in the list. Items a slice of
    their share or more ahead of the least served sit the round out."""
    served_file = option(config, "served")
    round_index = int(option(config, "round", 0))
    if not served_file and not round_index:
        return
    served = json.loads(Path(served_file).read_text()) if served_file else {}
    schedule_file = option(config, "schedule")
    earned = (
        {item: entry["earned"] for item, entry in json.loads(Path(schedule_file).read_text()).items()}
        if schedule_file and Path(schedule_file).is_file()
        else {}
    )
    offset = int((round_index * ROUND_ROTATION) % 1 * len(items))
    rotated = {id(item): (position - offset) % len(items) for position, item in enumerate(items)}

    def share_now(item) -> float:
        """The share the campaign's schedule gives the item, or its designed one."""
        return earned.get(item.nodeid) or item_share(item)

    def ratio(item) -> float:
        return served.get(item.nodeid, 0) / share_now(item)

    def weight(item) -> float:
        # Round 0 asks every item for one example, so shares do not order it.
        return share_now(item) if round_index else 1

    items.sort(key=lambda item: (ratio(item), -weight(item), rotated[id(item)]))
    config.etprop_round_items = list(items)
    if items:
        behind = ratio(items[0]) + 1 / ROUND_SLICES
        ahead = [item for item in items if ratio(item) >= behind]
        if ahead:
            items[:] = [item for item in items if ratio(item) < behind]
            config.hook.pytest_deselected(items=ahead)


def pytest_collection_finish(session):
    """Every item a campaign round selected, by the name its results carry,
    with its designed share: the summary counts an item the budget never
    reached as served 0 times, not as absent."""
    from etprop.verdicts.repro import atomic_write

    config = session.config
    if not session.items or (not option(config, "served") and not int(option(config, "round", 0))):
        return  # not a campaign round, or an xdist controller (its workers collect)
    collected = {item.nodeid: item_share(item) for item in getattr(config, "etprop_round_items", session.items)}
    directory = Path(option(config, "artifacts", "artifacts"))
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write(directory / "collected.json", json.dumps(collected, sort_keys=True))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    from etprop.strategies.reproducible import draws_independent_of_imported_source

    with draws_independent_of_imported_source():
        yield


def _seed_generation(seed: int) -> None:
    """Seed the random source Hypothesis draws each test's seed from when no
    seed is forced, so generation is reproducible and the database stays on."""
    import random

    import hypothesis.core

    hypothesis.core.threadlocal._hypothesis_global_random = random.Random(seed)


def selected_flows(config) -> list:
    from etprop import flows

    names = option(config, "flows")
    if names:
        return [flows.get_available(name) for name in names.split(",") if name]
    return flows.available_flows()


def quantized_flow_groups(chosen: list) -> list[tuple]:
    """Each flow that promises to delegate quantized GEMMs (XNNPACK) with the
    chosen candidates built on it, baseline first: one drawn program is
    lowered on all of them and compared with the baseline."""
    groups = []
    for base in chosen:
        if "gemm_quantized_weight" in base.promises.delegates and base.baseline in (None, "portable"):
            groups.append((base, *(f for f in chosen if f.baseline == base.name)))
    return groups


def share(weight: int):
    """A property's share of a campaign's examples: ``weight`` times a
    property's default (each campaign round asks every property for the same
    number). Outside campaigns (``dev``, ``ci``) it changes nothing."""
    from hypothesis import settings as hypothesis_settings

    def apply(test):
        test.etprop_share = weight
        if not ACTIVE_PROFILE.startswith("fuzz"):
            return test
        per_round = hypothesis_settings.default.max_examples * round_examples(weight, CAMPAIGN_ROUND)
        return hypothesis_settings(max_examples=per_round)(test)

    return apply


# Families with a differential property: it lowers each drawn program on a
# candidate flow and its baseline and runs every single-flow oracle on both
# (oracles/sets.py: DIFFERENTIAL contains SINGLE_FLOW). Under the ``ci``
# profile their single-flow properties run on the flows that are no selected
# flow's candidate; the candidates are judged through the differential
# properties' programs. A campaign runs every flow in both.
TWINNED_FAMILIES = {"mixed", "computed_weights", "control_flow", "multi_method", "real_models", "quantized"}


def _judged_by_its_twin(flow, chosen: list) -> bool:
    """Whether ``flow`` is a candidate whose baseline is among ``chosen`` (a differential pair)."""
    return bool(flow.baseline) and flow.baseline != "portable" and any(f.name == flow.baseline for f in chosen)


def pytest_generate_tests(metafunc):
    """Parametrize ``flow`` (one flow) and ``flow_pair`` (baseline, candidate)."""
    marker = metafunc.definition.get_closest_marker("etprop_family")
    family = marker.args[0] if marker else None
    chosen = [
        f for f in selected_flows(metafunc.config) if family is None or f.families is None or family in f.families
    ]
    if "flow" in metafunc.fixturenames:
        single = chosen
        if ACTIVE_PROFILE.startswith("ci") and family in TWINNED_FAMILIES:
            single = [f for f in chosen if not _judged_by_its_twin(f, chosen)]
        metafunc.parametrize("flow", single, ids=[f.name for f in single])
    if "quantized_flow_group" in metafunc.fixturenames:
        groups = quantized_flow_groups(chosen)
        metafunc.parametrize("quantized_flow_group", groups, ids=["+".join(f.name for f in g) for g in groups])
    if "flow_pair" in metafunc.fixturenames:
        from etprop import flows

        gate = os.environ.get("ETPROP_GATE")
        if gate:
            pairs = [tuple(flows.get_available(name) for name in gate.split(","))]
        else:
            pairs = [
                (flows.get(f.baseline), f)
                for f in chosen
                if f.baseline and f.baseline != "portable" and flows.get(f.baseline).available
            ]
        metafunc.parametrize("flow_pair", pairs, ids=[f"{b.name}-vs-{c.name}" for b, c in pairs])


@pytest.fixture(scope="session")
def etprop(pytestconfig):
    from etprop.verdicts.session import Session

    module = option(pytestconfig, "flow_module")
    session = Session(
        Path(option(pytestconfig, "artifacts", "artifacts")), flow_modules=module.split(",") if module else []
    )
    yield session
    session.close()


@pytest.fixture(autouse=True)
def _etprop_item(request):
    """Results name the test item and its designed share, so a campaign's
    summary can set what each property x flow got against what it was given."""
    if "etprop" in request.fixturenames:
        artifacts = request.getfixturevalue("etprop").artifacts
        artifacts.item, artifacts.share = request.node.nodeid, item_share(request.node)
    yield


def pytest_terminal_summary(terminalreporter, config):
    results_dir = Path(option(config, "artifacts", "artifacts")) / "results"
    if not results_dir.is_dir() or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    counts: Counter = Counter()
    repros = set()
    for path in results_dir.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            for flow in record["flows"]:
                label = flow["outcome"] + (f" (known: {flow['known']})" if flow["known"] else "")
                counts[(record["property"], flow["flow"], label)] += 1
            if record.get("repro"):
                repros.add(record["repro"])
    if not counts:
        return
    terminalreporter.section("etprop: outcomes per property x flow")
    for (prop, flow, outcome), n in sorted(counts.items()):
        terminalreporter.write_line(f"  {prop:28} {flow:24} {outcome:32} {n}")
    for path in sorted(repros):
        terminalreporter.write_line(f"  repro: {path}")
