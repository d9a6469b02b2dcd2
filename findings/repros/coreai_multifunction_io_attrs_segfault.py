"""Repro: reading a multifunction Core AI bundle's I/O attributes segfaults intermittently.

Needs only torch 2.13, coreai-torch 0.4.2 and coreai-core 1.0.0b2. Converts
``relu`` twice into one bundle with two functions (``forward_0``, ``prefill_0``,
as a multifunction lowering does), saves it, then in a child process repeats,
each time in its own ``asyncio.run``: ``AIModelAsset.load(path)``, and for each
function the ``coreai.name`` of every ``graph.arg_attrs`` and ``graph.res_attrs``
entry (the function's input and output names, in graph order).

Observed (2-CPU Linux x86-64): every child run died with SIGSEGV inside
``arg_attrs`` (``coreai/_compiler/dialects/_coreai_ops_gen.py``): after 85, 110
and 299 loads alone, after 29 to 69 loads with two such processes at once (6 of
6 runs). The same reads in a plain loop, without the event loop, ran 6,000 loads
without a crash. Exits 1 at the first child run that crashes (up to RUNS runs of LOADS loads).
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from coreai_torch import TorchConverter

LOADS = 2000
RUNS = 5

READER = """
import asyncio, sys
from coreai.authoring import AIModelAsset

async def read_names(path):
    asset = AIModelAsset.load(path)
    for function in ("forward_0", "prefill_0"):
        graph = asset.program.get_graph(function)
        [a["coreai.name"].value for a in graph.arg_attrs]
        [a["coreai.name"].value for a in graph.res_attrs]

for i in range(int(sys.argv[2])):
    asyncio.run(read_names(sys.argv[1]))
    print(i + 1, flush=True)
"""


class Relu(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)


def build_bundle(directory: Path) -> Path:
    converter = TorchConverter()
    for name in ("forward_0", "prefill_0"):
        exported = torch.export.export(Relu(), (torch.randn(1, 1),))
        converter.add_exported_program(exported.run_decompositions({}), entrypoint_name=name)
    path = directory / "model.aimodel"
    converter.to_coreai().save_asset(path)
    return path


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        bundle = build_bundle(Path(tmp))
        crashes = []
        for run in range(RUNS):
            child = subprocess.run([sys.executable, "-c", READER, str(bundle), str(LOADS)],
                                   capture_output=True, text=True, timeout=600)
            loads = len(child.stdout.split())
            print(f"run {run + 1}: exit code {child.returncode} after {loads} loads", flush=True)
            if child.returncode < 0:
                crashes.append((loads, -child.returncode))
                break
        assert not crashes, (f"reading a multifunction bundle's I/O attributes crashed: signal {crashes[0][1]} "
                             f"after {crashes[0][0]} loads in run {run + 1}")
        print(f"no crash in {RUNS} runs of {LOADS} loads")


if __name__ == "__main__":
    main()
