"""The ``etprop`` command: flows, fuzz, repro, shrink, replay, gate.

Every user error (unknown flow, bad repro file, missing optional package)
ends as one line on stderr naming the fix, and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from etprop.errors import UsageError


def cmd_flows(args) -> int:
    from etprop import flows

    for flow in flows.all_flows():
        reason = flow.unavailable_reason()
        status = "available" if reason is None else f"unavailable: {reason}"
        baseline = f" (baseline: {flow.baseline})" if flow.baseline else ""
        print(f"{flow.name:24} {status}\n{'':24} {flow.description}{baseline}")
    return 0


def cmd_repro(args) -> int:
    from etprop.commands.replay import replay_file

    if args.check:
        from etprop.program.spec import count_ops
        from etprop.verdicts import repro

        record = repro.read(args.file)
        repro.check_flows(record, args.file)
        print(
            f"{args.file}: a valid {repro.FORMAT} file: property {record['property']}, flows "
            f"{', '.join(record['flows'])}, {len(record['spec']['methods'])} method(s), "
            f"{count_ops(record['spec'])} node(s)"
        )
        return 0
    if args.script:
        from etprop.verdicts import repro

        record = repro.read(args.file)
        repro.check_flows(record, args.file)
        repro.atomic_write(Path(args.script), repro.etprop_script(record, Path(args.file).name))
        print(f"wrote {args.script}: replays {args.file} through etprop, judged as the suite judges")
        return 0
    if args.standalone:
        from etprop.verdicts import repro

        record = repro.read(args.file)
        repro.check_flows(record, args.file)
        flow = args.flow or record["flows"][-1]
        if flow not in record["flows"]:
            raise UsageError(f"--flow {flow}: the repro lowers {', '.join(record['flows'])}")
        repro.atomic_write(Path(args.standalone), repro.standalone_script(record["spec"], flow))
        print(
            f"wrote {args.standalone}: flow {flow!r}, needs torch and executorch only "
            "(plus the flow's add-on for candidate flows, etprop's bridge for Core AI), "
            "with the expected values and the tolerance policy embedded"
        )
        return 0
    outcome = replay_file(Path(args.file), Path(args.artifacts), verbose=True, flow_modules=args.flow_module)
    return 1 if outcome.still_failing else 0


def cmd_shrink(args) -> int:
    from etprop.commands.shrink import shrink_file

    if args.pending:
        import time

        from etprop.commands.triage import run_queue

        until = args.until or (time.time() + args.minutes * 60 if args.minutes else None)
        done = run_queue(
            Path(args.artifacts),
            until,
            flow_modules=args.flow_module,
            max_groups=args.max_groups,
            max_checks=args.max_checks,
        )
        print(f"shrink --pending: {done} group(s) shrunk and placed under {Path(args.artifacts) / 'defects'}")
        return 0
    if not args.file:
        raise UsageError("name a repro file to shrink, or pass --pending to shrink a campaign's queued failures")
    shrink_file(
        Path(args.file),
        Path(args.output) if args.output else None,
        args.match,
        args.flow,
        args.max_checks,
        flow_modules=args.flow_module,
    )
    return 0


def cmd_replay(args) -> int:
    if args.env:
        from etprop.commands.environments import replay_in

        return replay_in(args.env, args)
    from etprop.commands.replay import replay_all

    summary = replay_all(Path(args.artifacts), [Path(p) for p in args.paths], flow_modules=args.flow_module)
    return 1 if summary.still_failing else 0


def cmd_fuzz(args) -> int:
    from etprop.commands.campaign import Campaign

    return Campaign.from_args(args).run()


def cmd_coverage(args) -> int:
    """Merge the reach meter's data of several campaigns (or shards) and print it."""
    from etprop.commands.reach_report import combined_section

    found = combined_section([Path(d) for d in args.directories], Path(args.into))
    if found is None:
        raise UsageError(
            "no reach data under "
            + ", ".join(args.directories)
            + " (a campaign writes it to ARTIFACTS/reach/; run etprop fuzz first)"
        )
    print("\n".join(found.text(functions=5)))
    return 0


def cmd_gate(args) -> int:
    if args.baseline_env or args.candidate_env:
        from etprop.commands.cross_gate import run_cross_gate

        if not (args.baseline_env and args.candidate_env):
            raise UsageError("a gate across environments needs both --baseline-env PY and --candidate-env PY")
        return run_cross_gate(args)
    from etprop.commands.gate import run_gate

    if not (args.baseline and args.candidate):
        raise UsageError(
            "name both flows: --baseline FLOW --candidate FLOW (or two environments: "
            "--baseline-env PY --candidate-env PY --flow FLOW)"
        )
    return run_gate(args)


def cmd_env(args) -> int:
    from etprop.commands.environments import create

    python = create(
        Path(args.directory),
        args.over,
        tuple(args.install),
        Path(args.etprop) if args.etprop else None,
        Path(args.sitecustomize) if args.sitecustomize else None,
    )
    print(
        f"{python}: a layered environment over {args.over}; its own packages: etprop"
        + "".join(f", {requirement}" for requirement in args.install)
    )
    return 0


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--artifacts", default="artifacts", help="directory for repros, results and reports (default: artifacts)"
    )
    parser.add_argument(
        "--flow-module",
        action="append",
        default=[],
        help="a .py file or module that registers extra flows (repeatable); "
        "it is Python and runs as such: load only modules you trust",
    )
    parser.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="NAME=N",
        help="raise a size limit for specs read from files (repeatable; see docs/spec-format.md)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="etprop", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("flows", help="list registered flows and whether each is available here")
    _add_common(p)
    p.set_defaults(func=cmd_flows)

    p = sub.add_parser("fuzz", help="run a fuzzing campaign over flows")
    _add_common(p)
    p.add_argument("--flows", default="", help="comma-separated flows (default: every available flow)")
    p.add_argument("--minutes", type=float, default=5.0, help="time budget (default: 5)")
    p.add_argument(
        "--examples",
        type=int,
        default=0,
        help="stop after this many examples per property and flow (default: no limit)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="pytest-xdist workers on this machine (default: one per core)",
    )
    p.add_argument("--shard", default="0/1", help="this machine's shard, i/N (seeds differ per shard)")
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="campaign seed: the same code and seed draw the same programs (default: a new seed "
        "each run, printed first)",
    )
    p.add_argument(
        "--reach-every",
        type=int,
        default=None,
        metavar="N",
        help="measure the lowering code's coverage on one example in N (0: off; default: campaign.REACH_EVERY)",
    )
    p.add_argument("--db", default="", help="example database: a directory or redis://host:port/db")
    p.add_argument("--db-readonly", default="", help="a database to replay without writing to it")
    p.add_argument("--properties", default="", help="pytest -k expression selecting properties")
    p.add_argument(
        "--no-shrink",
        action="store_true",
        help="record failures as found, without shrinking, merging or placing them (quick smoke runs)",
    )
    p.set_defaults(func=cmd_fuzz)

    p = sub.add_parser("coverage", help="the lowering code's coverage (reach) of campaigns: combine DIR...")
    p.add_argument("action", choices=["combine"])
    p.add_argument(
        "directories",
        nargs="+",
        metavar="DIR",
        help="campaign artifacts directories (their reach/ folders) or reach folders",
    )
    p.add_argument(
        "--into", default="artifacts/reach-merged", help="where the merged data goes (default: artifacts/reach-merged)"
    )
    p.set_defaults(func=cmd_coverage)

    p = sub.add_parser("repro", help="replay one repro file; exit 1 while the defect is present")
    _add_common(p)
    p.add_argument("file")
    p.add_argument(
        "--standalone",
        metavar="OUT.py",
        help="instead of replaying, write a script that lowers and judges the program with "
        "torch and executorch alone (for an upstream issue)",
    )
    p.add_argument(
        "--script",
        metavar="OUT.py",
        help="instead of replaying, write a script that replays the repro through etprop "
        "(judged exactly as the suite judges)",
    )
    p.add_argument("--flow", help="with --standalone: the flow the script lowers (default: the repro's last)")
    p.add_argument(
        "--check",
        action="store_true",
        help="only validate the file (schema, names, sizes, shapes); build and run nothing",
    )
    p.set_defaults(func=cmd_repro)

    p = sub.add_parser(
        "shrink",
        help="shrink a repro file to the smallest spec that fails the same way, "
        "or a campaign's queued failures (--pending)",
    )
    _add_common(p)
    p.add_argument("file", nargs="?")
    p.add_argument(
        "--pending",
        action="store_true",
        help="shrink, merge and place the failure groups a campaign under --artifacts left queued",
    )
    p.add_argument("--minutes", type=float, default=0, help="with --pending: time budget (default: none)")
    p.add_argument("--until", type=float, default=0, help=argparse.SUPPRESS)
    p.add_argument("--max-groups", type=int, default=None, help="with --pending: groups to take at most")
    p.add_argument("--output", default="", help="where to write (default: FILE with .shrunk.json)")
    p.add_argument("--match", default=None, help="a regular expression the failure message must keep matching")
    p.add_argument("--flow", default=None, help="the failing flow to keep (default: the last failing one)")
    p.add_argument("--max-checks", type=int, default=400, help="candidates to lower at most (default: 400)")
    p.set_defaults(func=cmd_shrink)

    p = sub.add_parser("replay", help="re-run every saved repro and pending example")
    _add_common(p)
    p.add_argument(
        "paths",
        nargs="*",
        help="repro files or directories (default: ARTIFACTS/repros, ARTIFACTS/pending and findings/repros)",
    )
    p.add_argument(
        "--env",
        metavar="PY",
        help="replay in another Python environment (its etprop, torch and "
        "ExecuTorch): which recorded findings are fixed there",
    )
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("env", help="create a layered environment: another one's packages, a few changed on top")
    p.add_argument("directory")
    p.add_argument(
        "--over", default=sys.executable, help="the python whose environment it layers over (default: this one)"
    )
    p.add_argument(
        "--install",
        action="append",
        default=[],
        metavar="REQUIREMENT",
        help="a pip requirement installed into the layer only, without dependencies (repeatable)",
    )
    p.add_argument("--etprop", default="", help="etprop to install there: a wheel or a checkout (default: this one's)")
    p.add_argument("--sitecustomize", default="", help="a sitecustomize.py every process of the layer runs")
    p.set_defaults(func=cmd_env)

    p = sub.add_parser("gate", help="bounded baseline-vs-candidate run with a CI verdict")
    _add_common(p)
    p.add_argument("--baseline", help="the baseline flow")
    p.add_argument("--candidate", help="the candidate flow")
    p.add_argument("--examples", type=int, default=4, help="examples per property (default: 4)")
    p.add_argument(
        "--properties",
        default="",
        help="pytest -k expression narrowing the gate's properties (default: every differential property)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--baseline-env", metavar="PY", help="the baseline environment's python: gate two installations")
    p.add_argument("--candidate-env", metavar="PY", help="the candidate environment's python")
    p.add_argument("--flow", help="with --baseline-env/--candidate-env: the flow gated in both")
    p.add_argument(
        "--minutes", type=float, default=15.0, help="with environments: time budget, shrinking included (default: 15)"
    )
    p.add_argument(
        "--programs",
        nargs="+",
        default=[],
        metavar="PATH",
        help="with environments: gate these repro files (or directories of them) instead of the "
        "findings and drawn programs",
    )
    p.add_argument(
        "--per-family",
        type=int,
        default=6,
        help="with environments: drawn programs per family after the recorded findings (default: 6)",
    )
    p.set_defaults(func=cmd_gate)
    return parser


def _apply_limits(items: list[str]) -> None:
    """--limit NAME=N: through ETPROP_LIMITS, so pytest rounds and workers see it too."""
    from etprop.program import limits

    merged = [part for part in os.environ.get("ETPROP_LIMITS", "").split(",") if part] + items
    os.environ["ETPROP_LIMITS"] = ",".join(merged)
    limits.current()


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "limit", None):
            _apply_limits(args.limit)
        if getattr(args, "flow_module", None):
            from etprop import flows

            for target in args.flow_module:
                flows.load_flow_module(target)
        return args.func(args)
    except UsageError as exc:
        print(f"etprop: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("etprop: interrupted; everything found so far is under the artifacts directory", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
