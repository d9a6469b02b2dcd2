"""executorch 1.5.1: a Linear inside a torch.cond branch or a map body fails XNNPACK lowering.

torch.export lifts the Linear's parameters to the top level and passes them
to the higher-order op; inside the body they are placeholders that keep the
top-level placeholder names (``p_l_weight``). XnnpackPartitioner's
do-not-decompose filter judges body nodes against the top-level signature by
node name, so it keeps the body's ``aten.linear`` undecomposed; the
partitioner itself never looks inside bodies, and the final sanity check
raises "Node aten_linear_default ... was not decomposed or delegated".
Expected: the program lowers (body GEMM delegated, or decomposed and left on
portable kernels). A scan body (placeholders named ``arg2_1``) lowers, on
portable kernels.

    python findings/repros/xnnpack_control_flow_linear_not_delegated.py

Needs only torch 2.13 and executorch 1.5.1; a few seconds on CPU. Exits 1
while the defect is present.
"""

import sys

import torch
import torch.nn as nn
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower


class LinearInBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(8, 8)

    def forward(self, x):
        return torch.cond(x.mean() > 0, lambda x: self.l(x).relu(), lambda x: x.tanh(), (x,))


def main() -> int:
    torch.manual_seed(0)
    exported = torch.export.export(LinearInBranch().eval(), (torch.randn(4, 8),), strict=False)
    try:
        to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()]).to_executorch()
    except RuntimeError as exc:
        print(f"lowering failed: {str(exc).splitlines()[0]}")
        return 1
    print("lowered: fixed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
