"""Which oracles each property runs; one place, so a new oracle joins every property."""

from etprop.oracles import equivalence


def _equivalence(lowering, lowerings):
    return equivalence.check(lowering)


SINGLE_FLOW = [_equivalence]
