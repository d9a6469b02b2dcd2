"""Quantized programs (PT2E with executorch's XNNPACKQuantizer): single-method
programs on every flow alone; single-method, computed-weight and control-flow
programs on the XNNPACK flows together, one quantization scheme per item, the
candidates compared with stock XNNPACK; multi-method programs on every
baseline/candidate pair. The lowering matches the converted Q/DQ program within
its quantization bound, delegates its quantized GEMMs where the flow promises
to, and keeps every structural promise.

In a campaign the XNNPACK item of each scheme starts from twice a float
property's share (one program fills its scheme's three XNNPACK flow cells, at
two to three times a float lowering's cost), and the power schedule
(etprop/commands/schedule.py) moves it from there by the new lowering code it
reaches per CPU-second. Four schemes at share 2 are some 11 % of a round's
examples and a quarter of its flow results; at share 12 the family took 57 to
82 % of a 30-minute campaign's flow results and left float families one
example each."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from etprop.commands.pytest_plugin import share
from etprop.oracles.sets import DIFFERENTIAL, DIFFERENTIAL_MULTI_METHOD, SINGLE_FLOW
from etprop.program.quantize import SCHEMES
from etprop.strategies.control_flow import control_flow_programs
from etprop.strategies.programs import (
    computed_weight_programs,
    multi_method_programs,
    programs,
    quantized,
    quantized_programs,
)

XNNPACK_SHARE = 2


@pytest.mark.etprop_family("quantized")
@given(spec=quantized_programs())
def test_quantized_programs(flow, spec, etprop):
    etprop.check(spec, [flow], "quantized", SINGLE_FLOW)


@pytest.mark.etprop_family("quantized")
@pytest.mark.parametrize("scheme", SCHEMES)
@share(XNNPACK_SHARE)
@given(data=st.data())
def test_differential_quantized(quantized_flow_group, scheme, data, etprop):
    families = st.one_of(
        programs(min_nodes=4, max_nodes=24, gemm_heavy=True, dtype="float32"),
        computed_weight_programs(),
        control_flow_programs(),
    )
    spec = data.draw(quantized(families, (scheme,)), label="spec")
    etprop.check(spec, list(quantized_flow_group), "differential_quantized", DIFFERENTIAL)


@pytest.mark.etprop_family("quantized")
@given(spec=quantized(multi_method_programs()))
def test_differential_quantized_multi_method(flow_pair, spec, etprop):
    etprop.check(spec, list(flow_pair), "differential_multi_method", DIFFERENTIAL_MULTI_METHOD)
