"""False alarms of the quantized oracle over a fixed sample of drawn quantized
programs (a benchmark: it prints figures, asserts nothing).

Draws ``--programs`` quantized programs (derandomized: the same list every
time), the families and schemes of the ``differential_quantized`` property,
and runs each on ``--flows`` exactly as a campaign does (isolated worker,
attribution by intervention, repros kept under ``--artifacts``). Every failure
is either attributed to a recorded finding or listed as unexplained; an
unexplained one is a false alarm until shown to be a real difference, so the
list is the to-do of whoever quotes the figure. ``--shard i/N`` runs every
N-th program, so two processes use two cores.

    .venv/bin/python benchmarks/quantized_false_alarms.py --programs 500 --shard 0/2 --artifacts /tmp/fa
"""

from __future__ import annotations

import argparse
import datetime
import platform
import time
from collections import Counter
from pathlib import Path

from etprop.strategies.reproducible import draws_independent_of_imported_source

# Judged as the single-flow quantized property is (its repros replay and shrink as such).
PROPERTY = "quantized"


def sample_specs(count: int) -> list[dict]:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from etprop.program.quantize import SCHEMES
    from etprop.strategies.control_flow import control_flow_programs
    from etprop.strategies.programs import computed_weight_programs, programs, quantized

    families = st.one_of(
        programs(min_nodes=4, max_nodes=24, gemm_heavy=True, dtype="float32"),
        computed_weight_programs(),
        control_flow_programs(),
    )
    specs: list[dict] = []

    @settings(
        max_examples=count, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(spec=quantized(families, SCHEMES))
    def collect(spec):
        specs.append(spec)

    with draws_independent_of_imported_source():
        collect()
    return specs


def _resume(artifacts: Path, mine: dict, outcomes: Counter, unexplained: list) -> set:
    """Programs of this shard an earlier, interrupted run already judged:
    their recorded results are counted as they stand."""
    import json

    from etprop.verdicts.outcomes import Outcome

    done = set()
    for path in sorted((artifacts / "results").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["property"] != PROPERTY or record["digest"] not in mine:
                continue
            done.add(record["digest"])
            scheme = mine[record["digest"]]["quantization"]["scheme"]
            for result in record["flows"]:
                label = result["outcome"] + (f" (known {result['known']})" if result["known"] else "")
                outcomes[(scheme, result["flow"], label)] += 1
                if Outcome(result["outcome"]).is_failure and not result["known"]:
                    unexplained.append((record["digest"], result["flow"], result["message"][:300], record["repro"]))
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=500)
    parser.add_argument("--flows", default="xnnpack")
    parser.add_argument("--shard", default="0/1")
    parser.add_argument("--artifacts", default="artifacts/false-alarms")
    args = parser.parse_args()
    from etprop import flows as flowreg
    from etprop.lowering.pipeline import ExportFailed
    from etprop.oracles.sets import SINGLE_FLOW
    from etprop.program.spec import digest
    from etprop.verdicts.session import Session

    index, total = (int(part) for part in args.shard.split("/"))
    flows = [flowreg.get_available(name) for name in args.flows.split(",")]
    specs = sample_specs(args.programs)
    unique = {digest(s): s for s in specs}
    mine = [s for i, s in enumerate(unique.values()) if i % total == index]
    print(
        f"{len(specs)} drawn, {len(unique)} distinct quantized programs; shard {args.shard}: {len(mine)}; "
        f"flows {args.flows}",
        flush=True,
    )
    outcomes: Counter = Counter()
    unexplained = []
    done = _resume(Path(args.artifacts), {digest(s): s for s in mine}, outcomes, unexplained)
    if done:
        print(f"{len(done)} programs already judged in {args.artifacts} (counted, not run again)", flush=True)
    session = Session(Path(args.artifacts))
    started = time.time()
    try:
        for number, spec in enumerate(mine, 1):
            if digest(spec) in done:
                continue
            scheme = spec["quantization"]["scheme"]
            for flow in flows:
                try:
                    result = session.run(spec, [flow], PROPERTY, SINGLE_FLOW, attribute=True)
                except ExportFailed:  # recorded by the session as a generator defect
                    outcomes[(scheme, flow.name, "export error (the float program)")] += 1
                    continue
                for example in [result] + result.followups:
                    for flow_result in example.results:
                        label = flow_result.outcome.value + (
                            f" (known {flow_result.known})" if flow_result.known else ""
                        )
                        outcomes[(scheme, flow.name, label)] += 1
                        if flow_result.outcome.is_failure and not flow_result.known:
                            unexplained.append(
                                (digest(example.spec), flow.name, flow_result.message[:300], example.repro)
                            )
            print(
                f"[{time.time() - started:6.0f} s] {number}/{len(mine)} programs; "
                f"{len(unexplained)} unexplained failure(s)",
                flush=True,
            )
    finally:
        session.close()
    print(
        f"\n{datetime.date.today()} · {platform.node()} · `python benchmarks/quantized_false_alarms.py "
        f"--programs {args.programs} --flows {args.flows} --shard {args.shard}` · {time.time() - started:.0f} s"
    )
    print("\n| scheme | flow | outcome | results |\n|---|---|---|---|")
    for (scheme, flow, label), count in sorted(outcomes.items()):
        print(f"| {scheme} | {flow} | {label} | {count} |")
    print(f"\nunexplained failures: {len(unexplained)}")
    for key, flow, message, repro in unexplained:
        print(f"- {key} on {flow}: {message} (repro: {repro})")


if __name__ == "__main__":
    main()
