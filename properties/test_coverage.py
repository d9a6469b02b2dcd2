"""The coverage corpus on every flow: programs chosen so that together they
reach every (op, argument value, dtype) combination the generator draws
(etprop/strategies/coverage_corpus.py), packed several to a lowering, each judged like
a drawn program of its family. A campaign makes the corpus once (its
``coverage/``) and each round asks every flow for the next programs it has not
judged, most new combinations first, so no drawable combination waits for a
lucky draw; shard i of N takes every N-th program. Outside a campaign only the
first float program of a smaller pool runs: the property's machinery on CI's
budget (the quantized properties run PT2E in CI on their own; a packed quantized
program costs minutes on Core AI)."""

import os
from pathlib import Path

import pytest
from hypothesis import settings

from etprop.oracles.sets import ORACLES_BY_PROPERTY
from etprop.strategies import coverage_corpus as coverage
from etprop.verdicts.session import record_only

# Programs each round asks a flow for, times a float property's examples.
COVERAGE_SHARE = 4
# Drawn programs per family outside a campaign.
SMALL_POOL = 8


def _programs(flow, artifacts: Path) -> list[dict]:
    campaign = record_only()
    specs, _ = coverage.stored(artifacts / "coverage", coverage.POOL_PER_FAMILY if campaign else SMALL_POOL)
    programs = [program for program, _ in coverage.packed(specs, coverage.pack_size_for(flow.runtime))]
    index, count = (int(part) for part in os.environ.get("ETPROP_SHARD", "0/1").split("/"))
    if campaign:
        return programs[index::count]
    return [program for program in programs if not program.get("quantization")][:1]


def per_round() -> int:
    """Programs this round judges per flow: the coverage share of a campaign
    round; one outside a campaign."""
    return settings.default.max_examples * COVERAGE_SHARE if record_only() else 1


@pytest.mark.etprop_family("coverage")
def test_coverage_corpus(flow, etprop):
    wanted = per_round()
    for program in _programs(flow, etprop.artifacts.root):
        if wanted == 0:
            return
        prop = "coverage_multi_method" if len(program["methods"]) > 1 else "coverage"
        if record_only() and etprop.already_judged(program, [flow], prop):
            continue
        if etprop.check(program, [flow], prop, ORACLES_BY_PROPERTY[prop]) is None:
            return  # past the campaign's budget
        wanted -= 1


test_coverage_corpus.etprop_share = COVERAGE_SHARE
