"""The half of a cross-environment gate that runs inside one Python environment.

``etprop gate --baseline-env PY --candidate-env PY`` starts ``PY -m
etprop.commands.env_worker`` in each environment. The worker lowers and runs
the specs the parent sends with that environment's torch, ExecuTorch and
backend packages (each example in the crash-isolated worker of
etprop/verdicts/session.py, failures attributed to known findings by
intervention, repros written under its own artifacts directory) and answers
in the plain format below, which the parent reads without importing anything
from the environment.

Protocol (one JSON object per line; ``format`` is ``FORMAT``):
- on start, the worker writes ``{"format", "ready": true, "versions", "flows",
  "runtimes"}`` (``flows``: every registered flow and why it is unavailable, ""
  if it is; ``runtimes``: what runs each flow's lowering);
- the parent writes ``{"id", "spec", "prop", "flow"[, "attribute"]}`` (``attribute``
  false: no attribution to known findings, for a packed program whose parts
  are judged on their own); the worker answers
  ``{"format", "id", "outcome", "known", "message", "oracles", "facts",
  "repro", "seconds"}``: the single-flow oracles run here (they read the
  lowering's objects); ``facts`` (size, delegate calls, ops left outside
  delegates) is what the parent's differential oracle compares. The parent
  shrinks a regression itself, with requests of this kind to both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

FORMAT = 2

# Each property's oracles minus the differential one: a worker lowers one
# flow, and the parent compares the two environments' facts.
SINGLE_FLOW_PROPERTY = {
    "differential": "mixed",
    "differential_quantized": "quantized",
    "differential_multi_method": "multi_method",
}


def versions() -> dict:
    """The library versions a verdict depends on (a missing package is None)."""
    import importlib.metadata
    import platform

    found = {"python": platform.python_version()}
    for package in ("etprop", "torch", "executorch", "torchao", "coreai-torch", "coreai-core"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def flow_reasons() -> dict:
    from etprop import flows

    reasons = {}
    for flow in flows.all_flows():
        try:
            reasons[flow.name] = flow.unavailable_reason() or ""
        except Exception as exc:  # a broken backend package: the flow is unavailable, and why
            reasons[flow.name] = f"{type(exc).__name__}: {exc}"
    return reasons


def run_one(session, request: dict) -> dict:
    from etprop import flows
    from etprop.lowering.pipeline import ExportFailed
    from etprop.verdicts.outcomes import Outcome

    started = time.perf_counter()
    from etprop.oracles.sets import ORACLES_BY_PROPERTY

    flow = flows.get(request["flow"])
    prop = SINGLE_FLOW_PROPERTY.get(request["prop"], request["prop"])
    answer = {
        "format": FORMAT,
        "id": request.get("id"),
        "flow": flow.name,
        "facts": {},
        "oracles": [],
        "repro": None,
        "known": None,
    }
    try:
        result = session.run(
            request["spec"], [flow], prop, ORACLES_BY_PROPERTY[prop], attribute=request.get("attribute", True)
        )
    except ExportFailed as exc:
        answer.update(outcome=Outcome.EXPORT_ERROR.value, message=f"does not export here: {exc}".splitlines()[0])
    else:
        flow_result = result.results[0]
        answer.update(
            outcome=flow_result.outcome.value,
            known=flow_result.known,
            message=flow_result.message,
            facts=flow_result.facts,
            pte_sha256=flow_result.pte_sha256,
            oracles=[{"oracle": v.oracle, "ok": v.ok, "message": str(v)} for v in flow_result.verdicts],
            repro=str(result.repro) if result.repro else None,
        )
    answer["seconds"] = round(time.perf_counter() - started, 3)
    return answer


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m etprop.commands.env_worker")
    parser.add_argument("--artifacts", required=True)
    parser.add_argument("--flow-module", action="append", default=[])
    args = parser.parse_args(argv)
    # stdout carries the protocol, on a descriptor of its own; file descriptor
    # 1 becomes stderr, so whatever else prints (this process, the isolated
    # workers it forks, native code) goes there.
    sys.stdout.flush()
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    from etprop import flows
    from etprop.verdicts.session import Session

    for module in args.flow_module:
        flows.load_flow_module(module)

    def send(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    send(
        {
            "format": FORMAT,
            "ready": True,
            "versions": versions(),
            "flows": flow_reasons(),
            "runtimes": {flow.name: flow.runtime for flow in flows.all_flows()},
        }
    )
    session = Session(Path(args.artifacts), flow_modules=args.flow_module)
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            request = json.loads(line)
            try:
                send(run_one(session, request))
            except Exception as exc:
                send({"format": FORMAT, "id": request.get("id"), "error": f"{type(exc).__name__}: {exc}"})
    finally:
        session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
