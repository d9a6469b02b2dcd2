"""Repro: Core AI delegates drop ``alpha`` from add/sub, silently.

Needs only torch 2.13, executorch 1.5.1, coreai-torch 0.4.2 and coreai-core
1.0.0b2. Lowers ``torch.add(x, y, alpha=2.0)`` and friends with the stock Core
AI recipe, runs the delegate's bundle on coreai-core's Linux runtime, and
compares with eager. The bundle's program (printed) has plain
``broadcasting_add``/``broadcasting_sub`` with no multiply by alpha. Exits 1
on a mismatch.
"""

import asyncio
import json
import sys
import tempfile
from pathlib import Path

import torch
from coreai.authoring import AIModelAsset
from coreai.runtime import NDArray
from executorch.backends.apple.coreai import (
    CoreAIPartitioner,
    get_default_compile_config,
    get_default_passes,
)
from executorch.exir import to_edge_transform_and_lower

NAMES = ["add(x, 1.0, alpha=2.0)", "add(x, y, alpha=2.0)", "sub(x, 1.0, alpha=2.0)",
         "sub(x, y, alpha=3.0)", "add(x, 1.0) (control)"]


class Alpha(torch.nn.Module):
    def forward(self, x, y):
        return (torch.add(x, 1.0, alpha=2.0), torch.add(x, y, alpha=2.0),
                torch.sub(x, 1.0, alpha=2.0), torch.sub(x, y, alpha=3.0), torch.add(x, 1.0))


def bundle(program, out: Path) -> Path:
    lowered = program.exported_program().graph_module.lowered_module_0
    manifest = json.loads(bytes(lowered.processed_bytes))
    store = program._named_data
    for rel in manifest["files"]:
        entry = store.pte_data[f"coreai/{manifest['hash']}/{rel}"]
        target = out / manifest["hash"] / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(store.buffers[entry.buffer_index])
    return out / manifest["path"]


async def run_bundle(path: Path, inputs: dict) -> list:
    asset = AIModelAsset.load(path)
    graph = asset.program.get_graph("main")
    outputs = [attr["coreai.name"].value for attr in graph.res_attrs]
    async with asset.executable() as model:
        results = await model.load_function("main")({k: NDArray(v) for k, v in inputs.items()})
    return [torch.from_numpy(results[name].numpy().copy()) for name in outputs]


def main() -> int:
    x, y = torch.zeros(2, 3), torch.ones(2, 3)
    module = Alpha().eval()
    program = to_edge_transform_and_lower(
        torch.export.export(module, (x, y)),
        partitioner=[CoreAIPartitioner()],
        transform_passes=get_default_passes(),
        compile_config=get_default_compile_config(),
    ).to_executorch()
    path = bundle(program, Path(tempfile.mkdtemp()))
    print(AIModelAsset.load(path).program)
    got = asyncio.run(run_bundle(path, {"x": x, "y": y}))
    wrong = 0
    for name, g, w in zip(NAMES, got, module(x, y)):
        ok = torch.equal(g, w)
        wrong += not ok
        print(f"{name:24s} Core AI {g[0, 0].item():+.1f}  eager {w[0, 0].item():+.1f}  {'ok' if ok else 'WRONG'}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
