"""The coverage corpus on every flow: programs chosen so that together they
reach every (op, argument value, dtype) combination the generator draws
(strategies/coverage_corpus.py), packed several to a lowering (in a
campaign with the causes of the flow's recorded findings neutralized), each
judged like a drawn program of its family. A campaign makes the corpus once (its
``coverage/``) and each round asks every flow for the next programs it has not
judged, most new combinations first, so no drawable combination waits for a
lucky draw; shard i of N takes every N-th program, and flows running the same
packs each start at their own point, so a short campaign runs most of the
corpus on some flow. Outside a campaign only the first float program of each
stream of a smaller pool, packed two specs to a program with the flow's known
causes neutralized, runs: the property's machinery on CI's budget (the
quantized properties run PT2E in CI on their own; a packed quantized program
costs minutes on Core AI)."""

import functools
import hashlib
import os
from pathlib import Path

import pytest
from hypothesis import settings

from etprop.commands import pytest_plugin
from etprop.commands.pytest_plugin import round_examples, selected_flows
from etprop.oracles.sets import ORACLES_BY_PROPERTY
from etprop.strategies import coverage_corpus as coverage
from etprop.verdicts import known_findings
from etprop.verdicts.session import record_only

# Each stream's share of a campaign, in a float property's examples:
# single-method programs (packs, and specs run as drawn) and multi-method ones.
# Each stream is its own test item, so the campaign's scheduler serves them in
# proportion like every other item. A pack costs about ten drawn programs; a
# larger share (6, or packs of 25) left coverage items under half their share
# in a default 30-minute campaign.
SHARES = {"coverage": 3, "coverage_multi_method": 1}
# Drawn programs per family outside a campaign, from the families alone (not
# the targeted draws of coverage_corpus.pool_strategies, whose first pack
# holds the causes of a dozen findings).
SMALL_POOL = 8
# Specs per program outside a campaign: still a pack (two specs in one
# lowering), smaller than a campaign's (ten; three on Core AI).
CI_PACK_SIZE = 2


def _programs(flow, artifacts: Path, flows: list) -> dict[str, list[dict]]:
    """This shard's corpus programs as ``flow`` runs them, by property; in a
    campaign each of the ``flows`` with the same pack size starts at its own
    point of each packing class (coverage_corpus.packed). Both streams' items of one
    round share the packing (_programs_cached)."""
    campaign = record_only()
    specs, _ = coverage.stored(
        artifacts / "coverage", coverage.POOL_PER_FAMILY if campaign else SMALL_POOL, targeted=campaign
    )

    def without_known_causes(spec):
        return known_findings.neutralized(spec, known_findings.causes_on(flow.name, spec))[0]

    size = coverage.pack_size_for(flow.runtime) if campaign else CI_PACK_SIZE
    index, count = (int(part) for part in os.environ.get("ETPROP_SHARD", "0/1").split("/"))
    if campaign:
        peers = [
            other.name
            for other in flows
            if coverage.pack_size_for(other.runtime) == size
            and (other.families is None or "coverage" in other.families)
        ]
        findings = hashlib.sha256(known_findings.INDEX.read_bytes()).hexdigest()
        programs = coverage.for_flow_stored(
            artifacts / "coverage",
            f"{flow.name}:{findings}",
            specs,
            size,
            without_known_causes,
            peers.index(flow.name),
            len(peers),
        )
    else:
        # Packed as a campaign packs them, the flow's recorded causes
        # neutralized, unstored (a small pool builds in seconds).
        programs = coverage.for_flow(specs, size, without_known_causes)
    programs = [program for program, _ in programs][index::count]
    by_property = {
        prop: [program for program in programs if (len(program["methods"]) > 1) == (prop != "coverage")]
        for prop in SHARES
    }
    if not campaign:
        by_property = {
            prop: [program for program in stream if not program.get("quantization")][:1]
            for prop, stream in by_property.items()
        }
    return by_property


def per_round(prop: str) -> int:
    """Programs of ``prop`` this round judges per flow: its slice of a
    campaign round (pytest_plugin.round_examples); one outside a campaign."""
    if not record_only():
        return 1
    return settings.default.max_examples * round_examples(SHARES[prop], pytest_plugin.CAMPAIGN_ROUND)


@functools.lru_cache(maxsize=4)
def _programs_cached(flow_name: str, artifacts: str, flow_names: tuple, shard: str, campaign: bool) -> dict:
    from etprop import flows

    return _programs(flows.get(flow_name), Path(artifacts), [flows.get(name) for name in flow_names])


def _judge(prop: str, flow, etprop, request) -> None:
    """Judge this round's next ``per_round(prop)`` programs of the stream not
    yet judged in this campaign."""
    chosen = tuple(other.name for other in selected_flows(request.config))
    programs = _programs_cached(
        flow.name, str(etprop.artifacts.root), chosen, os.environ.get("ETPROP_SHARD", "0/1"), record_only()
    )[prop]
    wanted = per_round(prop)
    for program in programs:
        if wanted == 0:
            break
        if record_only() and etprop.already_judged(program, [flow], prop):
            continue
        if etprop.check(program, [flow], prop, ORACLES_BY_PROPERTY[prop]) is None:
            return  # past the campaign's budget
        wanted -= 1


@pytest.mark.etprop_family("coverage")
def test_coverage_corpus(flow, etprop, request):
    _judge("coverage", flow, etprop, request)


@pytest.mark.etprop_family("coverage")
def test_coverage_corpus_multi_method(flow, etprop, request):
    _judge("coverage_multi_method", flow, etprop, request)


test_coverage_corpus.etprop_share = SHARES["coverage"]
test_coverage_corpus_multi_method.etprop_share = SHARES["coverage_multi_method"]
