"""Example of a flow defined outside etprop (the README's worked example):
XNNPACK with the engineer's partitioner change. Replace partitioners() with yours."""

from etprop.flows import Flow, Promises, register


def partitioners():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return [XnnpackPartitioner()]


register(
    Flow(
        name="my-xnnpack",
        description="XNNPACK with my partitioner change",
        partitioners=partitioners,
        baseline="xnnpack",
        promises=Promises(delegates=frozenset({"gemm_static_weight"})),
    )
)
