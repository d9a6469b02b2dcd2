"""executorch 1.5.1: an XNNPACK partition that returns a value and its clone fails to lower.

The partitioner puts ``y`` and ``y.clone()`` in one partition with both as
outputs. XNNPACK's preprocess removes the clone, so the delegate graph returns
the same node twice, and ``generate_node_to_external_map`` rejects it:
"Output node 'aten_linear_default' is already in the inputs ... pass through
arguments". Expected: the program lowers (the clone kept, or the partitioner
leaving it out). Every scan body of the form ``return carry, carry.clone()``
(torch requires the clone) has this shape.

    python findings/repros/xnnpack_clone_output_passthrough.py

Needs only torch 2.13 and executorch 1.5.1; a few seconds on CPU. Exits 1
while the defect is present.
"""

import sys

import torch
import torch.nn as nn
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower


class ValueAndClone(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(8, 8)

    def forward(self, x):
        y = self.l(x)
        return y, y.clone()


def main() -> int:
    torch.manual_seed(0)
    exported = torch.export.export(ValueAndClone().eval(), (torch.randn(2, 8),), strict=False)
    try:
        to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()]).to_executorch()
    except RuntimeError as exc:
        print(f"lowering failed: {exc}")
        return 1
    print("lowered: fixed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
