"""Every drawn single-method program, on every flow: the lowering matches eager
and satisfies the flow's structural promises."""

import pytest
from hypothesis import given

from etprop.oracles.sets import MULTI_METHOD, SINGLE_FLOW
from etprop.strategies.control_flow import control_flow_programs
from etprop.strategies.model_windows import real_model_windows
from etprop.strategies.model_zoo import INSTALL_HINT, installed
from etprop.strategies.programs import computed_weight_programs, multi_method_programs, programs

# Windows of real architectures' graphs (etprop.strategies.model_windows).
needs_model_library = pytest.mark.skipif(not installed(), reason=f"no model library installed: {INSTALL_HINT}")


@pytest.mark.etprop_family("mixed")
@given(spec=programs(min_nodes=6, max_nodes=40))
def test_mixed_programs(flow, spec, etprop):
    etprop.check(spec, [flow], "mixed", SINGLE_FLOW)


@pytest.mark.etprop_family("computed_weights")
@given(spec=computed_weight_programs())
def test_computed_weight_programs(flow, spec, etprop):
    etprop.check(spec, [flow], "computed_weights", SINGLE_FLOW)


@pytest.mark.etprop_family("control_flow")
@given(spec=control_flow_programs())
def test_control_flow_programs(flow, spec, etprop):
    etprop.check(spec, [flow], "control_flow", SINGLE_FLOW)


@pytest.mark.etprop_family("multi_method")
@given(spec=multi_method_programs())
def test_multi_method_programs(flow, spec, etprop):
    etprop.check(spec, [flow], "multi_method", MULTI_METHOD)


@pytest.mark.etprop_family("real_models")
@needs_model_library
@given(spec=real_model_windows())
def test_real_model_windows(flow, spec, etprop):
    etprop.check(spec, [flow], "real_models", SINGLE_FLOW)
