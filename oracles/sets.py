"""Which oracles each property runs; one place, so a new oracle joins every property."""

from etprop.oracles import coverage, cycles, differential, equivalence, growth, shared_cache


def _equivalence(lowering, lowerings):
    return equivalence.check(lowering)


# The numbers alone (the tolerance benchmark re-checks its failures with it).
EQUIVALENCE = [_equivalence]
# Every single-flow property reads one lowering with all of these.
SINGLE_FLOW = [_equivalence, growth.check, cycles.check, coverage.check]
DIFFERENTIAL = SINGLE_FLOW + [differential.check]
MULTI_METHOD = SINGLE_FLOW + [shared_cache.check]
DIFFERENTIAL_MULTI_METHOD = DIFFERENTIAL + [shared_cache.check]

# The oracles each property runs, by the property name recorded in repros.
ORACLES_BY_PROPERTY = {
    "mixed": SINGLE_FLOW,
    "computed_weights": SINGLE_FLOW,
    "differential": DIFFERENTIAL,
    "control_flow": SINGLE_FLOW,
    "multi_method": MULTI_METHOD,
    "quantized": SINGLE_FLOW,
    "real_models": SINGLE_FLOW,
    "differential_quantized": DIFFERENTIAL,
    "differential_multi_method": DIFFERENTIAL_MULTI_METHOD,
    "equivalence": EQUIVALENCE,
    # The coverage corpus (properties/test_coverage.py): its single-method and multi-method programs.
    "coverage": SINGLE_FLOW,
    "coverage_multi_method": MULTI_METHOD,
}
