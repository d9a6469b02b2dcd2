"""torch 2.13 decomposition (inherited by every ExecuTorch 1.5.1 flow): weight_norm of a 1-D tensor.

``weight_norm(module, "bias", dim=0)`` on a 1-D parameter normalizes each
element by its own magnitude (eager: ``g * v / |v|``). The ``_weight_norm``
decomposition in torch/_decomp/decompositions.py computes the norm over
"all dims except ``dim``", which for a 1-D tensor is the empty tuple, and
``v.norm(2, (), keepdim=True)`` reduces over *all* dims. So the exported
program's ``run_decompositions()``, the edge program, the portable .pte and
every XNNPACK lowering compute ``g * v / ||v||`` instead.

Found by etprop's fuzzer on flows xnnpack and xnnpack+fold (a Linear whose
bias was weight-normed). Needs only torch 2.13 and executorch 1.5.1; a few
seconds on CPU. Exits 1 while the defect is present.

    python findings/repros/torch_weight_norm_1d_decomposition.py
"""

import sys

import torch
import torch.nn as nn
from executorch.exir import to_edge
from executorch.runtime import Runtime
from torch.nn.utils import parametrizations


class BiasNormed(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 12)
        parametrizations.weight_norm(self.lin, "bias", dim=0)

    def forward(self, x):
        return self.lin(x)


def main() -> int:
    torch.manual_seed(0)
    module, x = BiasNormed().eval(), torch.randn(2, 8)
    exported = torch.export.export(module, (x,))
    edge = to_edge(exported)
    print(edge.exported_program().graph)
    buffer = edge.to_executorch().buffer
    program = Runtime.get().load_program(buffer)
    with torch.no_grad():
        results = {
            "eager": module(x),
            "exported (aten)": exported.module()(x),
            "run_decompositions()": exported.run_decompositions().module()(x),
            "portable .pte": program.load_method("forward").execute([x])[0],
        }
    for name, value in results.items():
        err = float((value - results["eager"]).abs().max())
        print(f"{name:<22} max |diff vs eager| = {err:.4g}")
    del program
    return 1 if float((results["portable .pte"] - results["eager"]).abs().max()) > 1e-4 else 0


if __name__ == "__main__":
    sys.exit(main())
