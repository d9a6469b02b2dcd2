"""Where the README's test command spends its time (a benchmark: it prints
figures, asserts nothing).

Runs ``bash ci/test.sh`` with ``--durations 0`` (or reads a log of such a
run), then prints the wall time, the summed test time and how the two xdist
workers shared it, the time per area of the suite (a test file, or a
property module of ``properties/``), and the slowest tests, with the date,
machine and command beside the figures.

    .venv/bin/python benchmarks/test_time.py [--log FILE] [--save FILE] [--slowest 20] [-- extra pytest args]
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DURATION = re.compile(r"^\s*([\d.]+)s (call|setup|teardown)\s+(\S+)")
SUMMARY = re.compile(r"=+ (.*(?:passed|failed).*) in ([\d.]+)s")


def durations(log: str) -> list[tuple[float, str, str]]:
    """(seconds, phase, test id) for every line pytest's ``--durations 0`` printed."""
    found = []
    for line in log.splitlines():
        match = DURATION.match(line)
        if match:
            found.append((float(match.group(1)), match.group(2), match.group(3)))
    return found


def area(test_id: str) -> str:
    """The file a test lives in; a parametrized property is grouped by its test function."""
    path, _, name = test_id.partition("::")
    if path.startswith("properties/"):
        return f"{path}::{name.split('[')[0]}"
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", help="read a finished run's output instead of running the test command")
    parser.add_argument("--slowest", type=int, default=20)
    parser.add_argument("--save", help="also keep the run's whole output in this file")
    parser.add_argument("pytest_args", nargs="*", help="after --: extra pytest arguments")
    args = parser.parse_args()
    command = ["bash", "ci/test.sh", "--durations", "0", "-p", "no:cacheprovider", *args.pytest_args]
    if args.log:
        text, wall = Path(args.log).read_text(), None
    else:
        started = time.time()
        completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        text, wall = completed.stdout + completed.stderr, time.time() - started
        if args.save:
            Path(args.save).write_text(text)
    rows = durations(text)
    if not rows:
        print("no --durations lines found: was the run cut short?", file=sys.stderr)
        return 2
    summary = SUMMARY.search(text)
    total = sum(seconds for seconds, _, _ in rows)
    print(
        f"date {datetime.date.today()}, machine {platform.machine()} with {os.cpu_count()} CPUs, "
        f"command: {' '.join(command) if not args.log else 'log ' + args.log}"
    )
    if summary:
        print(f"pytest: {summary.group(1)} in {float(summary.group(2)):.0f} s")
    if wall is not None:
        print(f"wall time with the install check: {wall:.0f} s")
    print(f"test time (every phase of every test, summed over workers): {total:.0f} s")
    per_area: dict[str, float] = collections.Counter()
    counts: dict[str, int] = collections.Counter()
    for seconds, phase, test_id in rows:
        per_area[area(test_id)] += seconds
        counts[area(test_id)] += phase == "call"
    print("\narea | tests | seconds | share")
    for name, seconds in sorted(per_area.items(), key=lambda kv: -kv[1]):
        if seconds >= total / 200:
            print(f"{name} | {counts[name]} | {seconds:.0f} | {seconds / total:.1%}")
    print(f"\nslowest {args.slowest}:")
    for seconds, phase, test_id in sorted(rows, reverse=True)[: args.slowest]:
        print(f"{seconds:7.1f} s {phase:8} {test_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
