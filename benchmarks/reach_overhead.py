"""What the reach meter costs (a benchmark: it prints figures, asserts nothing).

The same deterministic sample of drawn programs (float and quantized, at
campaign sizes) runs on a flow in-process twice per program, once with the
meter measuring it (etprop/lowering/reach.py, as a campaign's worker does)
and once without, the order alternating so drift in machine load falls on
both sides. Prints the median seconds per example each way, the overhead,
and the examples-per-minute a campaign keeps at one example measured in N.

    .venv/bin/python benchmarks/reach_overhead.py [--examples 6] [--flow xnnpack]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import sample_specs  # noqa: E402

from etprop import flows as flowreg  # noqa: E402
from etprop.lowering import reach  # noqa: E402
from etprop.oracles.sets import SINGLE_FLOW  # noqa: E402
from etprop.strategies import sizes  # noqa: E402
from etprop.verdicts.check import Artifacts, run_example  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=6, help="programs per family")
    parser.add_argument("--flow", default="xnnpack")
    args = parser.parse_args()
    flow = flowreg.get_available(args.flow)
    sizes.use_campaign_sizes(True)
    specs = sample_specs(args.examples, 6, 40) + sample_specs(max(2, args.examples // 2), 4, 24, "quantized")
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        meter = reach.Meter(root / "reach")
        run_example(specs[0], [flow], "bench", SINGLE_FLOW, Artifacts(root / "warmup"))
        on, off = [], []
        for index, spec in enumerate(specs * 2):

            def measured():
                started = time.perf_counter()
                with meter.example(f"bench|{index}"):
                    run_example(spec, [flow], "bench", SINGLE_FLOW, Artifacts(root / "on"))
                on.append(time.perf_counter() - started)

            def plain():
                started = time.perf_counter()
                run_example(spec, [flow], "bench", SINGLE_FLOW, Artifacts(root / "off"))
                off.append(time.perf_counter() - started)

            for run in (measured, plain) if index % 2 == 0 else (plain, measured):
                run()
    with_meter, without = statistics.median(on), statistics.median(off)
    overhead = with_meter / without - 1
    print(
        f"# {date.today()} on {platform.machine()} ({os.cpu_count()} CPUs); "
        f"command: reach_overhead.py {' '.join(sys.argv[1:])}"
    )
    print(
        f"{len(specs)} programs x 2 runs each way on {flow.name}: median {without:.2f} s per example "
        f"without the meter, {with_meter:.2f} s with it: overhead {overhead:+.0%}"
    )
    for every in (1, 2, 3, 4):
        print(f"  one example in {every} measured: {1 / (1 + overhead / every):.0%} of the examples per minute")


if __name__ == "__main__":
    main()
