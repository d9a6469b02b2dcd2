"""executorch 1.5.1: a mutated buffer used as a GEMM weight crashes the XNNPACK program.

``is_param_node`` counts every buffer, mutated or not, as static data, so the
linear is delegated with the buffer baked in as a constant weight, and the
buffer's update (``add``) lands in the same delegate. The top-level program
loses the BUFFER_MUTATION output and ``execute`` segfaults. Without a
partitioner the same program runs. Expected: a mutated buffer is never a
static weight (the GEMM stays on portable, or the weight is a runtime input).

    python findings/repros/xnnpack_mutated_buffer_weight_segfault.py

Needs only torch 2.13 and executorch 1.5.1; about 15 s on CPU. The XNNPACK
child exits with -11 (SIGSEGV) on 1.5.1; the script exits 1 while it does.
"""

import subprocess
import sys

CHILD = r'''
import sys
import torch, torch.nn as nn, torch.nn.functional as F
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from executorch.runtime import Runtime

class MutatedWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.randn(16, 16))

    def forward(self, x):
        y = F.linear(x, self.w)
        self.w.add_(1.0)
        return y

torch.manual_seed(0)
x = torch.randn(4, 16)
partitioner = [XnnpackPartitioner()] if sys.argv[1] == "xnnpack" else []
edge = to_edge_transform_and_lower(torch.export.export(MutatedWeight(), (x,)), partitioner=partitioner)
print(edge.exported_program().graph, flush=True)
buffer = edge.to_executorch().buffer
program = Runtime.get().load_program(buffer)
out = program.load_method("forward").execute([x])[0]
print("output shape", tuple(out.shape), flush=True)
'''


def main() -> int:
    codes = {}
    for flow in ("portable", "xnnpack"):
        result = subprocess.run([sys.executable, "-c", CHILD, flow], capture_output=True, text=True)
        codes[flow] = result.returncode
        print(f"--- {flow}: exit code {result.returncode}")
        print(result.stdout)
    return 1 if codes["portable"] == 0 and codes["xnnpack"] != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
