"""The anchor: ExecuTorch's own tests from the installed wheel under etprop's
reach meter, side by side with a campaign (a benchmark: it prints figures,
asserts nothing).

Runs, each test's call phase measured exactly as a campaign measures an
example (benchmarks/reach_plugin.py, one coverage.py context per test):
  xnnpack-ops      executorch/backends/xnnpack/test/ops
  xnnpack-passes   executorch/backends/xnnpack/test/passes
  backend-suite    executorch/backends/test/suite/operators, XNNPACK flows
                   (ET_TEST_ENABLED_BACKENDS=xnnpack; every N-th test with --suite-every N)
then prints per component the branches reached by ExecuTorch's tests, by the
campaign, by both and by each alone, and the functions where one reaches most
branches the other does not. Tests that fail here are listed, and do not
stop the run.

    .venv/bin/python benchmarks/backend_coverage.py --campaign artifacts [--anchor DIR] [--reuse]
        [--suites xnnpack-ops,xnnpack-passes,backend-suite] [--suite-every 1] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from etprop.lowering import reach

HERE = Path(__file__).resolve().parent


def _executorch_dir() -> Path:
    import importlib.util

    return Path(next(iter(importlib.util.find_spec("executorch").submodule_search_locations)))


SUITES = {
    "xnnpack-ops": (["backends/xnnpack/test/ops"], []),
    "xnnpack-passes": (["backends/xnnpack/test/passes"], []),
    "backend-suite": (["backends/test/suite/operators"], ["-m", "backend_xnnpack"]),
}


def run_suite(name: str, anchor: Path, workers: int, every: int) -> tuple[float, list[str], str]:
    """One of ExecuTorch's test folders under the meter: seconds, failing tests, pytest's last line."""
    paths, extra = SUITES[name]
    root = _executorch_dir()
    command = [
        sys.executable,
        "-m",
        "pytest",
        *[str(root / p) for p in paths],
        *extra,
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "reach_plugin",
        "-o",
        "addopts=",
        "--timeout",
        "900",
        "-rf",
    ]
    if workers > 1:
        command += ["-n", str(workers)]
    env = dict(
        os.environ,
        ETPROP_REACH_DIR=str(anchor / "reach"),
        ETPROP_ANCHOR_EVERY=str(every),
        PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        ET_TEST_ENABLED_BACKENDS="xnnpack",
    )
    started = time.time()
    done = subprocess.run(command, env=env, cwd=anchor, capture_output=True, text=True)
    failed = sorted(set(re.findall(r"^FAILED (\S+)", done.stdout, re.M)))
    tail = [line for line in done.stdout.splitlines() if line.strip()][-1:] or [""]
    return time.time() - started, failed, tail[0]


def _functions_only(first: reach.Reach, second: reach.Reach, component: str, shown: int) -> list[str]:
    """The functions of ``component`` where ``first`` reaches the most branch arcs ``second`` does not."""
    counts: dict[str, int] = {}
    for path, arcs in first.reached.items():
        if reach.component_of(path) != component:
            continue
        owners = first.owners.get(path, {})
        for arc in arcs - second.reached.get(path, set()):
            function = owners.get(arc)
            if function:
                counts[function] = counts.get(function, 0) + 1
    rows = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:shown]
    return [f"{function} ({n})" for function, n in rows]


def compare(anchor: reach.Reach, campaign: reach.Reach, shown: int = 3) -> list[str]:
    lines = [
        f"{'component':24} {'branches':>8} {'ET tests':>9} {'campaign':>9} {'both':>6} {'ET only':>8} "
        f"{'camp. only':>10} {'union':>6}"
    ]
    details = []
    for component in reach.COMPONENTS:
        total = (
            anchor.components.get(component, reach.ComponentReach()).branches
            or campaign.components.get(component, reach.ComponentReach()).branches
        )
        files = {p for p in set(anchor.possible) | set(campaign.possible) if reach.component_of(p) == component}
        et = {(p, a) for p in files for a in anchor.reached.get(p, set())}
        ours = {(p, a) for p in files for a in campaign.reached.get(p, set())}
        lines.append(
            f"{component:24} {total:8} {len(et):9} {len(ours):9} {len(et & ours):6} {len(et - ours):8} "
            f"{len(ours - et):10} {len(et | ours):6}"
        )
        only_et, only_ours = (
            _functions_only(anchor, campaign, component, shown),
            _functions_only(campaign, anchor, component, shown),
        )
        if only_et or only_ours:
            details.append(f"{component}:")
            details.append("  only ExecuTorch's tests: " + ("; ".join(only_et) or "-"))
            details.append("  only the campaign:       " + ("; ".join(only_ours) or "-"))
    return lines + [""] + details


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--campaign",
        action="append",
        default=[],
        help="a campaign's artifacts directory (repeatable); without one, the anchor alone",
    )
    parser.add_argument("--anchor", default="artifacts/anchor", help="where the anchor's meter data goes")
    parser.add_argument("--reuse", action="store_true", help="read the anchor's data from an earlier run")
    parser.add_argument("--suites", default=",".join(SUITES))
    parser.add_argument(
        "--suite-every", type=int, default=1, help="run one backend-suite test in N (every N-th in collection order)"
    )
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    anchor = Path(args.anchor).resolve()
    anchor.mkdir(parents=True, exist_ok=True)
    print(
        f"# {date.today()} on {platform.machine()} ({os.cpu_count()} CPUs); "
        f"command: {' '.join([Path(sys.argv[0]).name] + sys.argv[1:])}"
    )
    if not args.reuse:
        for name in [s for s in args.suites.split(",") if s]:
            if name not in SUITES:
                parser.error(f"unknown suite {name!r}: choose from {', '.join(SUITES)}")
            every = args.suite_every if name == "backend-suite" else 1
            seconds, failed, tail = run_suite(name, anchor, args.workers, every)
            print(f"{name}: {tail} in {seconds:.0f} s" + (f"; one test in {every} run" if every > 1 else ""))
            for test in failed:
                print(f"  fails here: {test}")
    anchor_data = reach.combine([anchor / "reach"], anchor / "combined.db")
    if anchor_data is None:
        print("no anchor data: run without --reuse first")
        return 2
    anchor_reach = reach.read(anchor_data)
    if not args.campaign:
        for component, counts in anchor_reach.components.items():
            print(f"{component:24} {counts.branches_reached:6} / {counts.branches} branches")
        return 0
    campaign_data = reach.combine([Path(d) / "reach" for d in args.campaign], anchor / "campaign-combined.db")
    if campaign_data is None:
        print("the campaign directories hold no reach data (ARTIFACTS/reach/)")
        return 2
    print("\n".join(compare(anchor_reach, reach.read(campaign_data))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
