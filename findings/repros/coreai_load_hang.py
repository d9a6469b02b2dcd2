"""Repro: Core AI on Linux never finishes loading a bundle whose constant goes
through a chain of scalar multiplications sharing a factor with another
multiplication of the program.

Needs only torch 2.13, executorch 1.5.1, coreai-torch 0.4.2 and coreai-core
1.0.0b2. Lowers ``x * g + (p * f1 * f2 ...).sum()`` (``p`` a parameter, ``g``
absent or a scalar) with the stock Core AI recipe, writes the delegate's
bundle out of the named data, and loads it with ``AIModelAsset.executable()``
in a child process limited to 4 GB of address space and LOAD_SECONDS. The
controls (one factor; distinct factors; the input scaled by a factor of a
one-step chain) load in well under a second. Then two GEMMs, one weight
scaled by f and another's bias multiplied by a buffer then by g: with f == g
the bundle does not load; the buffer stored already multiplied by g loads.
Exits 1 if a chain that shares a factor does not load.

Observed: the load does not return (no error); left alone, memory grows
steadily (13 GB after about five minutes in one run).
"""

import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from executorch.backends.apple.coreai import (
    CoreAIPartitioner,
    get_default_compile_config,
    get_default_passes,
)
from executorch.exir import to_edge_transform_and_lower

LOAD_SECONDS = 30

LOADER = """
import asyncio, sys, time
from coreai.authoring import AIModelAsset

async def main():
    started = time.time()
    async with AIModelAsset.load(sys.argv[1]).executable() as model:
        print(f"loaded in {time.time() - started:.2f} s", flush=True)

asyncio.run(main())
"""


class Scaled(torch.nn.Module):
    def __init__(self, factors: tuple, input_factor=None):
        super().__init__()
        self.p = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 3))
        self.factors = factors
        self.input_factor = input_factor

    def forward(self, x):
        # The input's multiplication first: in graph order after the chain, it loads.
        scaled_input = x if self.input_factor is None else x * self.input_factor
        value = self.p
        for factor in self.factors:
            value = value * factor
        return scaled_input + value.sum()


class ScaledBiases(torch.nn.Module):
    """Two GEMMs: ``addmm(b, x, q * f)`` and ``addmm(p * buf * g, x, w)``,
    ``buf`` a buffer: a chain of a tensor and a scalar multiplication."""

    def __init__(self, f, g, buffer_factor=1.0):
        super().__init__()
        self.q = torch.nn.Parameter(torch.linspace(-2.0, 1.0, 36).reshape(3, 12))
        self.b = torch.nn.Parameter(torch.linspace(-1.0, 2.0, 12))
        self.p = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 14).reshape(1, 14))
        self.w = torch.nn.Parameter(torch.linspace(-1.0, 2.0, 28).reshape(2, 14))
        self.register_buffer("buf", torch.linspace(0.5, 1.5, 14).reshape(1, 14) * buffer_factor)
        self.f, self.g = f, g

    def forward(self, x):
        weight = self.q if self.f is None else self.q * self.f
        bias = self.p * self.buf if self.g is None else self.p * self.buf * self.g
        return torch.addmm(self.b, x[:, :3], weight), torch.addmm(bias, x[:, :2], self.w)


# (factors of p's chain, the input's factor); then ScaledBiases(f, g, buffer_factor)
CONTROLS = (((-1.0,), None), ((2.0, 3.0), None), ((0.5, 2.0), None), ((0.5,), 2.0))
SHARED = (((-1.0, -1.0), None), ((2.0, 0.5, 2.0), None), ((0.5, 2.0), 2.0))
BIAS_CONTROLS = ((None, -2.0, 1.0), (-2.0, 3.0, 1.0), (-2.0, None, -2.0))
BIAS_SHARED = ((-2.0, -2.0, 1.0),)


def bundle(module: torch.nn.Module, out: Path) -> Path:
    ep = torch.export.export(module.eval(), (torch.randn(2, 3),))
    program = to_edge_transform_and_lower(
        ep,
        partitioner=[CoreAIPartitioner()],
        transform_passes=get_default_passes(),
        compile_config=get_default_compile_config(),
    ).to_executorch()
    lowered = program.exported_program().graph_module.lowered_module_0
    manifest = json.loads(bytes(lowered.processed_bytes))
    store = program._named_data
    for rel in manifest["files"]:
        entry = store.pte_data[f"coreai/{manifest['hash']}/{rel}"]
        target = out / manifest["hash"] / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(store.buffers[entry.buffer_index])
    return out / manifest["path"]


def limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def load(path: Path) -> str:
    try:
        done = subprocess.run([sys.executable, "-c", LOADER, str(path)], capture_output=True,
                              text=True, timeout=LOAD_SECONDS, preexec_fn=limit_memory)
    except subprocess.TimeoutExpired:
        return f"did not load within {LOAD_SECONDS} s"
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("loaded")]
    return lines[-1] if lines else f"failed (rc={done.returncode}): {done.stderr[-500:]}"


def main() -> int:
    out = Path(tempfile.mkdtemp())
    stuck = []
    for factors, input_factor in CONTROLS + SHARED:
        name = "x".join(map(str, factors)) + f"_input{input_factor}"
        result = load(bundle(Scaled(factors, input_factor), out / name))
        shown = f"p * {' * '.join(map(str, factors))}" + (f" beside x * {input_factor}" if input_factor else "")
        print(f"{shown}: {result}")
        if (factors, input_factor) in SHARED and not result.startswith("loaded"):
            stuck.append(shown)
    for f, g, buffer_factor in BIAS_CONTROLS + BIAS_SHARED:
        result = load(bundle(ScaledBiases(f, g, buffer_factor), out / f"biases_{f}_{g}_{buffer_factor}"))
        shown = (f"addmm(b, x, q * {f}) beside addmm(p * buf * {g}, x, w)"
                 + (f" with buf stored times {buffer_factor}" if buffer_factor != 1.0 else ""))
        print(f"{shown}: {result}")
        if (f, g, buffer_factor) in BIAS_SHARED and not result.startswith("loaded"):
            stuck.append(shown)
    if not stuck:
        return 0
    print(f"DEFECT: the Core AI runtime does not finish loading a constant's scalar chain that shares a factor: {stuck}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
