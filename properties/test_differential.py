"""Baseline vs candidate on the same drawn program (one export, two lowerings):
both match eager, the candidate lowers whenever the baseline does, is not
larger and delegates no less; over multi-method programs, shared weights are
also stored once across methods. ``etprop gate`` runs exactly these."""

import pytest
from hypothesis import given

from etprop.oracles.sets import DIFFERENTIAL, DIFFERENTIAL_MULTI_METHOD
from etprop.strategies.control_flow import control_flow_programs
from etprop.strategies.model_windows import real_model_windows
from etprop.strategies.model_zoo import INSTALL_HINT, installed
from etprop.strategies.programs import computed_weight_programs, multi_method_programs, programs

# Windows of real architectures' graphs (etprop.strategies.model_windows).
needs_model_library = pytest.mark.skipif(not installed(), reason=f"no model library installed: {INSTALL_HINT}")


@pytest.mark.etprop_family("mixed")
@given(spec=programs(min_nodes=6, max_nodes=32))
def test_differential_mixed(flow_pair, spec, etprop):
    etprop.check(spec, list(flow_pair), "differential", DIFFERENTIAL)


@pytest.mark.etprop_family("computed_weights")
@given(spec=computed_weight_programs())
def test_differential_computed_weights(flow_pair, spec, etprop):
    etprop.check(spec, list(flow_pair), "differential", DIFFERENTIAL)


@pytest.mark.etprop_family("control_flow")
@given(spec=control_flow_programs())
def test_differential_control_flow(flow_pair, spec, etprop):
    etprop.check(spec, list(flow_pair), "differential", DIFFERENTIAL)


@pytest.mark.etprop_family("multi_method")
@given(spec=multi_method_programs())
def test_differential_multi_method(flow_pair, spec, etprop):
    etprop.check(spec, list(flow_pair), "differential_multi_method", DIFFERENTIAL_MULTI_METHOD)


@pytest.mark.etprop_family("real_models")
@needs_model_library
@given(spec=real_model_windows())
def test_differential_real_models(flow_pair, spec, etprop):
    etprop.check(spec, list(flow_pair), "differential", DIFFERENTIAL)
