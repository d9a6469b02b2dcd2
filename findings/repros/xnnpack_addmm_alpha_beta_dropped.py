"""executorch 1.5.1: XNNPACK delegates addmm with beta/alpha != 1 and drops both.

AddmmConfig accepts the call (only the weight/bias kinds are checked) and the
lowering to XNNFullyConnected has no place for beta/alpha, so the delegate
computes bias + x @ w. Silent wrong results. Expected: the call stays on
portable (or the scales are applied).

    python findings/repros/xnnpack_addmm_alpha_beta_dropped.py

Needs only torch 2.13 and executorch 1.5.1; a few seconds on CPU. Exits 1
(AssertionError) while the defect is present.
"""

import torch
import torch.nn as nn
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from executorch.runtime import Runtime


class ScaledAddmm(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 16))
        self.b = nn.Parameter(torch.randn(16))

    def forward(self, x):
        return torch.addmm(self.b, x, self.w, beta=0.5, alpha=0.25)


def main():
    torch.manual_seed(0)
    module, x = ScaledAddmm().eval(), torch.randn(4, 16)
    edge = to_edge_transform_and_lower(torch.export.export(module, (x,)),
                                       partitioner=[XnnpackPartitioner()])
    print(edge.exported_program().graph)
    buffer = edge.to_executorch().buffer
    program = Runtime.get().load_program(buffer)
    got = program.load_method("forward").execute([x])[0]
    with torch.no_grad():
        expected = module(x)
        unscaled = module.b + x @ module.w
    print("max |got - eager|            =", float((got - expected).abs().max()))
    print("max |got - (b + x @ w)|      =", float((got - unscaled).abs().max()))
    del program
    torch.testing.assert_close(got, expected)


if __name__ == "__main__":
    main()
