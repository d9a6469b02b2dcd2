"""A backend change shipped as its own package: XNNPACK with weights computed
from parameters folded into the delegate, registered as the flow
``xnnpack+fold-pkg`` through etprop's ``etprop.flows`` entry point. Installed
only in a gate's candidate environment; the baseline environment knows no such
flow and gates stock ``xnnpack``."""

import dataclasses

from etprop.candidates.xnnpack_fold import XNNPACK_FOLD
from etprop.flows import register

FLOW = register(
    dataclasses.replace(
        XNNPACK_FOLD, name="xnnpack+fold-pkg", description="xnnpack+fold installed as an outside package"
    )
)
