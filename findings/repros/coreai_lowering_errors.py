"""Repro: modules the CoreAIPartitioner claims but coreai-torch 0.4.2 cannot convert.

Needs only torch 2.13, executorch 1.5.1, coreai-torch 0.4.2 and coreai-core
1.0.0b2. Each case is lowered with the stock Core AI recipe; the partitioner
claims the op, so conversion fails and to_edge_transform_and_lower raises
instead of leaving the op on CPU. Exits 1 if any case fails.
"""

import sys

import torch
import torch.nn.functional as F
from executorch.backends.apple.coreai import (
    CoreAIPartitioner,
    get_default_compile_config,
    get_default_passes,
)
from executorch.exir import to_edge_transform_and_lower
from torch import nn


class AvgPool(nn.Module):
    def __init__(self, **options):
        super().__init__()
        self.options = options

    def forward(self, x):
        return F.avg_pool2d(x, 2, **self.options)


CASES = {
    # export drops the default count_include_pad: 5 args, and replace_avg_pool2d
    # reads args[5] after checking len(args) > 4.
    "avg_pool2d(x, 2, ceil_mode=True)": (AvgPool(ceil_mode=True), (torch.randn(1, 2, 5, 5),)),
    # stride defaults to [] in ATen; replace_avg_pool2d only replaces None.
    "avg_pool2d(x, 2, ceil_mode=True, count_include_pad=False)": (
        AvgPool(ceil_mode=True, count_include_pad=False), (torch.randn(1, 2, 5, 5),)),
    # No weight/bias and a length dim: ExpandDimsOp creation fails in the
    # batch_norm lowering's expand_and_cast (2-D input and affine=True convert).
    "BatchNorm1d(4, affine=False) on [N, C, L]": (nn.BatchNorm1d(4, affine=False), (torch.randn(2, 4, 3),)),
    # Controls.
    "avg_pool2d(x, 2) (control)": (AvgPool(), (torch.randn(1, 2, 5, 5),)),
    "BatchNorm1d(4) on [N, C, L] (control)": (nn.BatchNorm1d(4), (torch.randn(2, 4, 3),)),
}


def lower(module, args) -> str:
    try:
        to_edge_transform_and_lower(
            torch.export.export(module.eval(), args),
            partitioner=[CoreAIPartitioner()],
            transform_passes=get_default_passes(),
            compile_config=get_default_compile_config(),
        ).to_executorch()
        return "ok"
    except Exception as exc:  # the defect is the exception; report it
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"


def main() -> int:
    failed = 0
    for name, (module, args) in CASES.items():
        result = lower(module, args)
        failed += result != "ok"
        print(f"{name}: {result}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
