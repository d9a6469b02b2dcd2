"""The property engine: one drawn spec, lowered once per flow, every oracle read
from those lowerings, failures recorded before they can be lost.

Order of events for an example:
1. the spec is written to ``pending/`` (so a crash in native code later leaves it on disk);
2. build, export once, lower once per flow (a baseline and a candidate share the export);
3. every oracle reads the lowering(s);
4. the session attributes failures to known findings by intervention (session.py);
5. ``finish``: a new failure is written to ``repros/`` (JSON + standalone script),
   the result to ``results/``; the pending file goes.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from etprop.flows.base import Flow
from etprop.lowering import pipeline, reach, stages
from etprop.oracles import Verdict, differential
from etprop.program import builder, coverage_space
from etprop.program import spec as specmod
from etprop.program.quantize import QuantizationFailed
from etprop.verdicts import repro
from etprop.verdicts.outcomes import Outcome
from etprop.verdicts.signature import signature

# An oracle reads one flow's lowering; ``lowerings`` holds every flow's
# lowering of the same program (for differential checks).
Oracle = Callable[[pipeline.Lowering, dict], Verdict]

# A flow's outputs larger than this (elements over all its cases) stay out of the corpus.
CORPUS_MAX_ELEMENTS = 1_000_000


@dataclass
class FlowResult:
    flow: str
    outcome: Outcome
    verdicts: list[Verdict] = field(default_factory=list)
    known: Optional[str] = None  # id of the matching finding ("A+B": two causes)
    # How attribution ended, when it ran (session.ONE_CAUSE, TWO_CAUSES, JOINT_ONLY).
    attribution: str = ""
    seconds: dict = field(default_factory=dict)
    pte_sha256: str = ""
    # A passing flow's runtime outputs per (method, input kind), kept for the corpus.
    outputs: list = field(default_factory=list)
    runtime: str = ""
    # Structural facts of the lowering (oracles/differential.py ``facts``):
    # what a gate across Python environments compares.
    facts: dict = field(default_factory=dict)

    @property
    def message(self) -> str:
        return "; ".join(str(v) for v in self.verdicts if not v.ok)


@dataclass
class ExampleResult:
    prop: str
    spec: dict
    results: list[FlowResult]
    repro: Optional[Path] = None
    seconds: float = 0.0
    executorch_seconds: float = 0.0
    # {"new_arcs": {component: arcs}}: the arcs of the lowering code this
    # example reached first in its process; empty when the meter did not measure it.
    reach: dict = field(default_factory=dict)
    # New failures of this spec with a known finding's cause neutralized:
    # recorded and reported as examples of their own.
    followups: list["ExampleResult"] = field(default_factory=list)

    @property
    def new_failures(self) -> list[FlowResult]:
        return [r for r in self.results if r.outcome.is_failure and not r.known]


class Artifacts:
    """Where an example's evidence goes: pending/, repros/, results/."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.results_file = self.root / "results" / f"{worker}-{os.getpid()}.jsonl"
        # The property test item under way and its designed share of a campaign round.
        self.item, self.share = "", 1

    def pending_path(self, spec: dict, prop: str) -> Path:
        return self.root / "pending" / f"{prop}--{specmod.digest(spec)}.json"

    def pending(self, spec: dict, flows: list[str], prop: str) -> Path:
        return repro.write(self.pending_path(spec, prop), spec, flows, prop, outcome="pending", script=False)

    def repro_path(self, prop: str, flow: str, outcome: Outcome) -> Path:
        slug = outcome.value.replace(" ", "-")
        return self.root / "repros" / f"{prop}--{flow.replace('+', '_')}--{slug}.json"

    def history_path(self, prop: str, flows: list[str], digest: str) -> Path:
        """Where ``keep`` puts an example: one file per property, flows and
        program (properties draw the same programs for every flow)."""
        names = "_".join(flow.replace("+", "_") for flow in flows)
        return self.root / "repros" / "history" / f"{prop}--{names}--{digest}.json"

    def keep(self, spec: dict, flows: list[str], prop: str, result: FlowResult) -> Path:
        """Every failing example, as found (repros/history/): nothing is lost
        when a smaller example of the same class replaces the headline repro."""
        path = self.history_path(prop, flows, specmod.digest(spec))
        return repro.write(path, spec, flows, prop, result.outcome.value, result.message, script=False)

    @staticmethod
    def smaller_than_recorded(path: Path, spec: dict) -> bool:
        """The headline repro of a failure class is the smallest example seen,
        whether or not Hypothesis's shrinking got to finish."""
        if not path.exists():
            return True
        try:
            recorded = json.loads(path.read_text())["spec"]
        except (OSError, ValueError, KeyError):
            return True
        return _size(spec) <= _size(recorded)

    def record(self, result: ExampleResult) -> None:
        self.results_file.parent.mkdir(parents=True, exist_ok=True)
        line = {
            "property": result.prop,
            "digest": specmod.digest(result.spec),
            "ops": sorted({n["op"] for _, n in specmod.all_nodes(result.spec)}),
            "nodes": specmod.count_ops(result.spec),
            "seconds": round(result.seconds, 3),
            "executorch_seconds": round(result.executorch_seconds, 3),
            "repro": str(result.repro) if result.repro else None,
            "quantization": (result.spec.get("quantization") or {}).get("scheme"),
            "item": self.item,
            "share": self.share,
            **result.reach,
            "coverage": sorted(coverage_space.key_text(key) for key in coverage_space.keys(result.spec)),
            "flows": [
                {
                    "flow": r.flow,
                    "outcome": r.outcome.value,
                    "known": r.known,
                    **({"attribution": r.attribution} if r.attribution else {}),
                    "message": r.message[:2000],
                    # From the whole message: the stored one is cut short.
                    "signature": signature(r.flow, r.outcome.value, r.message),
                    **_quantized_patterns(r),
                }
                for r in result.results
            ],
        }
        with open(self.results_file, "a") as handle:
            handle.write(json.dumps(line) + "\n")
        self.keep_in_corpus(result)

    def keep_in_corpus(self, result: ExampleResult) -> None:
        """The spec and what each passing flow's runtime returned
        (``corpus/``): mutation analysis scores a campaign on it without
        lowering again (benchmarks/mutation_score.py). Large outputs are left out."""
        import torch

        flows = {
            r.flow: {"runtime": r.runtime, "cases": r.outputs}
            for r in result.results
            if r.outputs
            and sum(t.numel() for _, _, ts in r.outputs for t in ts if isinstance(t, torch.Tensor))
            <= CORPUS_MAX_ELEMENTS
        }
        if not flows:
            return
        path = self.root / "corpus" / f"{result.prop}--{specmod.digest(result.spec)}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        entry = {
            "spec": result.spec,
            "property": result.prop,
            "recorded": time.time(),
            "seconds": result.seconds,
            "flows": flows,
        }
        if path.exists():  # the same program drawn for another flow: one entry, every flow's outputs
            try:
                earlier = torch.load(path, weights_only=False)
                entry.update(
                    recorded=earlier["recorded"], seconds=earlier["seconds"], flows={**earlier["flows"], **flows}
                )
            except Exception:
                pass
        partial = path.with_suffix(f".{os.getpid()}.part")
        torch.save(entry, partial)
        partial.replace(path)


def load_records(artifacts: str | Path) -> list[dict]:
    """Every results line under ``artifacts/results/`` (what ``Artifacts.record``
    wrote), in file order; a line cut short by a killed process is skipped."""
    records = []
    for path in sorted((Path(artifacts) / "results").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def _quantized_patterns(result: FlowResult) -> dict:
    """The delegation oracle's count of quantized GEMMs per pattern, as the
    campaign report aggregates it per flow (none where it did not run)."""
    for verdict in result.verdicts:
        patterns = verdict.details.get("quantized_patterns")
        if patterns:
            return {"quantized_patterns": {pattern: list(counts) for pattern, counts in patterns.items()}}
    return {}


def _copy_export(exported: dict, built) -> dict:
    try:
        return copy.deepcopy(exported)
    except Exception:
        with stages.timed("torch"):
            return pipeline.export_program(built)


def _size(spec: dict) -> tuple[int, int]:
    return specmod.count_ops(spec), len(json.dumps(spec))


def _flow_result(flow: Flow, lowering: pipeline.Lowering, oracles: list[Oracle], lowerings: dict) -> FlowResult:
    if not lowering.ok:
        verdict = Verdict.failed("lowering", lowering.error, lowering.outcome)
        return FlowResult(flow.name, lowering.outcome, [verdict], seconds=dict(lowering.seconds))
    verdicts = []
    for oracle in oracles:
        started = time.perf_counter()
        verdict = oracle(lowering, lowerings)
        lowering.seconds[f"oracle:{verdict.oracle}"] = time.perf_counter() - started
        verdicts.append(verdict)
    failed = [v for v in verdicts if not v.ok]
    outcome = failed[0].outcome if failed else Outcome.PASS
    return FlowResult(
        flow.name,
        outcome,
        verdicts,
        seconds=dict(lowering.seconds),
        pte_sha256=hashlib.sha256(lowering.pte).hexdigest(),
        outputs=lowering.observed if outcome is Outcome.PASS else [],
        runtime=flow.runtime,
        facts=differential.facts(lowering),
    )


def run_example(spec: dict, flows: list[Flow], prop: str, oracles: list[Oracle], artifacts: Artifacts) -> ExampleResult:
    """Check one spec on ``flows`` (baseline first, when comparing). The
    result is not recorded yet: the caller attributes it, then ``finish``es it."""
    started = time.perf_counter()
    flow_names = [f.name for f in flows]
    artifacts.pending(spec, flow_names, prop)
    try:
        with reach.measuring():  # a quantized spec's PT2E steps run here
            built = builder.build(spec, validate=False)
    except QuantizationFailed as exc:
        if exc.stage == "export":
            raise pipeline.ExportFailed(str(exc)) from exc
        # No flow can lower a program PT2E did not produce: each gets the quantization layer's failure.
        results = [
            FlowResult(
                name, Outcome.QUANTIZATION_ERROR, [Verdict.failed("quantization", str(exc), Outcome.QUANTIZATION_ERROR)]
            )
            for name in flow_names
        ]
        return ExampleResult(prop, spec, results, seconds=time.perf_counter() - started)
    try:
        with stages.timed("torch"):
            exported = pipeline.export_program(built)
    except pipeline.ExportFailed as exc:
        if not isinstance(built, builder.QuantizedProgram):
            raise
        # The float program exported (PT2E started from it): the quantization
        # layer made a program torch.export rejects.
        message = f"the converted (Q/DQ) program does not export: {exc}"
        results = [
            FlowResult(
                name, Outcome.QUANTIZATION_ERROR, [Verdict.failed("quantization", message, Outcome.QUANTIZATION_ERROR)]
            )
            for name in flow_names
        ]
        return ExampleResult(prop, spec, results, seconds=time.perf_counter() - started)
    lowerings = {}
    for index, flow in enumerate(flows):
        # A flow gated against itself is lowered twice: the two must agree.
        key = flow.name if flow.name not in lowerings else f"{flow.name}#{index}"
        # Later flows get a copy of the export: a lowering may mutate the
        # ExportedProgram it is given (seen: coreai's lowering leaves a lifted
        # constant missing from ep.constants), which must not leak into the next.
        program = exported if index == len(flows) - 1 else _copy_export(exported, built)
        lowerings[key] = pipeline.lower(built, flow, program)
    results = [_flow_result(flow, lowering, oracles, lowerings) for flow, lowering in zip(flows, lowerings.values())]
    example = ExampleResult(prop, spec, results)
    example.seconds = time.perf_counter() - started
    # Lowering stages plus oracle time (almost all of it running the program).
    example.executorch_seconds = sum(seconds for low in lowerings.values() for seconds in low.seconds.values())
    return example


def run_example_by_name(
    spec: dict, flow_names: list[str], prop: str, oracles: list[Oracle], artifacts_root: str
) -> ExampleResult:
    """run_example with flows named, for worker processes (flows hold lambdas)."""
    from etprop import flows as flowreg

    return run_example_measured(spec, [flowreg.get(n) for n in flow_names], prop, oracles, Artifacts(artifacts_root))


def run_example_measured(
    spec: dict, flows: list[Flow], prop: str, oracles: list[Oracle], artifacts: Artifacts
) -> ExampleResult:
    """run_example under this process's reach meter (etprop/lowering/reach.py),
    when a campaign set one up: the result carries the branch arcs the
    example reached first, per component."""
    key = f"{prop}|{specmod.digest(spec)}|{','.join(f.name for f in flows)}"
    with reach.measured(key) as measurement:
        result = run_example(spec, flows, prop, oracles, artifacts)
    result.reach = measurement.as_record()
    return result


def finish(example: ExampleResult, flow_names: list[str], artifacts: Artifacts) -> None:
    """Write repros of new failures, record the result, drop the pending file."""
    for result in example.new_failures:
        # Flows keep their order (baseline first); the script lowers the failing one.
        artifacts.keep(example.spec, flow_names, example.prop, result)
        example.repro = artifacts.repro_path(example.prop, result.flow, result.outcome)
        if artifacts.smaller_than_recorded(example.repro, example.spec):
            repro.write(
                example.repro,
                example.spec,
                flow_names,
                example.prop,
                result.outcome.value,
                result.message,
                script_flow=result.flow,
            )
    artifacts.record(example)
    artifacts.pending_path(example.spec, example.prop).unlink(missing_ok=True)
