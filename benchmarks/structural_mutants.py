"""Finding power for structural defects: a short campaign over the structural
mutant flows (benchmarks/structural_mutant_flows.py: a GEMM left on portable,
a weight stored twice, partitions merged into a cycle, methods given separate
Core AI payloads), each compared with the stock flow it mutates on the same
drawn programs (the differential properties). A mutant is killed when some
example fails on it in a way no recorded finding explains while its stock
flow passes that program. A benchmark:
it prints figures, asserts nothing.

    .venv/bin/python benchmarks/structural_mutants.py [--minutes 8] [--artifacts DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

FLOWS_FILE = Path(__file__).with_name("structural_mutant_flows.py")
FAILURES = {
    "mismatch",
    "crash",
    "timeout",
    "lowering error",
    "run error",
    "serialization error",
    "property violation",
    "quantization error",
}


def mutants() -> dict[str, str]:
    """Each available structural mutant flow and the stock flow it mutates."""
    from etprop import flows

    flows.load_flow_module(str(FLOWS_FILE))
    return {
        flow.name: flow.baseline for flow in flows.all_flows() if flow.name.startswith("mutant-") and flow.available
    }


def judged(artifacts: Path, mutant: str, stock: str) -> dict:
    """What the campaign says of one mutant: examples it ran, and the first kill."""
    records = [
        json.loads(line)
        for path in sorted((artifacts / "results").glob("*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    passed_stock = {
        record["digest"]
        for record in records
        for flow in record["flows"]
        if flow["flow"] == stock and flow["outcome"] == "pass"
    }
    ran = 0
    for record in records:
        for flow in record["flows"]:
            if flow["flow"] != mutant:
                continue
            ran += 1
            if flow["outcome"] in FAILURES and not flow.get("known") and record["digest"] in passed_stock:
                return {
                    "ran": ran,
                    "killed": True,
                    "property": record["property"],
                    "outcome": flow["outcome"],
                    "message": flow["message"].splitlines()[0][:240],
                }
    return {"ran": ran, "killed": False}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=8.0, help="the campaign's budget (default: 8)")
    parser.add_argument("--artifacts", default="artifacts-structural-mutants")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument(
        "--properties",
        default="differential",
        help="pytest -k expression (default: the differential properties, which run the "
        "stock flow and the mutant on the same program)",
    )
    args = parser.parse_args()
    chosen = mutants()
    stock = sorted(set(chosen.values()))
    command = [
        sys.executable,
        "-m",
        "etprop.commands.cli",
        "fuzz",
        "--flow-module",
        str(FLOWS_FILE),
        "--flows",
        ",".join(stock + sorted(chosen)),
        "--minutes",
        str(args.minutes),
        "--artifacts",
        args.artifacts,
        "--no-shrink",
        "--properties",
        args.properties,
    ]
    if args.workers:
        command += ["--workers", str(args.workers)]
    started = time.time()
    subprocess.run(command, check=False, stdout=subprocess.DEVNULL)
    seconds = time.time() - started
    shown = " ".join(part for part in sys.argv)
    print(f"\n{datetime.date.today()} · {platform.node()} ({platform.machine()}) · `{shown}` · {seconds:.0f} s")
    print("\n| mutant | stock flow | mutant results | killed | by |\n|---|---|---|---|---|")
    kills = defaultdict(int)
    for mutant, base in sorted(chosen.items()):
        verdict = judged(Path(args.artifacts), mutant, base)
        kills[verdict["killed"]] += 1
        by = f"{verdict['property']}: {verdict['outcome']}: {verdict['message']}" if verdict["killed"] else ""
        print(f"| {mutant} | {base} | {verdict['ran']} | {'yes' if verdict['killed'] else 'no'} | {by} |")
    print(f"\nkilled {kills[True]} of {len(chosen)} structural mutants")


if __name__ == "__main__":
    main()
