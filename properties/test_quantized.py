"""Quantized programs (PT2E with executorch's XNNPACKQuantizer): single-method
programs on every flow alone; single-method, computed-weight and control-flow
programs on the XNNPACK flows together, one quantization scheme per item, the
candidates compared with stock XNNPACK; multi-method programs on every
baseline/candidate pair. The lowering matches the converted Q/DQ program within
its quantization bound, delegates its quantized GEMMs where the flow promises
to, and keeps every structural promise.

In a campaign the XNNPACK item of each scheme draws twelve times a float
property's examples per round (one program fills its scheme's three XNNPACK
flow cells), so that each scheme x XNNPACK flow cell gets 20 or more examples
in a 30-minute campaign on two cores: the items with the largest share run
first among equally served ones, so a round cut short by the budget still
gives every scheme its examples."""

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

XNNPACK_SHARE = 12


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
