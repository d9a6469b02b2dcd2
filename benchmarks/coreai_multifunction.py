"""Benchmark: Core AI multifunction export against stock, two methods sharing weights.

Model: 8 x Linear(1024, 1024) fp32 (32 MiB of weights), ``forward`` on 1 row and
``prefill`` on 16 rows. For the stock ``coreai`` flow and ``coreai+multifunction``
it prints the .pte size, the number of Core AI bundles in the named data, the
lowering time, and the time to load and run both methods once with
CoreAIProgram (bundles written, loaded, each method run), then the steady-state
time of one more run of each.

Run: .venv/bin/python benchmarks/coreai_multifunction.py
"""

from __future__ import annotations

import time

import torch
from torch import nn

from etprop import flows
from etprop.lowering.coreai_runtime import CoreAIProgram, bundle_hashes

LAYERS, WIDTH, PREFILL_ROWS = 8, 1024, 16


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def lower(flow, module):
    from executorch.exir import to_edge_transform_and_lower

    with flow.context():
        exported = {
            "forward": torch.export.export(module, (torch.randn(1, WIDTH),)),
            "prefill": torch.export.export(module, (torch.randn(PREFILL_ROWS, WIDTH),)),
        }
        edge = to_edge_transform_and_lower(
            exported,
            partitioner=flow.partitioners(),
            transform_passes=flow.transform_passes(),
            compile_config=flow.compile_config(),
        )
        return edge.to_executorch()


def measure(name: str, module) -> dict:
    flow = flows.get(name)
    t0 = time.perf_counter()
    program = lower(flow, module)
    lowered = time.perf_counter() - t0
    pte = program.buffer
    bundles = {key.split("/")[1] for key in program._named_data.pte_data if key.startswith("coreai/")}
    inputs = {"forward": torch.randn(1, WIDTH), "prefill": torch.randn(PREFILL_ROWS, WIDTH)}
    t0 = time.perf_counter()
    with CoreAIProgram(program, pte) as runner:
        for method, x in inputs.items():
            runner.run(method, [x])
        first = time.perf_counter() - t0
        t1 = time.perf_counter()
        for method, x in inputs.items():
            out = runner.run(method, [x])[0]
            torch.testing.assert_close(out, module(x).detach(), rtol=1e-4, atol=1e-4)
        again = time.perf_counter() - t1
        loaded = len(runner._loaded)
    return {
        "flow": name,
        "pte_mib": len(pte) / 2**20,
        "bundles": len(bundles),
        "hashes": len(set(bundle_hashes(program).values())),
        "loaded": loaded,
        "lower_s": lowered,
        "load_and_run_s": first,
        "run_again_s": again,
    }


def main() -> None:
    torch.manual_seed(0)
    module = Stack().eval()
    print(
        f"{LAYERS} x Linear({WIDTH}, {WIDTH}) fp32, forward 1 row, prefill {PREFILL_ROWS} rows; "
        f"weights {sum(p.numel() for p in module.parameters()) * 4 / 2**20:.1f} MiB"
    )
    rows = [measure(name, module) for name in ("coreai", "coreai+multifunction")]
    print(
        f"{'flow':<22}{'pte MiB':>9}{'bundles':>9}{'hashes':>8}{'loaded':>8}{'lower s':>9}"
        f"{'load+run s':>12}{'run again s':>13}"
    )
    for r in rows:
        print(
            f"{r['flow']:<22}{r['pte_mib']:>9.2f}{r['bundles']:>9}{r['hashes']:>8}{r['loaded']:>8}"
            f"{r['lower_s']:>9.2f}{r['load_and_run_s']:>12.3f}{r['run_again_s']:>13.4f}"
        )


if __name__ == "__main__":
    main()
