"""Repro: a float64 multiplication by a Python float reads the float rounded
to float32 once ``to_edge_transform_and_lower`` lifts it into a float32 tensor
constant (0.8333333333333334 becomes 0.8333333134651184).

Needs only torch 2.13 and executorch 1.5.1; no delegate (portable kernels).
Both programs return the product with a relative error of 2e-8, far beyond
float64 rounding; a floor() of it moves nearest-resize indices (output 6 of a
10 -> 12 resize reads 4, not 5). Prints each program's lifted constants and
both results; exits 1 while they differ.
"""

import torch
from executorch.exir import to_edge_transform_and_lower
from executorch.runtime import Runtime


class InputCastToDouble(torch.nn.Module):
    def forward(self, x):
        return x.double() * 0.8333333333333334


class Float64Arange(torch.nn.Module):
    def forward(self, x):
        return torch.arange(4, dtype=torch.float64) * 0.8333333333333334 + x


wrong = []
for module in (InputCastToDouble(), Float64Arange()):
    x = torch.ones(4)
    edge = to_edge_transform_and_lower(torch.export.export(module, (x,)))
    lifted = {name: (str(value.dtype), value.tolist()) for name, value in edge.exported_program().state_dict.items()}
    # The runtime reads the program's bytes in place: keep them alive while it runs.
    buffer = edge.to_executorch().buffer
    method = Runtime.get().load_program(buffer).load_method("forward")
    got, expected = method.execute([x])[0], module(x)
    print(f"{type(module).__name__}: lifted {lifted}")
    print(f"  eager   {expected.tolist()}\n  lowered {got.tolist()}")
    if not torch.equal(got, expected):
        wrong.append(type(module).__name__)
assert not wrong, f"float64 products by a Python float differ after lowering: {', '.join(wrong)}"
