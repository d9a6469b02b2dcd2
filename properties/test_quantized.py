"""Quantized programs (PT2E with executorch's XNNPACKQuantizer): single-method
programs on every flow, multi-method programs on every baseline/candidate pair.
The lowering matches the converted Q/DQ program within its quantization bound,
delegates its quantized GEMMs where the flow promises to, and keeps every
structural promise."""

import pytest
from hypothesis import given

from etprop.oracles.sets import DIFFERENTIAL_MULTI_METHOD, SINGLE_FLOW
from etprop.strategies.programs import multi_method_programs, quantized, quantized_programs


@pytest.mark.etprop_family("quantized")
@given(spec=quantized_programs())
def test_quantized_programs(flow, spec, etprop):
    etprop.check(spec, [flow], "quantized", SINGLE_FLOW)


@pytest.mark.etprop_family("quantized")
@given(spec=quantized(multi_method_programs()))
def test_differential_quantized_multi_method(flow_pair, spec, etprop):
    etprop.check(spec, list(flow_pair), "differential_multi_method", DIFFERENTIAL_MULTI_METHOD)
