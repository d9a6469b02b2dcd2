"""Every drawn single-method program, on every flow: the lowering matches eager
and satisfies the flow's structural promises."""

import pytest
from hypothesis import given

from etprop.properties.oracle_sets import SINGLE_FLOW
from etprop.strategies.programs import computed_weight_programs, programs


@pytest.mark.etprop_family("mixed")
@given(spec=programs(min_nodes=6, max_nodes=40))
def test_mixed_programs(flow, spec, etprop):
    etprop.check(spec, [flow], "mixed", SINGLE_FLOW)


@pytest.mark.etprop_family("computed_weights")
@given(spec=computed_weight_programs())
def test_computed_weight_programs(flow, spec, etprop):
    etprop.check(spec, [flow], "computed_weights", SINGLE_FLOW)
