"""How well the equivalence tolerance separates real numeric changes from noise
(a benchmark: it prints figures, asserts nothing).

Three resumable phases over one corpus directory:

- ``lower``: draws programs (derandomized: the same list every time), lowers
  each once per flow and stores every lowered output, per (method, input) case
  in the oracle's order, on disk. A program whose lowering crashed the process
  is recorded as such on the next start.
- ``eager``: evaluates the oracle's references (eager, float64, jittered runs)
  for every program once per CPU variant, each variant in a subprocess with
  ``ATEN_CPU_CAPABILITY`` / ``ONEDNN_MAX_CPU_ISA`` / ``OMP_NUM_THREADS`` set.
- ``judge``: with the policy in etprop.oracles.tolerance, counts false alarms
  (unmutated lowering against each variant's references) per flow and variant,
  and the share of perturbed outputs caught: one element of one output of the
  portable lowering scaled by (1+3e-4) in float32, (1+1e-2) in the half
  types, counted only where the scaled element differs from the unscaled one
  in the output dtype.

    python benchmarks/sensitivity.py all --corpus /tmp/sens --programs 200
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

import torch

from etprop.strategies.reproducible import draws_independent_of_imported_source

FLOWS = ("portable", "xnnpack", "coreai")
VARIANTS = {
    "native": {},
    "native-1thread": {"OMP_NUM_THREADS": "1"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "default-1thread": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1"},
}


def sample_specs(count: int) -> list[dict]:
    """A fixed list of programs: mixed, control-flow and computed-weight families."""
    from hypothesis import HealthCheck, given, settings

    from etprop.program.spec import digest
    from etprop.strategies.control_flow import control_flow_programs
    from etprop.strategies.programs import computed_weight_programs, programs

    families = [
        (programs(min_nodes=6, max_nodes=40), 0.7),
        (control_flow_programs(), 0.15),
        (computed_weight_programs(), 0.15),
    ]
    specs: dict[str, dict] = {}
    for strategy, share in families:
        wanted = max(1, round(count * share))
        found: list[dict] = []

        @settings(
            max_examples=wanted * 2,
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(spec=strategy)
        def collect(spec):
            found.append(spec)

        with draws_independent_of_imported_source():
            collect()
        for spec in found[-wanted:]:
            specs.setdefault(digest(spec), spec)
    mixed = list(specs.values())
    random.Random(0).shuffle(mixed)
    return mixed[:count]


def save(record, path: Path) -> None:
    """Written whole or not at all: phases read each other's files while running."""
    partial = path.with_suffix(".partial")
    torch.save(record, partial)
    partial.replace(path)


def program_dirs(corpus: Path) -> list[Path]:
    return sorted(p for p in corpus.iterdir() if p.is_dir() and (p / "spec.json").exists())


def lower_job(spec: dict, flow: str) -> dict:
    """One lowering and its outputs for every case (run in the isolated worker)."""
    from etprop import flows as flowreg
    from etprop.lowering import pipeline
    from etprop.lowering.executorch_runtime import runner_for
    from etprop.oracles.equivalence import cases
    from etprop.program import builder

    built = builder.build(spec)
    lowering = pipeline.lower(built, flowreg.get(flow))
    if not lowering.ok:
        return {"error": lowering.error.splitlines()[0][:200]}
    runner = runner_for(lowering)
    try:
        return {"cases": [(method, kind, runner.run(method, inputs)) for method, kind, inputs in cases(built)]}
    finally:
        getattr(runner, "close", lambda: None)()


def inputs_record(spec: dict) -> dict:
    """Weights and inputs as made here: torch.randn's values depend on
    ATEN_CPU_CAPABILITY, so the eager phase reuses these instead of drawing."""
    from etprop.oracles.equivalence import cases
    from etprop.program import builder

    built = builder.build(spec)
    constants = [name for name, entry in spec["state"].items() if entry["kind"] == "constant"]
    return {
        "state": {k: v.clone() for k, v in built.module.state_dict().items()},
        "constants": {name: getattr(built.module, name).clone() for name in constants},
        "cases": [(method, kind, inputs) for method, kind, inputs in cases(built)],
    }


def lower_phase(corpus: Path, count: int, flow_names: list[str], timeout: float, shard: tuple[int, int]) -> None:
    """Flow by flow (so a stopped run leaves whole flows done), programs of
    this shard only (``index % n == i``: shards run side by side)."""
    import sensitivity

    from etprop.lowering.isolation import Worker

    corpus.mkdir(parents=True, exist_ok=True)
    listing = corpus / "specs.json"
    if not listing.exists():
        listing.write_text(json.dumps(sample_specs(count)))
    specs = json.loads(listing.read_text())[:count]
    worker = Worker()
    for index, spec in enumerate(specs):
        where = corpus / f"{index:04d}"
        where.mkdir(exist_ok=True)
        if not (where / "spec.json").exists():
            (where / "spec.json").write_text(json.dumps(spec))
    for name in flow_names:
        for index, spec in enumerate(specs):
            if index % shard[1] != shard[0]:
                continue
            where = corpus / f"{index:04d}"
            done = where / f"lowered-{name}.pt"
            if done.exists():
                continue
            t0 = time.perf_counter()
            try:
                record = worker.call(sensitivity.lower_job, timeout=timeout, spec=spec, flow=name)
            except Exception as exc:
                record = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            save(record, done)
            print(f"{where.name} {name}: {record.get('error', 'ok')[:100]} {time.perf_counter() - t0:.1f}s", flush=True)
    worker.close()


def built_with_saved_state(spec: dict, saved: dict):
    """The program of ``spec`` with the weights, buffers and constants drawn
    once natively (a mutant that drops a bias leaves its entry unused)."""
    from etprop.program import builder

    built = builder.build(spec)
    missing, _ = built.module.load_state_dict(saved["state"], strict=False)
    if missing:
        raise RuntimeError(f"saved state lacks {missing[:3]}")
    for name, value in saved["constants"].items():
        setattr(built.module, name, value)
    built.__post_init__()
    return built


def sequence_modes(spec: dict) -> tuple[bool, ...]:
    """How calls are compared: as a sequence (ExecuTorch keeps state between
    calls) or one by one (Core AI); the same for a stateless program."""
    stateful = any(e["kind"] == "buffer" and e.get("mutable") for e in spec["state"].values())
    return (True, False) if stateful else (False,)


def uses_sequence(spec: dict, flow: str) -> bool:
    from etprop import flows as flowreg

    return max(sequence_modes(spec)) and flowreg.get(flow).runtime != "coreai"


def wide_runs(spec: dict, saved: dict) -> dict:
    """The float64 outputs of every saved case, per sequence mode."""
    built = built_with_saved_state(spec, saved)
    runs = {}
    for sequence in sequence_modes(spec):
        runs[sequence] = []
        previous = None
        for method, kind, inputs in saved["cases"]:
            if sequence and method != previous:
                built.reset_state()
            previous = method
            runs[sequence].append(built._wide(method, inputs, not sequence))
        built.reset_state()
    return runs


def changes_result(original: dict, mutated: dict, dtype: torch.dtype) -> bool:
    """Every output keeps its shape and dtype, and some element of some case
    changes visibly in the program's dtype (else the mutant is equivalent)."""
    from etprop.program import mutants

    seen = False
    for sequence, cases in original.items():
        for before, after in zip(cases, mutated[sequence]):
            if len(before) != len(after) or any(
                a.shape != b.shape or a.dtype != b.dtype for a, b in zip(before, after)
            ):
                return False
            lowered = [b.to(dtype) if b.is_floating_point() else b for b in before]
            seen = seen or mutants.apply_delta(lowered, before, after) is not None
    return seen


def mutants_phase(corpus: Path) -> None:
    """For each program, one mutant of each spec kind (the first option, in a
    random order seeded by the program, that builds, keeps every output's
    shape and changes the result), with its float64 outputs for every case."""
    from etprop.program import mutants

    for where in program_dirs(corpus):
        target = where / "mutants.pt"
        if target.exists() or not (where / "inputs.pt").exists():
            continue
        saved = torch.load(where / "inputs.pt", weights_only=False)
        record: dict = {}
        if "error" not in saved:
            spec = json.loads((where / "spec.json").read_text())
            rng = random.Random(where.name)
            try:
                original = wide_runs(spec, saved)
            except Exception as exc:
                original, record["error"] = None, f"{type(exc).__name__}: {str(exc)[:200]}"
            for kind in mutants.SPEC_MUTANTS if original else ():
                for mutated, description in mutants.mutate_spec(kind, spec, rng):
                    try:
                        runs = wide_runs(mutated, saved)
                    except Exception:
                        continue
                    if changes_result(original, runs, getattr(torch, spec.get("dtype", "float32"))):
                        record[kind] = {"description": description, "wide": runs}
                        break
        save(record, target)


def eager_phase_here(corpus: Path, variant: str, flow_names: list[str]) -> None:
    """References of every program under this process's CPU settings, per
    flow (the jittered runs use the flow's runtime's error budgets; a runtime
    that does not keep state between calls is compared call by call; flows on
    one runtime share their references)."""
    from etprop import flows as flowreg
    from etprop.oracles import tolerance

    for where in program_dirs(corpus):
        target = where / f"eager-{variant}.pt"
        if target.exists() or not (where / "inputs.pt").exists():
            continue
        try:
            saved = torch.load(where / "inputs.pt", weights_only=False)
            if "error" in saved:
                raise RuntimeError(saved["error"])
            built = built_with_saved_state(json.loads((where / "spec.json").read_text()), saved)
            record = {"cases": {}}
            by_runtime: dict[str, list] = {}
            for flow in flow_names:
                runtime = flowreg.get(flow).runtime
                if runtime in by_runtime:
                    record["cases"][flow] = by_runtime[runtime]
                    continue
                sequence = built.stateful and runtime != "coreai"
                ulps = tolerance.op_ulps(runtime, built.spec.get("dtype", "float32"))
                record["cases"][flow] = by_runtime[runtime] = []
                previous = None
                for method, kind, inputs in saved["cases"]:
                    if sequence and method != previous:
                        built.reset_state()
                    previous = method
                    record["cases"][flow].append((method, kind, built.reference(method, inputs, not sequence, ulps)))
                built.reset_state()
        except Exception as exc:
            record = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        save(record, target)


def eager_phase(corpus: Path, flow_names: list[str]) -> None:
    for where in program_dirs(corpus):
        if not (where / "inputs.pt").exists():
            try:
                record = inputs_record(json.loads((where / "spec.json").read_text()))
            except Exception as exc:
                record = {"error": f"{type(exc).__name__}: {exc}"}
            save(record, where / "inputs.pt")
    for variant, env in VARIANTS.items():
        print(f"eager references, variant {variant}", flush=True)
        subprocess.run(
            [
                sys.executable,
                __file__,
                "eager-here",
                "--corpus",
                str(corpus),
                "--variant",
                variant,
                "--flows",
                ",".join(flow_names),
            ],
            env={**os.environ, **env},
            check=True,
        )


def load(corpus: Path, flow_names: list[str]) -> list[dict]:
    """Every program with native references: references per variant, lowered outputs per flow."""
    programs = []
    for where in program_dirs(corpus):
        refs = {}
        for variant in VARIANTS:
            path = where / f"eager-{variant}.pt"
            record = torch.load(path, weights_only=False) if path.exists() else {}
            if "cases" in record:
                refs[variant] = record["cases"]
        if "native" not in refs:
            continue
        lowered = {}
        for flow in flow_names:
            path = where / f"lowered-{flow}.pt"
            record = torch.load(path, weights_only=False) if path.exists() else {}
            if "cases" in record:
                lowered[flow] = record["cases"]
        spec = json.loads((where / "spec.json").read_text())
        path = where / "mutants.pt"
        found = torch.load(path, weights_only=False) if path.exists() else {}
        path = where / "attributed.json"
        attributed = json.loads(path.read_text()) if path.exists() else {}
        programs.append(
            {
                "name": where.name,
                "spec": spec,
                "refs": refs,
                "lowered": lowered,
                "attributed": attributed,
                "dtype": spec.get("dtype", "float32"),
                "sequence": {flow: bool(uses_sequence(spec, flow)) for flow in flow_names},
                "mutants": {k: v for k, v in found.items() if k != "error"},
            }
        )
    return programs


def previous_policy(reference, actual, flow: str = "") -> str | None:
    """The policy this module replaced (rtol/atol scaled by the output's
    largest magnitude, plus 8x the float64 distance), for comparison."""
    base = {
        torch.float32: (1e-3, 1e-3),
        torch.float16: (1e-2, 2e-2 if flow == "coreai" else 1e-2),
        torch.bfloat16: (2e-2, 1e-2),
    }
    if len(actual) != len(reference.expected):
        return "count"
    for want, got, wide in zip(reference.expected, actual, reference.wide):
        if got.shape != want.shape or got.dtype != want.dtype:
            return "shape"
        if not want.is_floating_point():
            if not torch.equal(got, want):
                return "integers"
            continue
        rtol, atol = base[want.dtype]
        finite = want[torch.isfinite(want)]
        atol *= max(1.0, float(finite.abs().max()) if finite.numel() else 1.0)
        y, g = want.double(), got.double()
        if not torch.equal(y.isnan(), g.isnan()) or not torch.equal(y.isinf(), g.isinf()):
            return "special"
        noise = (y - wide.double()).abs().nan_to_num(0.0, 0.0, 0.0)
        ok = torch.isfinite(y)
        if bool((((g - y).abs() - atol - rtol * y.abs() - 8 * noise) > 0)[ok].any()):
            return "differ"
    return None


def _policy(name: str):
    from etprop.oracles import tolerance

    if name == "previous":
        return previous_policy
    from etprop import flows as flowreg

    if name == "unscattered":
        return lambda reference, actual, flow: (
            tolerance.judge(_unscattered(reference), actual, flowreg.get(flow).runtime).problem
        )
    return lambda reference, actual, flow: tolerance.judge(reference, actual, flowreg.get(flow).runtime).problem


def _unscattered(reference):
    """``reference`` with only the up, down and random runs: the policy before
    the scattered runs, for comparison."""
    from types import SimpleNamespace

    runs = reference.jittered
    return SimpleNamespace(
        expected=reference.expected,
        wide=reference.wide,
        flips=reference.flips,
        directional=2,
        jittered=runs[:2] + runs[getattr(reference, "directional", 2) :],
    )


def evaluate(programs: list[dict], policy, flow_names: list[str]) -> dict:
    """Per flow: unmutated lowerings failing per CPU variant, and verdicts
    that change with the variant; per (mutant kind, dtype): mutated cases
    caught, over every (method, input) case whose unmutated lowering passes
    against native references, on every flow."""
    from etprop.program import mutants

    failing = {f: {v: [] for v in VARIANTS} for f in flow_names}
    flips = {f: [] for f in flow_names}
    judged = {f: 0 for f in flow_names}
    caught: dict[tuple[str, str], list[int]] = {}
    for program in programs:
        for flow, cases in program["lowered"].items():
            verdicts = {}
            for variant, refs in program["refs"].items():
                verdicts[variant] = None
                for (method, kind, reference), (_, _, actual) in zip(refs[flow], cases):
                    problem = policy(reference, actual, flow)
                    if problem:
                        verdicts[variant] = f"{method} {kind}: {problem}"
                        break
                if verdicts[variant]:
                    failing[flow][variant].append((program["name"], verdicts[variant]))
            judged[flow] += 1
            if len({v is None for v in verdicts.values()}) > 1:
                flips[flow].append((program["name"], verdicts))
            sequence = program["sequence"][flow]
            for index, ((method, kind, reference), (_, _, actual)) in enumerate(
                zip(program["refs"]["native"][flow], cases)
            ):
                if policy(reference, actual, flow):
                    continue
                dtype = program["dtype"]
                rng = random.Random(f"{program['name']} {flow} {index}")
                for name in mutants.OUTPUT_MUTANTS:
                    changed = mutants.mutate_outputs(name, actual, rng)
                    if changed is not None:
                        counts = caught.setdefault((name, dtype), [0, 0])
                        counts[1] += 1
                        counts[0] += policy(reference, changed, flow) is not None
                for name, mutant in program["mutants"].items():
                    changed = mutants.apply_delta(actual, reference.wide, mutant["wide"][sequence][index])
                    if changed is not None:
                        counts = caught.setdefault((name, dtype), [0, 0])
                        counts[1] += 1
                        counts[0] += policy(reference, changed, flow) is not None
    return {"failing": failing, "flips": flips, "judged": judged, "caught": caught}


def report(figures: dict, title: str, show: int, attributed: dict | None = None) -> None:
    """The tables; with ``attributed``, what the suite made of each native
    failure, and every failure not attributed to a known finding (``show``
    limits the verdict flips listed per flow)."""
    from etprop.program import mutants

    print(f"## {title}")
    dtypes = sorted({dtype for _, dtype in figures["caught"]})
    print("mutated (method, input) cases caught, every flow, native references:")
    print("| mutant | " + " | ".join(dtypes) + " |")
    print("|---|" + "---|" * len(dtypes))
    for kind in mutants.OUTPUT_MUTANTS + mutants.SPEC_MUTANTS:
        cells = []
        for dtype in dtypes:
            hit, total = figures["caught"].get((kind, dtype), (0, 0))
            cells.append(f"{hit}/{total} = {100 * hit / total:.1f} %" if total else "-")
        print(f"| {kind} | " + " | ".join(cells) + " |")
    print("unmutated lowerings failing, per flow and CPU variant (then: verdicts that change with the variant):")
    print("| flow | judged | " + " | ".join(VARIANTS) + " | flips |")
    print("|---|---|" + "---|" * (len(VARIANTS) + 1))
    for flow, total in figures["judged"].items():
        cells = [str(len(figures["failing"][flow][v])) for v in VARIANTS]
        print(f"| {flow} | {total} | " + " | ".join(cells) + f" | {len(figures['flips'][flow])} |")
    if attributed is not None:
        print("native failures re-run through the suite (attribution by intervention):")
        for flow in figures["judged"]:
            verdicts: dict[str, int] = {}
            for name, _ in figures["failing"][flow]["native"]:
                done = attributed.get(name, {}).get(flow)
                verdict = (
                    "not re-run"
                    if done is None
                    else done["known"] or ("new" if done["new"] else f"{done['outcome']} on the re-run")
                )
                verdicts[verdict] = verdicts.get(verdict, 0) + 1
            print(f"  {flow}: " + ", ".join(f"{v} {n}" for v, n in sorted(verdicts.items(), key=lambda kv: -kv[1])))
    for flow in figures["judged"] if attributed is not None else ():
        for name, message in figures["failing"][flow]["native"]:
            done = attributed.get(name, {}).get(flow)
            if done and done["known"]:
                continue
            print(
                f"    {flow} failing {name}: {message[:240]}"
                f"{' [re-run: ' + (done['known'] or 'new') + ']' if done else ''}"
            )
        for name, verdicts in figures["flips"][flow][:show]:
            which = [v for v, problem in verdicts.items() if problem]
            print(f"    {flow} flip {name}: fails under {which}: {next(p for p in verdicts.values() if p)[:200]}")


def nonfinite_cases(programs: list[dict], flow_names: list[str]) -> None:
    """The unmutated (method, input) cases the previous policy failed on NaN
    or infinity positions, judged again per element against float64: how
    many now pass (with how many elements masked at the edge of the range)
    and which still fail."""
    from etprop import flows as flowreg
    from etprop.oracles import tolerance

    for flow in flow_names:
        passing, masked, failing = 0, 0, []
        for program in programs:
            cases = program["lowered"].get(flow)
            for (method, kind, reference), (_, _, actual) in zip(program["refs"]["native"][flow], cases or ()):
                if previous_policy(reference, actual, flow) != "special":
                    continue
                judgement = tolerance.judge(reference, actual, flowreg.get(flow).runtime)
                if judgement.problem:
                    failing.append(f"{program['name']} {method} {kind}: {judgement.problem[:200]}")
                else:
                    passing += 1
                    masked += judgement.unstable
        print(
            f"  {flow}: {passing + len(failing)} cases with NaN/inf positions differing from eager; "
            f"{passing} pass per element ({masked} elements masked or unstable), {len(failing)} fail"
        )
        for line in failing:
            print(f"      {line}")


def judge_phase(corpus: Path, flow_names: list[str], show: int, sweep: bool) -> None:
    from etprop.oracles import tolerance

    programs = load(corpus, flow_names)
    dtypes = {}
    for program in programs:
        dtypes[program["dtype"]] = dtypes.get(program["dtype"], 0) + 1
    print(
        f"# {datetime.date.today()} on {platform.node()} ({platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}); command: {' '.join(sys.argv)}"
    )
    print(f"programs with references: {len(programs)} {dtypes}; CPU variants {list(VARIANTS)}")
    report(evaluate(programs, _policy("previous"), flow_names), "previous policy", 0)
    report(
        evaluate(programs, _policy("per-element"), flow_names),
        f"per-element policy (SPREAD_FACTOR {tolerance.SPREAD_FACTOR:g}, RELATIVE_FLOOR {tolerance.RELATIVE_FLOOR:g})",
        show,
        {program["name"]: program["attributed"] for program in programs},
    )
    report(
        evaluate(programs, _policy("unscattered"), flow_names), "per-element policy without the scattered runs", show
    )
    print("non-finite values (cases the previous policy failed on NaN/inf positions):")
    nonfinite_cases(programs, flow_names)
    if sweep:
        # SPREAD_FACTOR is baked into the references (the directional runs), so
        # the sweep varies only the floors.
        saved = tolerance.RELATIVE_FLOOR, tolerance.SCALE_FLOOR
        for scale_floor in (0.0, 4.0, 16.0, 64.0):
            for floor in (1.0, 2.0, 4.0):
                tolerance.RELATIVE_FLOOR, tolerance.SCALE_FLOOR = floor, scale_floor
                figures = evaluate(programs, _policy("per-element"), flow_names)
                caught = " ".join(
                    f"{k}/{d} {100 * h / max(t, 1):.1f}%"
                    for (k, d), (h, t) in sorted(figures["caught"].items())
                    if d == "float32"
                )
                failing = " ".join(f"{f} {len(v['native'])}" for f, v in figures["failing"].items())
                flips = sum(len(v) for v in figures["flips"].values())
                print(
                    f"  SCALE_FLOOR={scale_floor:g} RELATIVE_FLOOR={floor:g}: failing {failing}; flips {flips}; "
                    f"float32 caught {caught}"
                )
        tolerance.RELATIVE_FLOOR, tolerance.SCALE_FLOOR = saved


def attribute_phase(corpus: Path, flow_names: list[str]) -> None:
    """Every unmutated lowering that fails against native references is run
    again through the suite (a fresh lowering, with attribution by
    intervention): a known finding, a new failure, or a pass (the
    benchmark's failure did not recur). Stored in ``attributed.json``."""
    from etprop import flows as flowreg
    from etprop.oracles.sets import EQUIVALENCE
    from etprop.verdicts.session import Session

    programs = load(corpus, flow_names)
    failing = evaluate(programs, _policy("per-element"), flow_names)["failing"]
    session = Session(corpus / "artifacts")
    try:
        for flow in flow_names:
            for name, message in failing[flow]["native"]:
                target = corpus / name / "attributed.json"
                done = json.loads(target.read_text()) if target.exists() else {}
                if flow in done:
                    continue
                spec = json.loads((corpus / name / "spec.json").read_text())
                result = session.run(spec, [flowreg.get(flow)], "equivalence", EQUIVALENCE, attribute=True)
                (flow_result,) = result.results
                new = result.new_failures + [r for f in result.followups for r in f.new_failures]
                done[flow] = {
                    "outcome": flow_result.outcome.value,
                    "known": flow_result.known,
                    "new": [r.message[:300] for r in new],
                }
                target.write_text(json.dumps(done))
                print(
                    f"{name} {flow}: {done[flow]['known'] or ('new' if new else flow_result.outcome.value)}", flush=True
                )
    finally:
        session.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=("lower", "eager", "eager-here", "mutants", "attribute", "judge", "all"))
    parser.add_argument("--corpus", type=Path, default=Path("/tmp/etprop-sensitivity"))
    parser.add_argument("--programs", type=int, default=200)
    parser.add_argument("--flows", default=",".join(FLOWS))
    parser.add_argument("--variant", default="native")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per lowering")
    parser.add_argument("--shard", default="0/1", help="i/n: lower only programs whose index %% n == i")
    parser.add_argument("--show", type=int, default=5, help="failures listed per flow")
    parser.add_argument("--sweep", action="store_true", help="also try other RELATIVE_FLOOR / SCALE_FLOOR")
    args = parser.parse_args()
    flow_names = args.flows.split(",")
    if args.phase in ("lower", "all"):
        # The isolated worker imports the lowering job from this file.
        sys.path.insert(0, str(Path(__file__).parent))
        os.environ["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
        lower_phase(
            args.corpus, args.programs, flow_names, args.timeout, tuple(int(part) for part in args.shard.split("/"))
        )
    if args.phase == "eager-here":
        eager_phase_here(args.corpus, args.variant, flow_names)
    if args.phase in ("eager", "all"):
        eager_phase(args.corpus, flow_names)
    if args.phase in ("mutants", "all"):
        mutants_phase(args.corpus)
    if args.phase in ("attribute", "all"):
        attribute_phase(args.corpus, flow_names)
    if args.phase in ("judge", "all"):
        judge_phase(args.corpus, flow_names, args.show, args.sweep)


if __name__ == "__main__":
    main()
