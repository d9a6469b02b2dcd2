"""Repro: etprop's shared-cache oracle judges the stock coreai flow by the clock.

Needs etprop (the oracle under test), torch 2.13, executorch 1.5.1,
coreai-torch 0.4.2 and coreai-core 1.0.0b2. About 30 s on CPU. Exits 1 while
the verdict depends on the clock.

One module, two methods at different shapes (forward 1 row, prefill 4 rows),
lowered twice with the stock ``coreai`` flow: once with coreai-core's clock
frozen (both delegates saved in the same second), once with a clock that ticks
on every reading. Each delegate is its own bundle, and each bundle's
``metadata.json`` holds only the producer and the creation time, so in the
frozen case the two 105-byte files are identical under two keys
(``coreai/<hash A>/...`` and ``coreai/<hash B>/...``). ``oracles.shared_cache``
fails every flow that stores the same bytes under two keys, so stock coreai,
which promises no sharing, passes or fails depending on whether the second
ticked between the two conversions.
"""

import sys
import time
from types import SimpleNamespace

import torch
from torch import nn


class Shared(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x):
        return torch.relu(self.fc(x))


def lower_stock(clock):
    import coreai.authoring.asset as asset
    from executorch.exir import to_edge_transform_and_lower

    from etprop import flows

    flow = flows.get("coreai")
    saved = asset.time
    asset.time = clock
    try:
        torch.manual_seed(0)
        module = Shared().eval()
        exported = {"forward": torch.export.export(module, (torch.randn(1, 64),)),
                    "prefill": torch.export.export(module, (torch.randn(4, 64),))}
        edge = to_edge_transform_and_lower(exported, partitioner=flow.partitioners(),
                                           transform_passes=flow.transform_passes(),
                                           compile_config=flow.compile_config())
        program = edge.to_executorch()
    finally:
        asset.time = saved
    from etprop.lowering.pipeline import Lowering

    return Lowering(flow=flow, built=SimpleNamespace(methods=["forward", "prefill"]), exported={},
                    executorch=program)


class Frozen:
    now = time.time()

    @classmethod
    def time(cls):
        return cls.now


class Ticking:
    now = time.time()

    @classmethod
    def time(cls):
        cls.now += 1.0
        return cls.now


def main():
    from etprop.oracles import shared_cache

    frozen = shared_cache.check(lower_stock(Frozen))
    ticking = shared_cache.check(lower_stock(Ticking))
    print("same second :", "pass" if frozen.ok else f"FAIL ({frozen.message})")
    print("clock ticked:", "pass" if ticking.ok else f"FAIL ({ticking.message})")
    if frozen.ok != ticking.ok:
        print("DEFECT: the shared-cache verdict for stock coreai depends on the clock")
        sys.exit(1)
    print("verdict does not depend on the clock")


if __name__ == "__main__":
    main()
