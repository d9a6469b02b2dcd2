"""Repro: Core AI bundles in ExecuTorch 1.5.1 are not content-addressed or reproducible.

Needs only torch 2.13, executorch 1.5.1, coreai-torch 0.4.2 and coreai-core
1.0.0b2. Runs in about 30 s on CPU; prints what it observes and exits 1 if
any of the three defects shows.

1. The bundle hash (the ``coreai/<hash>/`` key and ``main.hash``) depends on
   where the model's source file lives and on its unrelated lines, because
   coreai-torch writes debug locations (absolute path, line, sha256 of the
   whole source file) into ``main.mlirb``. For source compiled under a pseudo
   file name (generated code), the name is resolved against the working
   directory, so the hash changes with the process's cwd.
2. Lowering the same model twice gives different .pte bytes: each bundle's
   ``metadata.json`` stamps ``creationDate`` to the second.
3. Two methods whose delegates have the same hash fail to lower with
   "Duplicate key ... metadata.json with different data" whenever the second
   ticks between their preprocess calls (seen naturally in 1 of 12 runs of a
   two-method lowering; forced here by a clock that ticks on every reading).
"""

import hashlib
import importlib.util
import json
import linecache
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from executorch.backends.apple.coreai import (
    CoreAIPartitioner,
    get_default_compile_config,
    get_default_passes,
)
from executorch.exir import to_edge_transform_and_lower

SOURCE = '''import torch


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))
'''


def load_class(path: Path):
    spec = importlib.util.spec_from_file_location(f"tiny_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Tiny


def lower(methods):
    exported = {name: torch.export.export(m, (torch.ones(2, 8),)) for name, m in methods.items()}
    return to_edge_transform_and_lower(
        exported,
        partitioner=[CoreAIPartitioner()],
        transform_passes=get_default_passes(),
        compile_config=get_default_compile_config(),
    ).to_executorch()


def manifest(program, method="forward"):
    lowered = program.exported_program(method).graph_module.lowered_module_0
    return json.loads(bytes(lowered.processed_bytes))


def tiny(cls):
    torch.manual_seed(0)
    return cls().eval()


def main() -> int:
    defects = 0
    root = Path(tempfile.mkdtemp())
    paths = {"a/tiny.py": SOURCE, "b/tiny.py": SOURCE, "c/tiny.py": SOURCE + "# an unrelated comment\n"}
    classes = {}
    for rel, text in paths.items():
        (root / rel).parent.mkdir(parents=True)
        (root / rel).write_text(text)
        classes[rel] = load_class(root / rel)

    # 1. Same weights, same code; only the file's directory or a comment differs.
    hashes = {rel: manifest(lower({"forward": tiny(cls)}))["hash"] for rel, cls in classes.items()}
    for rel, h in hashes.items():
        print(f"[1] model defined in {rel:10s} -> bundle hash {h[:16]}")
    name = "<generated tiny>"
    linecache.cache[name] = (len(SOURCE), None, SOURCE.splitlines(True), name)
    namespace = {"__name__": "generated"}
    exec(compile(SOURCE, name, "exec"), namespace)
    for workdir in ("a", "b"):
        os.chdir(root / workdir)
        hashes[f"{name} in cwd {workdir}"] = h = manifest(lower({"forward": tiny(namespace["Tiny"])}))["hash"]
        print(f"[1] {name} lowered with cwd {workdir} -> bundle hash {h[:16]}")
    if len(set(hashes.values())) > 1:
        defects += 1
        print("[1] DEFECT: identical models get different bundle hashes")

    # 2. The same model lowered twice, a little over a second apart.
    model = tiny(classes["a/tiny.py"])
    first = lower({"forward": model})
    time.sleep(1.1)
    second = lower({"forward": model})
    same_hash = manifest(first)["hash"] == manifest(second)["hash"]
    same_pte = hashlib.sha256(first.buffer).digest() == hashlib.sha256(second.buffer).digest()
    print(f"[2] same bundle hash: {same_hash}; same .pte bytes: {same_pte}")
    if same_hash and not same_pte:
        defects += 1
        print("[2] DEFECT: the .pte differs only by metadata.json creationDate")

    # 3. One model in two methods: identical delegates, one NamedDataStore key.
    import coreai.authoring.asset as asset

    class TickingClock:
        now = time.time()

        @classmethod
        def time(cls):
            cls.now += 1.0
            return cls.now

    real_time = asset.time
    asset.time = TickingClock
    try:
        lower({"forward": model, "again": model})
        print("[3] two methods with identical delegates lowered fine")
    except ValueError as exc:
        defects += 1
        print(f"[3] DEFECT: {exc}")
    finally:
        asset.time = real_time
    return 1 if defects else 0


if __name__ == "__main__":
    sys.exit(main())
