"""The stock flows: what executorch 1.5.1 does out of the box."""

from __future__ import annotations

from etprop.flows import register
from etprop.flows.base import Flow, Promises

# Op families a flow promises to delegate; see oracles/coverage.py.
XNNPACK_GEMMS_WITH_PARAMETER_WEIGHTS = frozenset({"gemm_static_weight", "gemm_quantized_weight"})


XNNPACK_RECIPE = """
def partitioners():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return [XnnpackPartitioner()]


def transform_passes():
    return []


def compile_config():
    return None
"""


def _xnnpack_partitioners() -> list:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return [XnnpackPartitioner()]


PORTABLE = register(
    Flow(
        name="portable",
        description="No partitioner: every op on ExecuTorch's portable kernels (the reference lowering)",
    )
)

XNNPACK = register(
    Flow(
        name="xnnpack",
        description="Stock XnnpackPartitioner from executorch 1.5.1",
        partitioners=_xnnpack_partitioners,
        baseline="portable",
        repro_recipe=XNNPACK_RECIPE,
        promises=Promises(delegates=XNNPACK_GEMMS_WITH_PARAMETER_WEIGHTS),
    )
)
