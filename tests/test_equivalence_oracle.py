"""The eager-equivalence oracle passes on portable and fails on a lowering that
perturbs weights, naming the method, input and output."""

import pytest
import torch

from etprop.program import builder
from etprop import flows
from etprop.lowering import pipeline
from etprop.oracles import equivalence
from etprop.verdicts.outcomes import Outcome


@pytest.fixture(scope="module")
def built(make_linear_relu_spec):
    return builder.build(make_linear_relu_spec())


def test_passes_on_portable(built):
    lowering = pipeline.lower(built, flows.get("portable"))
    assert lowering.ok, lowering.error
    verdict = equivalence.check(lowering)
    assert verdict.ok, verdict.message
    assert verdict.details["runs"] == len(equivalence.INPUT_KINDS_DEFAULT)


def test_fails_on_perturbed_weights(built, broken_flow):
    lowering = pipeline.lower(built, broken_flow)
    assert lowering.ok, lowering.error
    verdict = equivalence.check(lowering)
    assert not verdict.ok
    assert verdict.outcome is Outcome.MISMATCH
    assert "method 'forward'" in verdict.message and "output 0" in verdict.message


def test_compare_policy():
    want = [torch.tensor([1.0, float("nan"), float("inf")])]
    assert equivalence.compare(want, [torch.tensor([1.0005, float("nan"), float("inf")])]) is None
    assert "output 0" in equivalence.compare(want, [torch.tensor([1.0, 0.0, float("inf")])])
    assert "output 0" in equivalence.compare(want, [torch.tensor([1.0, float("nan"), -float("inf")])])
    assert "outputs" in equivalence.compare(want, [])
    assert "eager gives" in equivalence.compare(want, [torch.zeros(2)])
