"""Imported once by the isolation forkserver, so every worker starts warm."""

import torch  # noqa: F401
from executorch.exir import to_edge_transform_and_lower  # noqa: F401
from executorch.runtime import Runtime  # noqa: F401

import etprop.flows  # noqa: F401
import etprop.oracles.sets  # noqa: F401
import etprop.verdicts.check  # noqa: F401

try:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner  # noqa: F401
except ImportError:
    pass
