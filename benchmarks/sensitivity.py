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

FLOWS = ("portable", "xnnpack", "coreai")
VARIANTS = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "default-1thread": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1"},
}
PERTURBATION = {torch.float32: 3e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def sample_specs(count: int) -> list[dict]:
    """A fixed list of programs: mixed, control-flow and computed-weight families."""
    from hypothesis import HealthCheck, given, settings

    from etprop.program.spec import digest
    from etprop.strategies.control_flow import control_flow_programs
    from etprop.strategies.programs import computed_weight_programs, programs

    families = [(programs(min_nodes=6, max_nodes=40), 0.7), (control_flow_programs(), 0.15),
                (computed_weight_programs(), 0.15)]
    specs: dict[str, dict] = {}
    for strategy, share in families:
        wanted = max(1, round(count * share))
        found: list[dict] = []

        @settings(max_examples=wanted * 2, derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck))
        @given(spec=strategy)
        def collect(spec):
            found.append(spec)

        collect()
        for spec in found[-wanted:]:
            specs.setdefault(digest(spec), spec)
    mixed = list(specs.values())
    random.Random(0).shuffle(mixed)
    return mixed[:count]


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
    return {"state": {k: v.clone() for k, v in built.module.state_dict().items()},
            "constants": {name: getattr(built.module, name).clone() for name in constants},
            "cases": [(method, kind, inputs) for method, kind, inputs in cases(built)]}


def lower_phase(corpus: Path, count: int, flow_names: list[str], timeout: float) -> None:
    from etprop.lowering.isolation import Worker

    import sensitivity

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
            done = where / f"lowered-{name}.pt"
            if done.exists():
                continue
            t0 = time.perf_counter()
            try:
                record = worker.call(sensitivity.lower_job, timeout=timeout, spec=spec, flow=name)
            except Exception as exc:
                record = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            torch.save(record, done)
            print(f"{where.name} {name}: {record.get('error', 'ok')[:100]} {time.perf_counter() - t0:.1f}s", flush=True)
    worker.close()


def eager_phase_here(corpus: Path, variant: str, flow_names: list[str]) -> None:
    """References of every program under this process's CPU settings, per
    flow (the jittered runs use the flow's error budgets; a runtime that does
    not keep state between calls is compared call by call)."""
    from etprop import flows as flowreg
    from etprop.oracles import tolerance
    from etprop.program import builder

    for where in program_dirs(corpus):
        target = where / f"eager-{variant}.pt"
        if target.exists() or not (where / "inputs.pt").exists():
            continue
        try:
            built = builder.build(json.loads((where / "spec.json").read_text()))
            saved = torch.load(where / "inputs.pt", weights_only=False)
            if "error" in saved:
                raise RuntimeError(saved["error"])
            built.module.load_state_dict(saved["state"])
            for name, value in saved["constants"].items():
                setattr(built.module, name, value)
            built.__post_init__()
            record = {"cases": {}}
            for flow in flow_names:
                sequence = built.stateful and flowreg.get(flow).runtime != "coreai"
                ulps = tolerance.op_ulps(flowreg.get(flow).runtime, built.spec.get("dtype", "float32"))
                record["cases"][flow] = []
                previous = None
                for method, kind, inputs in saved["cases"]:
                    if sequence and method != previous:
                        built.reset_state()
                    previous = method
                    record["cases"][flow].append((method, kind, built.reference(method, inputs, not sequence, ulps)))
                built.reset_state()
        except Exception as exc:
            record = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        torch.save(record, target)


def eager_phase(corpus: Path, flow_names: list[str]) -> None:
    for where in program_dirs(corpus):
        if not (where / "inputs.pt").exists():
            try:
                record = inputs_record(json.loads((where / "spec.json").read_text()))
            except Exception as exc:
                record = {"error": f"{type(exc).__name__}: {exc}"}
            torch.save(record, where / "inputs.pt")
    for variant, env in VARIANTS.items():
        print(f"eager references, variant {variant}", flush=True)
        subprocess.run([sys.executable, __file__, "eager-here", "--corpus", str(corpus), "--variant", variant,
                        "--flows", ",".join(flow_names)],
                       env={**os.environ, **env}, check=True)


def _perturbed(actual: list, rng: random.Random):
    """``actual`` with one element of one float output scaled; None when no
    element would change in the output's dtype."""
    floats = [i for i, t in enumerate(actual) if isinstance(t, torch.Tensor) and t.is_floating_point()
              and t.numel()]
    if not floats:
        return None
    index = rng.choice(floats)
    tensor = actual[index]
    flat = tensor.reshape(-1)
    position = rng.randrange(flat.numel())
    value = flat[position]
    scaled = (value.double() * (1 + PERTURBATION[tensor.dtype])).to(tensor.dtype)
    if not bool(torch.isfinite(value)) or bool(scaled == value):
        return None
    changed = flat.clone()
    changed[position] = scaled
    result = list(actual)
    result[index] = changed.reshape(tensor.shape)
    return result, tensor.dtype


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
        programs.append({"name": where.name, "refs": refs, "lowered": lowered,
                         "dtype": json.loads((where / "spec.json").read_text()).get("dtype", "float32")})
    return programs


def previous_policy(reference, actual, flow: str = "") -> str | None:
    """The policy this module replaced (rtol/atol scaled by the output's
    largest magnitude, plus 8x the float64 distance), for comparison."""
    base = {torch.float32: (1e-3, 1e-3), torch.float16: (1e-2, 2e-2 if flow == "coreai" else 1e-2),
            torch.bfloat16: (2e-2, 1e-2)}
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

    return lambda reference, actual, flow: tolerance.judge(reference, actual, flowreg.get(flow).runtime).problem


def evaluate(programs: list[dict], policy, flow_names: list[str], show: int = 0) -> dict:
    """Native failures and variant flips per flow, and perturbations caught per dtype."""
    failing = {f: [] for f in flow_names}
    flips = {f: [] for f in flow_names}
    judged = {f: 0 for f in flow_names}
    caught: dict[str, list[int]] = {}
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
            judged[flow] += 1
            if verdicts["native"]:
                failing[flow].append((program["name"], verdicts["native"]))
            if len({v is None for v in verdicts.values()}) > 1:
                flips[flow].append((program["name"], verdicts))
        cases = program["lowered"].get("portable")
        if cases is None:
            continue
        rng = random.Random(program["name"])
        for (method, kind, reference), (_, _, actual) in zip(program["refs"]["native"]["portable"], cases):
            if policy(reference, actual, "portable"):
                break
            perturbed = _perturbed(actual, rng)
            if perturbed is None:
                continue
            changed, dtype = perturbed
            counts = caught.setdefault(str(dtype).replace("torch.", ""), [0, 0])
            counts[1] += 1
            counts[0] += policy(reference, changed, "portable") is not None
    return {"failing": failing, "flips": flips, "judged": judged, "caught": caught}


def report(programs: list[dict], figures: dict, title: str, show: int) -> None:
    print(f"## {title}")
    print("perturbed (method, input) cases caught (portable lowering, native references):")
    for dtype, (hit, total) in sorted(figures["caught"].items()):
        print(f"  {dtype}: {hit}/{total} = {100 * hit / max(total, 1):.1f} %")
    print("per flow: programs judged, failing against native references, verdicts that change with the CPU variant:")
    for flow, total in figures["judged"].items():
        print(f"  {flow:9s} {total:4d} judged, {len(figures['failing'][flow])} failing, "
              f"{len(figures['flips'][flow])} flips")
        for name, message in figures["failing"][flow][:show]:
            print(f"      failing {name}: {message[:240]}")
        for name, verdicts in figures["flips"][flow][:show]:
            which = [v for v, problem in verdicts.items() if problem]
            print(f"      flip {name}: fails under {which}: {next(p for p in verdicts.values() if p)[:200]}")


def judge_phase(corpus: Path, flow_names: list[str], show: int, sweep: bool) -> None:
    from etprop.oracles import tolerance

    programs = load(corpus, flow_names)
    dtypes = {}
    for program in programs:
        dtypes[program["dtype"]] = dtypes.get(program["dtype"], 0) + 1
    print(f"# {datetime.date.today()} on {platform.node()} ({platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}); command: {' '.join(sys.argv)}")
    print(f"programs with references: {len(programs)} {dtypes}; CPU variants {list(VARIANTS)}")
    report(programs, evaluate(programs, _policy("previous"), flow_names), "previous policy", 0)
    report(programs, evaluate(programs, _policy("per-element"), flow_names), "per-element policy "
           f"(SPREAD_FACTOR {tolerance.SPREAD_FACTOR:g}, RELATIVE_FLOOR {tolerance.RELATIVE_FLOOR:g})", show)
    if sweep:
        saved = tolerance.SPREAD_FACTOR, tolerance.RELATIVE_FLOOR
        for spread_factor in (1.0, 2.0, 4.0, 8.0):
            for floor in (0.0, 1.0, 2.0, 4.0, 8.0):
                tolerance.SPREAD_FACTOR, tolerance.RELATIVE_FLOOR = spread_factor, floor
                figures = evaluate(programs, _policy("per-element"), flow_names)
                caught = " ".join(f"{d} {100 * h / max(t, 1):.0f}%" for d, (h, t) in sorted(figures["caught"].items()))
                failing = " ".join(f"{f} {len(v)}" for f, v in figures["failing"].items())
                flips = sum(len(v) for v in figures["flips"].values())
                print(f"  C={spread_factor:g} F={floor:g}: caught {caught}; failing {failing}; flips {flips}")
        tolerance.SPREAD_FACTOR, tolerance.RELATIVE_FLOOR = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=("lower", "eager", "eager-here", "judge", "all"))
    parser.add_argument("--corpus", type=Path, default=Path("/tmp/etprop-sensitivity"))
    parser.add_argument("--programs", type=int, default=200)
    parser.add_argument("--flows", default=",".join(FLOWS))
    parser.add_argument("--variant", default="native")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per lowering")
    parser.add_argument("--show", type=int, default=5, help="failures listed per flow")
    parser.add_argument("--sweep", action="store_true", help="also try other SPREAD_FACTOR / RELATIVE_FLOOR")
    args = parser.parse_args()
    flow_names = args.flows.split(",")
    if args.phase in ("lower", "all"):
        # The isolated worker imports the lowering job from this file.
        sys.path.insert(0, str(Path(__file__).parent))
        os.environ["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])
        lower_phase(args.corpus, args.programs, flow_names, args.timeout)
    if args.phase == "eager-here":
        eager_phase_here(args.corpus, args.variant, flow_names)
    if args.phase in ("eager", "all"):
        eager_phase(args.corpus, flow_names)
    if args.phase in ("judge", "all"):
        judge_phase(args.corpus, flow_names, args.show, args.sweep)


if __name__ == "__main__":
    main()
