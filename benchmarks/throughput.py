"""Throughput and overhead per flow (a benchmark: it prints figures, asserts nothing).

For a fixed, deterministic sample of drawn programs, per flow:
- examples per minute and ops per lowering;
- the cost model: a least-squares fit of seconds per example against its ops
  (fixed seconds + seconds per op) and the fixed cost's share of the time;
- where the wall time goes: ExecuTorch (lowering, serialization, runtime
  load/run, Core AI runtime), torch (export, eager and float64 references),
  and etprop itself (drawing aside: build, oracles' own work, repro and
  result files): the last is the suite's overhead;
- isolation overhead: the same examples through the warm worker process vs
  in-process.

Float programs, the same kind of programs PT2E-quantized (quantization
counts as torch time: export, prepare, calibrate, convert) and windows of real
architectures (``real_models``, 3 to 30 nodes as the family draws them, not
``--min-nodes``/``--max-nodes``) are measured apart. With ``--campaign-sizes``
the programs are drawn as a campaign draws them (strategies/sizes.py,
from the ranges the ``mixed`` and quantized properties name).

    .venv/bin/python benchmarks/throughput.py [--examples 6] [--flows portable,xnnpack]
        [--families float,quantized,real_models] [--campaign-sizes]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from etprop import flows as flowreg
from etprop.lowering import stages
from etprop.oracles.sets import SINGLE_FLOW
from etprop.program.spec import count_ops
from etprop.strategies import sizes
from etprop.strategies.programs import programs, quantized
from etprop.strategies.reproducible import draws_independent_of_imported_source
from etprop.verdicts.check import Artifacts, run_example
from etprop.verdicts.session import Session


def sample_specs(count: int, min_nodes: int, max_nodes: int, family: str = "float") -> list[dict]:
    specs = []
    strategy = programs(min_nodes=min_nodes, max_nodes=max_nodes)
    if family == "quantized":
        strategy = quantized(programs(min_nodes=min_nodes, max_nodes=max_nodes, gemm_heavy=True, dtype="float32"))
    elif family == "real_models":
        from etprop.strategies.model_windows import real_model_windows

        strategy = real_model_windows()

    @settings(
        max_examples=count, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(spec=strategy)
    def collect(spec):
        specs.append(spec)

    with draws_independent_of_imported_source():
        collect()
    return specs[-count:]


def measure_flow(flow, specs, artifacts: Path) -> dict:
    run_example(specs[0], [flow], "bench", SINGLE_FLOW, Artifacts(artifacts / "warmup"))
    stages.SPENT.clear()
    seconds = []
    for spec in specs:
        started = time.perf_counter()
        run_example(spec, [flow], "bench", SINGLE_FLOW, Artifacts(artifacts / "inproc"))
        seconds.append(time.perf_counter() - started)
    wall = sum(seconds)
    executorch, torch_time = stages.SPENT["executorch"], stages.SPENT["torch"]
    return {
        "wall": wall,
        "executorch": executorch,
        "torch": torch_time,
        "etprop": wall - executorch - torch_time,
        "fit": cost_model([count_ops(s) for s in specs], seconds),
    }


def cost_model(ops: list[int], seconds: list[float]) -> tuple[float, float, float] | None:
    """Fixed seconds, seconds per op, and the fixed cost's share of the mean
    example: how much a lowering's fixed cost still dominates at these sizes."""
    if len(set(ops)) < 2:
        return None
    per_op, fixed = statistics.linear_regression(ops, seconds)
    return fixed, per_op, fixed / statistics.mean(seconds)


def measure_isolation(flow, specs, artifacts: Path, repeats: int = 2) -> tuple[float, float]:
    """Median seconds per example isolated and in-process. Each example runs
    both ways ``repeats`` times, the order alternating, so drift in machine
    load and caches warming up fall on both sides equally. The isolated side
    is a plain run (``Session.run``): a failure's confirmation reruns are
    the campaign's cost of checking determinism, not of isolation."""
    session = Session(artifacts / "iso", isolated=True)
    run_example(specs[0], [flow], "bench", SINGLE_FLOW, Artifacts(artifacts / "warmup"))
    session.run(specs[0], [flow], "bench", SINGLE_FLOW)  # starts the worker
    isolated, inproc = [], []

    def timed_isolated(spec):
        t0 = time.perf_counter()
        session.run(spec, [flow], "bench", SINGLE_FLOW)
        isolated.append(time.perf_counter() - t0)

    def timed_inproc(spec):
        t0 = time.perf_counter()
        run_example(spec, [flow], "bench", SINGLE_FLOW, Artifacts(artifacts / "inproc2"))
        inproc.append(time.perf_counter() - t0)

    try:
        for index, spec in enumerate(specs * repeats):
            order = (timed_isolated, timed_inproc) if index % 2 == 0 else (timed_inproc, timed_isolated)
            for measure in order:
                measure(spec)
    finally:
        session.close()
    return statistics.median(isolated), statistics.median(inproc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=6)
    parser.add_argument("--min-nodes", type=int, default=20)
    parser.add_argument("--max-nodes", type=int, default=40)
    parser.add_argument("--flows", default="")
    parser.add_argument("--no-isolation", action="store_true")
    parser.add_argument("--families", default="float,quantized")
    parser.add_argument(
        "--campaign-sizes", action="store_true", help="draw as a campaign does, from the properties' own ranges"
    )
    args = parser.parse_args()
    if args.campaign_sizes:
        sizes.use_campaign_sizes(True)
    chosen = [flowreg.get_available(n) for n in args.flows.split(",") if n] or [
        f for f in flowreg.available_flows() if f.name in ("portable", "xnnpack", "coreai")
    ]
    for family in args.families.split(","):
        low, high = (6, 32) if family == "float" else (4, 24)
        if not args.campaign_sizes:
            low, high = args.min_nodes, args.max_nodes
        specs = sample_specs(args.examples, low, high, family)
        ops = [count_ops(s) for s in specs]
        print(
            f"{family}: {len(specs)} programs, {statistics.mean(ops):.1f} ops on average "
            f"(min {min(ops)}, max {max(ops)})"
        )
        print(
            f"{'flow':22} {'ex/min':>7} {'s/ex':>6} {'ExecuTorch':>11} {'torch':>7} {'etprop':>7}"
            f" {'fixed s':>8} {'s/op':>6} {'fixed share':>12}"
            f" {'isolated s/ex':>14} {'in-proc s/ex':>13} {'isolation':>10}"
        )
        with tempfile.TemporaryDirectory() as tmp:
            for flow in chosen:
                figures = measure_flow(flow, specs, Path(tmp) / flow.name)
                per = figures["wall"] / len(specs)
                line = (
                    f"{flow.name:22} {60 / per:7.1f} {per:6.2f} {figures['executorch'] / figures['wall']:10.1%} "
                    f"{figures['torch'] / figures['wall']:7.1%} {figures['etprop'] / figures['wall']:7.1%}"
                )
                fit = figures["fit"]
                line += f" {fit[0]:8.2f} {fit[1]:6.3f} {fit[2]:12.1%}" if fit else f" {'-':>8} {'-':>6} {'-':>12}"
                if not args.no_isolation:
                    isolated, inproc = measure_isolation(flow, specs, Path(tmp) / flow.name)
                    line += f" {isolated:14.2f} {inproc:13.2f} {(isolated - inproc) / inproc:10.1%}"
                print(line, flush=True)


if __name__ == "__main__":
    main()
