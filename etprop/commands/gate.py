"""``etprop gate``: a bounded, deterministic baseline-vs-candidate verdict for CI.

Runs the differential property (and every single-flow property on the
candidate) for a fixed number of examples with a fixed seed, so the same
programs are lowered on both flows, then decides:

- FAIL when the candidate does worse than the baseline on any program
  (etprop/commands/compare.py: newly failing or unsupported, a changed or
  worse failure, a known finding newly hit), grows the program, or delegates less;
- PASS otherwise; programs where only the baseline fails are listed as improvements.

Every program runs on both flows: a failure is recorded, not raised, so the
gate's programs are the same whatever fails first.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from etprop import flows as flowreg
from etprop.commands.campaign import properties_command
from etprop.commands.report import Summary, write_reports
from etprop.errors import UsageError
from etprop.verdicts.outcomes import Outcome


def run_gate(args) -> int:
    baseline = flowreg.get_available(args.baseline)
    candidate = flowreg.get_available(args.candidate)
    artifacts = Path(args.artifacts)
    if (artifacts / "results").exists() and any((artifacts / "results").iterdir()):
        raise UsageError(f"'{artifacts}' already holds results; give the gate a fresh --artifacts directory")
    env = dict(
        os.environ,
        ETPROP_GATE=f"{baseline.name},{candidate.name}",
        ETPROP_FLOWS=f"{baseline.name},{candidate.name}",
        ETPROP_ARTIFACTS=str(artifacts.resolve()),
        ETPROP_PROFILE="ci",
        ETPROP_EXAMPLES=str(args.examples),
        ETPROP_RECORD_ONLY="1",
        ETPROP_FLOW_MODULE=",".join(args.flow_module),
    )
    selected = f"(gate or differential) and ({args.properties})" if args.properties else "gate or differential"
    command = properties_command(args.seed, artifacts / "reports" / "junit-gate.xml") + ["-k", selected]
    print(
        f"etprop gate: baseline {baseline.name}, candidate {candidate.name}, "
        f"{args.examples} examples per property, seed {args.seed}"
    )
    completed = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    summary = Summary.load(artifacts)
    print(summary.text())
    write_reports(summary, artifacts / "reports")
    if completed.returncode not in (0, 1) or not summary.records:
        print(completed.stdout[-4000:])
        print("VERDICT: ERROR (the gate could not run its properties)")
        return 3
    baseline_failures = [f for f in summary.failures() if f["flow"] == baseline.name]
    for failure in baseline_failures:
        print(
            f"note: the baseline fails too ({failure['property']}: {failure['outcome']}); not held against "
            f"the candidate: {failure['message'][:160]}"
        )
    regressions = summary.regressions()
    print(
        f"checked: {summary.total_examples()} programs, each lowered on both flows from one export: "
        "eager equivalence, weights stored once, no cycles, delegation coverage, size and coverage vs baseline"
    )
    if regressions:
        print(f"VERDICT: FAIL: {len(regressions)} regression(s) of {candidate.name} against {baseline.name}:")
        for item in regressions:
            print(f"  {item['property']}: {item['kind']}: {item['outcome']} ({item['why']}): {item['message'][:200]}")
            print(f"    repro: {item['repro']}")
        return 1
    for item in summary.improvements():
        print(
            f"improvement: {item['property']}: the candidate passes where {item['baseline']}: {item['message'][:160]}"
        )
    not_run = summary.count(Outcome.NOT_RUN, candidate.name)
    if not_run:
        print(
            f"note: {not_run} program(s) not run on {candidate.name} (the worker died in another flow's "
            "stage first); they are not counted below"
        )
    print(
        f"VERDICT: PASS: {candidate.name} matched eager and did not regress against {baseline.name} "
        f"on {summary.total_examples() - not_run} programs ({summary.known_count()} hits on known findings)"
    )
    return 0
