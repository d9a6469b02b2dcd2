"""Which oracles each property runs; one place, so a new oracle joins every property."""

from etprop.oracles import differential, equivalence


def _equivalence(lowering, lowerings):
    return equivalence.check(lowering)


SINGLE_FLOW = [_equivalence]
DIFFERENTIAL = [_equivalence, differential.check]

# The oracles each property runs, by the property name recorded in repros.
ORACLES_BY_PROPERTY = {
    "mixed": SINGLE_FLOW,
    "computed_weights": SINGLE_FLOW,
    "differential": DIFFERENTIAL,
}
