"""Structural mutants: flows that lower correctly in numbers but break a
structural promise, each standing for one kind of backend defect the
structural oracles exist to catch. benchmarks/structural_mutants.py runs them
in a short campaign and reports which were killed, and by what.

Load with ``--flow-module benchmarks/structural_mutant_flows.py``.
"""

from __future__ import annotations

import contextlib

from etprop.flows import register
from etprop.flows.base import Flow, Promises
from etprop.flows.stock import XNNPACK_GEMMS_WITH_PARAMETER_WEIGHTS

# The GEMMs, and the transposes of their weights: a GEMM whose weight a
# delegated transpose feeds is judged a computed weight by the coverage oracle
# (it does not read delegate outputs), so the mutant keeps those on portable too.
GEMM_TARGETS = ("linear.default", "addmm.default", "mm.default", "permute_copy.default")


def _xnnpack_without_gemms() -> list:
    """XNNPACK's partitioner with its GEMM (and transpose) configurations
    removed: every GEMM stays on portable kernels while the flow still
    promises to delegate them."""
    from executorch.backends.xnnpack.partition.config import ALL_PARTITIONER_CONFIGS
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return [
        XnnpackPartitioner(
            configs=[config for config in ALL_PARTITIONER_CONFIGS if config.target_name not in GEMM_TARGETS]
        )
    ]


def _xnnpack() -> list:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return [XnnpackPartitioner()]


@contextlib.contextmanager
def _payloads_stored_again():
    """While lowering, a payload added under a key the store already holds
    (a weight two delegates or two methods share) is stored again under a new
    key, in a buffer of its own: the weight is stored twice."""
    from executorch.exir._serialize._named_data_store import NamedDataStore

    original = NamedDataStore._add_named_data_to_map

    def stored_again(self, key, data, alignment, local_key_to_buffer_idx, tensor_layout=None):
        if key in self.key_to_buffer_idx:
            key = f"{key}.again{len(self.buffers)}"
        self.fingerprint_to_buffer_idx = {}
        return original(self, key, data, alignment, local_key_to_buffer_idx, tensor_layout)

    NamedDataStore._add_named_data_to_map = stored_again
    try:
        yield
    finally:
        NamedDataStore._add_named_data_to_map = original


def _xnnpack_one_partition() -> list:
    """XNNPACK's partitioner, its partitions then merged under the first tag:
    two partitions with a portable op between them become one that a path
    leaves and re-enters (a cycle once fused)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    class OnePartition(XnnpackPartitioner):
        def partition(self, exported_program):
            result = super().partition(exported_program)
            if len(result.partition_tags) > 1:
                first, *others = sorted(result.partition_tags)
                for node in result.tagged_exported_program.graph_module.graph.nodes:
                    if node.meta.get("delegation_tag") in others:
                        node.meta["delegation_tag"] = first
                for tag in others:
                    del result.partition_tags[tag]
            return result

    return [OnePartition()]


def _xnnpack_mutant(name: str, description: str, partitioners, context=contextlib.nullcontext) -> Flow:
    """A mutant of stock XNNPACK, making XNNPACK's promises."""
    return register(
        Flow(
            name=name,
            description=f"structural mutant: XNNPACK {description}",
            partitioners=partitioners,
            context=context,
            baseline="xnnpack",
            promises=Promises(delegates=XNNPACK_GEMMS_WITH_PARAMETER_WEIGHTS),
        )
    )


_xnnpack_mutant("mutant-gemm-on-portable", "that leaves every GEMM on portable kernels", _xnnpack_without_gemms)
_xnnpack_mutant("mutant-weight-twice", "whose shared weights are stored once per use", _xnnpack, _payloads_stored_again)
_xnnpack_mutant(
    "mutant-cyclic-partition", "whose partitions are merged into one, across portable ops", _xnnpack_one_partition
)


def _separate_payloads():
    from etprop.flows import get

    stock = get("coreai")
    return Flow(
        name="mutant-separate-payloads",
        description="structural mutant: stock Core AI (a bundle per method) claiming one shared bundle",
        partitioners=stock.partitioners,
        transform_passes=stock.transform_passes,
        compile_config=stock.compile_config,
        make_runner=stock.make_runner,
        runtime="coreai",
        requires=stock.requires,
        install_hint=stock.install_hint,
        baseline="coreai",
        promises=Promises(shared_cache=True, weights_stored_once=False),
        families=("multi_method",),
    )


register(_separate_payloads())
