"""Scoring a campaign's corpus against the semantic mutant catalogue
(etprop/program/semantic_mutants.py): which mutants the stored lowered
outputs would have caught, by the suite's own oracle, without lowering again.
benchmarks/mutation_score.py prints the figures."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import torch

# A mutant variant that does not fit its program fails in shape inference; torch logs each one.
logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)


def load_corpus(artifacts: Path, flows: set[str] | None) -> tuple[list[dict], Counter]:
    """Corpus entries in the order the campaign recorded them, with each
    entry's wall-clock offset from the campaign's first example."""
    from etprop.program.spec import all_nodes

    skipped: Counter = Counter()
    entries = []
    for path in sorted((artifacts / "corpus").glob("*.pt")):
        entry = torch.load(path, weights_only=False)
        spec = entry["spec"]
        if spec.get("quantization"):
            skipped["quantized"] += 1
            continue
        if any(
            node["op"] == "buffer_update" and node.get("attrs", {}).get("in_place", True) for _, node in all_nodes(spec)
        ):
            skipped["stateful (mutable buffers)"] += 1
            continue
        entry["flows"] = {f: v for f, v in entry["flows"].items() if not flows or f in flows}
        if entry["flows"]:
            entries.append(entry)
    entries.sort(key=lambda e: e["recorded"])
    if entries:
        start = min(e["recorded"] - e["seconds"] for e in entries)
        for index, entry in enumerate(entries):
            entry["offset"] = entry["recorded"] - start
            entry["index"] = index + 1
    return entries, skipped


class Program:
    """A corpus program built once, its float64 outputs per case cached."""

    def __init__(self, entry: dict):
        from etprop.program import builder

        self.entry = entry
        self.spec = entry["spec"]
        self.dtype = self.spec.get("dtype", "float32")
        self.built = builder.build(self.spec, validate=False)
        self.inputs = {
            (method, kind): inputs for method in self.built.methods for kind, inputs in self.built.input_cases(method)
        }
        self._wide: dict = {}
        self._shapes: dict | None = None

    def wide(self, built, method, kind) -> list:
        return [
            t.double() if t.is_floating_point() else t for t in built._wide(method, self.inputs[(method, kind)], True)
        ]

    def original_wide(self, method, kind) -> list:
        if (method, kind) not in self._wide:
            self._wide[(method, kind)] = self.wide(self.built, method, kind)
        return self._wide[(method, kind)]

    @property
    def shapes(self) -> dict:
        """Each top-level node's shape on the program's first inputs."""
        if self._shapes is None:
            from etprop.program.semantic_mutants import node_shapes

            first = {}
            for (method, _), inputs in self.inputs.items():
                first.setdefault(method, inputs)
            try:
                self._shapes = node_shapes(self.built, first)
            except Exception:  # no fitted forms then: its shape-changing mutants stay unbuilt
                self._shapes = {}
        return self._shapes

    def cases(self) -> list[tuple]:
        first = next(iter(self.entry["flows"].values()))
        return [(method, kind) for method, kind, _ in first["cases"] if (method, kind) in self.inputs]


def mutated(program: Program, mutant, tried: list | None = None) -> tuple[object | None, bool]:
    """The mutant's program for ``program`` and whether it changes the float64
    result visibly. Of the variants that build, the first that changes the
    result and keeps every output's shape; else the first that changes it;
    else the first that builds (an equivalent one). ``tried`` collects the
    variants, so a caller can tell "no form to mutate" from "none builds"."""
    from etprop.program import builder, mutants

    best, rank = (None, False), 3
    for variant in mutant.variants(program.spec, program.shapes):
        if tried is not None:
            tried.append(variant)
        try:
            built = builder.build(variant)
            changes = [
                (program.original_wide(method, kind), program.wide(built, method, kind))
                for method, kind in program.cases()
            ]
        except Exception:
            continue
        same_shapes = all(len(b) == len(a) and all(x.shape == y.shape for x, y in zip(b, a)) for b, a in changes)
        visible = any(
            len(b) != len(a) or any(mutants.visible(x, y, _dtype(program.dtype)) for x, y in zip(b, a))
            for b, a in changes
        )
        this = 0 if visible and same_shapes else 1 if visible else 2
        if this < rank:
            best, rank = (built, visible), this
        if rank == 0:
            break
    return best


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def killed_by(program: Program, built) -> list[str]:
    """Flows whose stored outputs fail the oracle against ``built``'s reference."""
    from etprop.oracles import tolerance

    flows = []
    # Flows of one runtime share their error budgets, so their references: one per case and runtime.
    references: dict = {}
    for flow, record in program.entry["flows"].items():
        runtime = record["runtime"] or "executorch"
        ulps = tolerance.op_ulps(runtime, program.dtype)
        for method, kind, actual in record["cases"]:
            inputs = program.inputs.get((method, kind))
            if inputs is None:
                continue
            key = (method, kind, runtime)
            if key not in references:
                references[key] = built.reference(method, inputs, ulps=ulps)
            if tolerance.judge(references[key], actual, runtime).problem:
                flows.append(flow)
                break
    return flows


def score(entries: list[dict], catalogue: list, limit: int | None, progress=None) -> list[dict]:
    """One row per (mutant, dtype) the catalogue and the corpus's dtypes give,
    where the strategies draw what the mutant changes in that dtype;
    ``progress`` is called with each row as it is decided.

    ``held`` counts the programs holding the op, ``programs`` those of them in
    a form the mutant changes (it has a variant), which alone are tried:
    ``limit`` bounds those, so a twin or a drawn argument that comes late in
    the corpus is not cut off by earlier programs that cannot show it."""
    programs: dict[int, Program] = {}
    dtypes = sorted({e["spec"].get("dtype", "float32") for e in entries})
    rows = []
    for mutant in catalogue:
        for dtype in filter(mutant.drawn_in, dtypes):
            row = {"mutant": mutant, "dtype": dtype, "status": "never drawn", "held": 0, "programs": 0, "unbuilt": 0}
            for entry in entries:
                if entry["spec"].get("dtype", "float32") != dtype or not mutant.applies_to(entry["spec"]):
                    continue
                row["held"] += 1
                if (
                    row["status"] == "killed"
                    or (limit and row["programs"] >= limit)
                    or next(mutant.variants(entry["spec"]), None) is None
                ):
                    continue
                row["programs"] += 1
                if entry["index"] not in programs:
                    try:
                        programs[entry["index"]] = Program(entry)
                    except Exception:  # a corpus program this version no longer builds: it shows nothing
                        continue
                program = programs[entry["index"]]
                tried: list = []
                built, visible = mutated(program, mutant, tried)
                if built is None:
                    # Variants that all fail to build (a shape the rest of the
                    # program needs changed): not the same as no variant at all.
                    row["unbuilt"] += bool(tried)
                    continue
                if row["status"] == "never drawn":
                    row["status"] = "equivalent"
                if not visible:
                    continue
                row["status"] = "survived"
                try:
                    flows = killed_by(program, built)
                except (
                    Exception
                ):  # its jittered reference does not run (an argument reset out of range): not killed here
                    continue
                if flows:
                    row.update(status="killed", flows=flows, examples=entry["index"], seconds=entry["offset"])
            rows.append(row)
            if progress:
                progress(row)
    return rows
