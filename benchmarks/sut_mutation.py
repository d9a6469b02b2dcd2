"""Finding power on the code under test: mutants of ExecuTorch's lowering code
against a campaign's stored programs, and against ExecuTorch's own tests (a
benchmark: it prints figures, asserts nothing).

Mutants are generated from the installed sources of the chosen components
(etprop/commands/sut_mutants.py; mutmut's operators and a statement deleted)
and printed as a catalogue with its size; a seeded sample of them runs, each
in a layered environment shadowing only the mutated module, on the stored
campaign programs whose measured example reached the mutated line (at most
--max-programs of them, quickest first, stopping at the first kill). With
--anchor (benchmarks/backend_coverage.py's data), the ExecuTorch tests that
reached the line run against the same mutant: killed when a test that
passes unmutated fails.

    .venv/bin/python benchmarks/sut_mutation.py --artifacts DIR [--sample 300] [--seed 0]
        [--components "xnnpack passes,xnnpack partitioner,xnnpack operators"] [--max-programs 3]
        [--anchor artifacts/anchor] [--env DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from etprop.commands import sut_mutants as sm
from etprop.commands.environments import Environment, create
from etprop.lowering import reach, shadow

DEFAULT_COMPONENTS = "xnnpack passes,xnnpack partitioner,xnnpack operators"


def layered_environment(directory: Path) -> str:
    """A layered environment whose sitecustomize shadows the module ETPROP_SHADOW names."""
    python = directory / "bin" / "python"
    if python.exists():
        return str(python)
    with tempfile.TemporaryDirectory() as scratch:
        hook = Path(scratch) / "sitecustomize.py"
        hook.write_text(shadow.SITECUSTOMIZE)
        return create(directory, sys.executable, sitecustomize=hook)


class Baseline:
    """The unmutated environment's answer per program, asked once."""

    def __init__(self, python: str, scratch: Path):
        self.environment = Environment(python, "unmutated", scratch / "baseline").start()
        self.answers: dict[str, dict] = {}

    def __call__(self, program: sm.Program) -> dict:
        if program.context not in self.answers:
            spec = sm.load_spec(Path(program.spec_path))
            self.answers[program.context] = self.environment.run(spec, program.prop, program.flow, attribute=False)
        return self.answers[program.context]


def anchor_index(anchor: Path) -> dict[str, dict[int, list[str]]]:
    """Per source file and line, the ExecuTorch tests (absolute path::name) that reached it."""
    combined = reach.combine([anchor / "reach"], anchor / "combined.db")
    if combined is None:
        return {}
    executorch = Path(sm.reach.component_paths()["xnnpack passes"]).parents[2]
    index: dict[str, dict[int, list[str]]] = {}
    for context, files in reach.example_contexts(combined).items():
        node = context.split("|", 1)[1]
        file_part, _, rest = node.partition("::")
        candidates = [Path(file_part)] + [parent / file_part for parent in [anchor, *executorch.parents]]
        found = next((c for c in candidates if c.is_absolute() and c.is_file()), None)
        if found is None:
            continue
        test = f"{found}::{rest}"
        for path, lines in files.items():
            per_line = index.setdefault(str(Path(path).resolve()), {})
            for line in lines:
                per_line.setdefault(line, []).append(test)
    return index


def failing_tests(python: str, tests: list[str], extra_env: dict, cwd: Path) -> set[str] | None:
    """The tests among ``tests`` that fail (None: pytest itself could not run them)."""
    command = [
        python,
        "-m",
        "pytest",
        *tests,
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "-rf",
        "--timeout",
        "300",
    ]
    env = {**os.environ, **extra_env, "ET_TEST_ENABLED_BACKENDS": "xnnpack"}
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=1800)
    if done.returncode not in (0, 1):
        return None if "error" in done.stdout.lower() and "failed" not in done.stdout.lower() else set(tests)
    return set(re.findall(r"^FAILED (\S+)", done.stdout, re.M))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", required=True, help="a campaign's artifacts directory (meter on)")
    parser.add_argument("--components", default=DEFAULT_COMPONENTS)
    parser.add_argument("--sample", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-programs", type=int, default=3)
    parser.add_argument("--anchor", default="", help="benchmarks/backend_coverage.py's --anchor directory")
    parser.add_argument("--env", default="", help="where the layered environment goes (default: ARTIFACTS/mutant-env)")
    args = parser.parse_args()
    artifacts = Path(args.artifacts).resolve()
    components = [c.strip() for c in args.components.split(",") if c.strip()]
    print(
        f"# {date.today()} on {platform.machine()} ({os.cpu_count()} CPUs); "
        f"command: sut_mutation.py {' '.join(sys.argv[1:])}"
    )
    started = time.time()
    everything = sm.catalogue(components)
    sizes: dict[str, int] = {}
    for mutant in everything:
        sizes[mutant.component] = sizes.get(mutant.component, 0) + 1
    print(
        f"catalogue: {len(everything)} mutants ({', '.join(f'{c} {n}' for c, n in sizes.items())}) "
        f"in {time.time() - started:.0f} s"
    )
    chosen = sm.sample(everything, args.sample, args.seed)
    index = sm.CoverageIndex.of(artifacts)
    python = layered_environment(Path(args.env) if args.env else artifacts / "mutant-env")
    outcomes: list[sm.Outcome] = []
    anchor_outcomes: list[sm.Outcome] = []
    tests_by_line = anchor_index(Path(args.anchor).resolve()) if args.anchor else {}
    baseline_failures: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="etprop-mutants-") as scratch_dir:
        scratch = Path(scratch_dir)
        baseline = Baseline(python, scratch)
        try:
            for number, mutant in enumerate(chosen, 1):
                outcome = sm.run_mutant(
                    mutant,
                    index.covering(mutant),
                    lambda extra: Environment(python, "mutant", scratch / "mutant", extra_env=extra).start(),
                    baseline,
                    scratch,
                    args.max_programs,
                )
                outcomes.append(outcome)
                line = (
                    f"[{number}/{len(chosen)}] {mutant.component} {Path(mutant.path).name}:{mutant.line} "
                    f"{mutant.kind}: {outcome.status} ({outcome.programs} program(s), {outcome.seconds:.0f} s)"
                )
                if tests_by_line:
                    anchor_outcomes.append(
                        run_anchor(python, mutant, tests_by_line, baseline_failures, scratch, args.max_programs)
                    )
                    line += f"; ExecuTorch's tests: {anchor_outcomes[-1].status}"
                print(line, flush=True)
        finally:
            baseline.environment.close(force=True)
    print_table("campaign programs", outcomes, sizes)
    if anchor_outcomes:
        print_table("ExecuTorch's shipped tests", anchor_outcomes, sizes)
    survivors = [o.mutant for o in outcomes if o.status == sm.SURVIVED]
    print(f"\nsurvivors ({len(survivors)}): the next targets for generation")
    for mutant in survivors:
        print(f"  {mutant.module}:{mutant.line} {mutant.kind}: {mutant.before!r} -> {mutant.after!r}")
    out = artifacts / "sut-mutation.json"
    out.write_text(
        json.dumps(
            [
                dict(o.mutant.to_json(), status=o.status, programs=o.programs, seconds=o.seconds, killed_by=o.killed_by)
                for o in outcomes
            ],
            indent=1,
        )
    )
    print(f"\nwall time {time.time() - started:.0f} s; per mutant: {out}")
    return 0


def run_anchor(
    python: str, mutant: sm.Mutant, tests_by_line: dict, baseline_failures: dict, scratch: Path, max_tests: int
) -> sm.Outcome:
    """The mutant against the ExecuTorch tests that reached its line: killed when one that passes unmutated fails."""
    started = time.time()
    tests = sorted(set(tests_by_line.get(str(Path(mutant.path).resolve()), {}).get(mutant.line, [])))[:max_tests]
    if not tests:
        return sm.Outcome(mutant, sm.NOT_COVERED)
    unknown = [t for t in tests if t not in baseline_failures]
    if unknown:
        failing = failing_tests(python, unknown, {}, scratch) or set()
        baseline_failures.update({t: t in failing for t in unknown})
    passing = [t for t in tests if not baseline_failures[t]]
    if not passing:
        return sm.Outcome(mutant, sm.NOT_COVERED, 0, time.time() - started)
    source = scratch / f"{mutant.key}.py"
    source.write_text(sm.mutated_source(mutant))
    failing = failing_tests(python, passing, {shadow.ENV: f"{mutant.module}={source}"}, scratch)
    status = sm.KILLED if failing is None or failing else sm.SURVIVED
    return sm.Outcome(mutant, status, len(passing), time.time() - started)


def print_table(title: str, outcomes: list[sm.Outcome], sizes: dict[str, int]) -> None:
    print(f"\n{title}:")
    print(
        f"  {'component':22} {'generated':>9} {'sampled':>7} {'covered':>7} {'killed':>6} {'survived':>8} "
        f"{'equiv.':>6} {'not cov.':>8} {'score':>6} {'wall s':>7}"
    )
    for component, row in sm.by_component(outcomes):
        covered = row["generated"] - row[sm.NOT_COVERED]
        judged = row[sm.KILLED] + row[sm.SURVIVED]
        score = f"{row[sm.KILLED] / judged:.0%}" if judged else "-"
        print(
            f"  {component:22} {sizes.get(component, 0):9} {row['generated']:7} {covered:7} {row[sm.KILLED]:6} "
            f"{row[sm.SURVIVED]:8} {row[sm.EQUIVALENT]:6} {row[sm.NOT_COVERED]:8} {score:>6} {row['seconds']:7.0f}"
        )


if __name__ == "__main__":
    sys.exit(main())
