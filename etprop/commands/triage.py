"""One defect, one report: a campaign's new failures grouped, shrunk, merged and placed.

Grouping. Every new failure (a flow result no finding explains) gets a
signature (etprop/verdicts/signature.py); failures with one signature form a
group, represented by its smallest program.

Shrinking. A group's representative is shrunk on the spec (the shrinker keeps
the signature, not merely the outcome) in a scratch directory, so shrinking
never adds examples to the campaign's results. Groups are taken most-hit first;
what a budget leaves is queued on disk, and ``etprop shrink --pending`` (or the
next campaign on the same artifacts) continues it.

Merging and placing. The shrunk spec is run once on every available flow:
which flows fail names the layer the defect belongs to (portable too: export,
EXIR or the portable kernels; a stock backend alone: that backend; a candidate
but not its baseline: the candidate), and every queued group whose signature
that run reproduces on its own flow is merged in (one defect seen through
several flows or properties). A shrunk spec equal to an earlier defect's after
canonical renaming merges into it. Once a group has its defect, a failure
counts as a hit of it only if its program holds every op of the defect's
minimal spec; the others cannot be that defect and form a group of their own,
so a second defect with the same message is not hidden behind the first.

On disk, per group, ARTIFACTS/defects/KEY/: ``claim`` (a worker is on it),
``progress.json`` (the smallest failing spec found so far, kept until the group is placed),
``shrunk.json`` and ``shrunk.py`` (the repro), ``defect.json`` (the verdicts
per flow, the layer, merged groups) and ``draft.md`` (an upstream issue draft).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from etprop.errors import UsageError
from etprop.program import spec as specmod
from etprop.verdicts import repro
from etprop.verdicts.check import Artifacts, load_records
from etprop.verdicts.outcomes import Outcome
from etprop.verdicts.signature import signature

# Failures that are not a lowering's defect: the suite's own errors, the
# generator's (a program torch.export rejects), and runs that disagreed.
NOT_TRIAGED = {Outcome.INTERNAL_ERROR.value, Outcome.EXPORT_ERROR.value, Outcome.NONDETERMINISTIC.value}
# A claim older than this is from a worker that died.
STALE_CLAIM_SECONDS = 3 * 3600


def _claim_is_stale(path: Path) -> bool:
    """A claim is stale when it is old, or when its worker ran on this host and
    is gone (a campaign stops its triage workers at the end of its budget)."""
    if time.time() - path.stat().st_mtime > STALE_CLAIM_SECONDS:
        return True
    pid, _, host = path.read_text().strip().partition(" ")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _short(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def canonical(spec: dict) -> str:
    """The spec with names given in order of appearance and seeds dropped:
    equal for one program however it was drawn."""
    spec = copy.deepcopy(spec)
    names: dict[str, str] = {}

    def rename(name):
        if name not in names:
            names[name] = f"n{len(names)}"
        return names[name]

    state = spec.get("state", {})
    for entry in state.values():
        entry.pop("seed", None)

    def body(b, params_key):
        for item in b.get(params_key, []):
            if isinstance(item, dict):
                item["name"] = rename(item["name"])
        if params_key == "params":
            b["params"] = [rename(p) for p in b["params"]]
        for node in b["nodes"]:
            node["args"] = [rename(a) for a in node.get("args", [])]
            for sub in node.get("bodies", ()):
                body(sub, "params")
            node["id"] = rename(node["id"])
            specmod.rename_state_refs(node, rename)
        b["outputs"] = [rename(o) for o in b["outputs"]]

    for method in spec["methods"].values():
        body(method, "inputs")
    spec["state"] = {names.get(name, name): entry for name, entry in state.items()}
    spec["methods"] = {f"m{i}": b for i, b in enumerate(spec["methods"].values())}
    return json.dumps(spec, sort_keys=True)


@dataclass
class Group:
    key: str
    signature: str
    flow: str
    outcome: str
    members: list[dict] = field(default_factory=list)

    @property
    def representative(self) -> dict:
        return min(self.members, key=lambda m: (m["nodes"], m["repro"]))

    def cells(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for member in self.members:
            cell = f"{member['property']} × {member['flow']}"
            counts[cell] = counts.get(cell, 0) + 1
        return counts


@dataclass
class Defect:
    key: str
    signature: str
    flow: str
    outcome: str
    property: str
    layer: str
    verdicts: dict
    ops: list
    nodes: int
    one_minimal: bool
    message: str
    merged: list = field(default_factory=list)
    reproduced: bool = True
    # Flows whose result on the minimal spec has this defect's signature.
    same_way: list = field(default_factory=list)
    # A recorded finding (one cause, or two) that explains the minimal program's
    # failure: the group is a hit of it, the shrunk program its evidence.
    known: str = ""

    def to_json(self) -> dict:
        return dict(self.__dict__)


class Triage:
    """The defects directory of one artifacts directory."""

    def __init__(self, artifacts: Path):
        self.artifacts = Path(artifacts)
        self.root = self.artifacts / "defects"

    def directory(self, key: str) -> Path:
        return self.root / key

    def defects(self) -> dict[str, Defect]:
        """Placed defects by key, one per defect (``_fold_duplicates``)."""
        found = {}
        for path in sorted(self.root.glob("*/defect.json")):
            try:
                found[path.parent.name] = Defect(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):
                continue
        return self._fold_duplicates(found)

    def _minimal_program(self, key: str) -> Optional[str]:
        try:
            return canonical(repro.read(self.directory(key) / "shrunk.json")["spec"])
        except (OSError, ValueError, KeyError, UsageError):
            return None

    def _fold_duplicates(self, found: dict[str, Defect]) -> dict[str, Defect]:
        """Two triage workers shrinking two groups of one defect at once each
        place it, before either can see the other's. A defect that another
        one lists as seen elsewhere, or whose minimal program equals another's,
        folds into it (between two such, the lower key keeps them)."""
        programs = {key: self._minimal_program(key) for key, defect in found.items() if defect.reproduced}
        for key in sorted(found):
            mine = found[key]
            for other_key, other in sorted(found.items()):
                if other_key == key or not other.reproduced:
                    continue
                listed = key in other.merged and (other_key not in mine.merged or other_key < key)
                same = (
                    programs.get(key) is not None and programs.get(key) == programs.get(other_key) and other_key < key
                )
                if listed or same:
                    other.merged = sorted(set(other.merged) | {key} | set(mine.merged) - {other_key})
                    del found[key]
                    break
        return found

    def groups(self, records: list[dict]) -> dict[str, Group]:
        defects = self.defects()
        merged = {key: d.key for d in defects.values() for key in d.merged if key not in defects}
        kept = Artifacts(self.artifacts)
        groups: dict[str, Group] = {}
        for record in records:
            for flow in record["flows"]:
                if not Outcome(flow["outcome"]).is_failure or flow.get("known") or flow["outcome"] in NOT_TRIAGED:
                    continue
                sig = flow.get("signature") or signature(flow["flow"], flow["outcome"], flow["message"])
                key, seen = _short(sig), set()
                while key not in seen:
                    seen.add(key)
                    key = merged.get(key, key)
                    defect = defects.get(key)
                    if defect is None or not defect.reproduced or set(defect.ops) <= set(record.get("ops", [])):
                        break
                    # Not that defect: a group of this signature's own.
                    key = _short(f"{sig} without {sorted(defect.ops)}")
                group = groups.setdefault(key, Group(key, sig, flow["flow"], flow["outcome"]))
                history = kept.history_path(record["property"], [f["flow"] for f in record["flows"]], record["digest"])
                group.members.append(
                    {
                        "property": record["property"],
                        "flow": flow["flow"],
                        "nodes": record.get("nodes", 0),
                        "message": flow["message"],
                        "repro": str(history),
                        "ops": record.get("ops", []),
                    }
                )
        return groups

    def pending(self, groups: dict[str, Group]) -> list[Group]:
        """Groups without a defect, most hits first (``groups`` already files
        merged groups under their defect)."""
        defects = self.defects()
        waiting = [g for key, g in groups.items() if key not in defects]
        return sorted(waiting, key=lambda g: (-len(g.members), g.key))

    def claim(self, key: str) -> bool:
        path = self.directory(key) / "claim"
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            if _claim_is_stale(path):
                path.unlink()
        except FileNotFoundError:
            pass
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        os.close(fd)
        return True

    def release(self, key: str) -> None:
        (self.directory(key) / "claim").unlink(missing_ok=True)

    def save(self, defect: Defect) -> None:
        repro.atomic_write(self.directory(defect.key) / "defect.json", json.dumps(defect.to_json(), indent=1))

    def merge(self, into: Defect, keys: list[str]) -> None:
        into.merged = sorted(set(into.merged) | set(keys))
        self.save(into)


def layer(failing: dict[str, str], flow_baselines: dict[str, Optional[str]]) -> str:
    """The layer a defect belongs to, from which flows fail on its minimal spec."""
    if "portable" in failing:
        return "export / EXIR / portable kernels (fails without any delegate)"
    places = set()
    for name in failing:
        base = flow_baselines.get(name)
        while base and base != "portable" and base in failing:
            name, base = base, flow_baselines.get(base)
        if base and base != "portable":
            places.add(f"candidate {name}")
        else:
            places.add(f"{name} backend")
    return " and ".join(sorted(places)) if places else "none of the flows fails on the minimal spec"


def draft(defect: Defect, spec: dict, script: str, versions: dict) -> str:
    """A markdown issue draft, pasteable upstream."""
    fails = ", ".join(f"`{flow}` ({defect.verdicts[flow]})" for flow in defect.same_way) or "none"
    otherwise = ", ".join(
        f"`{flow}` ({outcome})"
        for flow, outcome in sorted(defect.verdicts.items())
        if Outcome(outcome).is_failure and flow not in defect.same_way
    )
    passes = (
        ", ".join(f"`{flow}`" for flow, outcome in sorted(defect.verdicts.items()) if not Outcome(outcome).is_failure)
        or "none"
    )
    dtype = spec.get("dtype", "float32")
    ops = ", ".join(f"`{op}`" for op in defect.ops) or "no op"
    lines = [
        f"# {defect.layer}: {defect.outcome} on `{defect.flow}` with {ops} ({dtype})",
        "",
        "Versions: " + ", ".join(f"{name} {version}" for name, version in sorted(versions.items())),
        "",
        f"Fails this way on: {fails}."
        + (f" Fails otherwise on: {otherwise}." if otherwise else "")
        + f" Passes on: {passes}.",
        "",
        f"Minimal program: {defect.nodes} node(s)"
        + (
            ", 1-minimal (removing or simplifying any one part makes it pass)"
            if defect.one_minimal
            else ", not proven 1-minimal (the shrink budget ran out)"
        )
        + ".",
        "",
        "## Expected vs actual",
        "",
        "```",
        defect.message[:3000],
        "```",
        "",
        "## Script (torch and executorch only; exits 1 while the defect is present)",
        "",
        "```python",
        script.rstrip(),
        "```",
        "",
    ]
    return "\n".join(lines)


def _oracles_for(spec: dict) -> tuple[str, list]:
    from etprop.oracles.sets import MULTI_METHOD, SINGLE_FLOW

    return ("multi_method", MULTI_METHOD) if len(spec["methods"]) > 1 else ("mixed", SINGLE_FLOW)


class _GroupRun:
    """One group's shrinking: its representative repro, where progress is
    kept, and the test a candidate spec must pass to count as the same failure."""

    def __init__(self, triage: Triage, group: Group, session):
        from etprop import flows as flowreg
        from etprop.commands.replay import oracles_for

        self.group, self.session = group, session
        self.member = repro.read(group.representative["repro"])
        self.directory = triage.directory(group.key)
        self.progress = self.directory / "progress.json"
        self.start = repro.read(self.progress)["spec"] if self.progress.exists() else self.member["spec"]
        self.flows = [flowreg.get_available(name) for name in self.member["flows"]]
        self.oracles = oracles_for(self.member["property"])
        self.message = ""  # the failure's message on the last spec that kept it

    def same_failure(self, spec: dict) -> bool:
        """Whether ``spec`` fails on the group's flow with the group's
        signature. Attributed: a candidate that brings a known finding's cause
        back fails as that finding, not as this defect."""
        from etprop.lowering.pipeline import ExportFailed

        try:
            result = self.session.run(spec, self.flows, self.member["property"], self.oracles, attribute=True)
        except ExportFailed:
            return False
        for flow_result in result.results:
            if (
                flow_result.flow == self.group.flow
                and not flow_result.known
                and signature(flow_result.flow, flow_result.outcome.value, flow_result.message) == self.group.signature
            ):
                self.message = flow_result.message
                return True
        return False

    def keep_progress(self, shrunk) -> None:
        repro.write(
            self.progress,
            shrunk.spec,
            self.member["flows"],
            self.member["property"],
            self.group.outcome,
            self.message,
            script=False,
        )


def triage_group(
    triage: Triage,
    group: Group,
    session,
    deadline: Optional[float],
    log: Callable[[str], None] = print,
    max_checks: int = 400,
) -> Optional[Defect]:
    """Shrink one group and place it; None when the deadline came first (the
    progress is kept for the next run)."""
    from etprop.commands.shrink import shrink_to

    run = _GroupRun(triage, group, session)
    log(
        f"triage {group.key}: {group.signature} ({len(group.members)} hit(s)); "
        f"shrinking {specmod.count_ops(run.start)} nodes"
    )
    if not run.same_failure(run.start):
        return _save_not_recurring(triage, run)
    shrunk = shrink_to(
        run.start, run.same_failure, log=log, max_checks=max_checks, deadline=deadline, on_kept=run.keep_progress
    )
    if not shrunk.one_minimal and deadline is not None and time.time() > deadline:
        run.keep_progress(shrunk)
        log(f"triage {group.key}: budget spent at {specmod.count_ops(shrunk.spec)} nodes; queued")
        return None
    known = _known_when_shrunk(session, shrunk.spec, run.flows, run.member["property"], run.oracles, group.flow)
    if known:
        return _record_as_known(triage, group, run.member, shrunk.spec, shrunk, known, log)
    same = _defect_with_the_same_minimal_program(triage, group.key, shrunk.spec)
    if same is not None:
        log(f"triage {group.key}: the same minimal program as {same.key}; merged")
        triage.merge(same, [group.key])
        run.progress.unlink(missing_ok=True)
        return same
    verdicts, signatures = _place(session, shrunk.spec)
    return _save_placed(triage, run, shrunk, verdicts, signatures, log)


def _save_not_recurring(triage: Triage, run: _GroupRun) -> Defect:
    group = run.group
    defect = Defect(
        group.key,
        group.signature,
        group.flow,
        group.outcome,
        run.member["property"],
        "did not recur when run again",
        {},
        [],
        specmod.count_ops(run.start),
        False,
        run.member.get("message", ""),
        reproduced=False,
    )
    triage.save(defect)
    return defect


def _defect_with_the_same_minimal_program(triage: Triage, key: str, spec: dict) -> Optional[Defect]:
    """Another reproduced defect whose shrunk program is ``spec`` up to names."""
    mine = canonical(spec)
    for other in triage.defects().values():
        shrunk = triage.directory(other.key) / "shrunk.json"
        if other.key != key and other.reproduced and shrunk.exists() and canonical(repro.read(shrunk)["spec"]) == mine:
            return other
    return None


def _place(session, spec: dict) -> tuple[dict, dict]:
    """The minimal program on every available flow: each flow's outcome, and
    the signature of each failure."""
    from etprop import flows as flowreg
    from etprop.lowering.pipeline import ExportFailed

    everywhere = [flowreg.get(name) for name in session.available_flows()]
    layer_property, layer_oracles = _oracles_for(spec)
    try:
        placed = session.run(spec, everywhere, layer_property, layer_oracles)
    except ExportFailed:
        return {}, {}
    verdicts = {r.flow: r.outcome.value for r in placed.results}
    signatures = {r.flow: signature(r.flow, r.outcome.value, r.message) for r in placed.results if r.outcome.is_failure}
    return verdicts, signatures


def _save_placed(triage: Triage, run: _GroupRun, shrunk, verdicts: dict, signatures: dict, log) -> Defect:
    """The defect of a shrunk group, named by its layer: the flows that fail
    the same way; its minimal program, standalone script and draft report."""
    from etprop import flows as flowreg

    group, member, spec = run.group, run.member, shrunk.spec
    # The defect's own flow fails by its signature, judged by its property's oracles
    # (a differential failure needs its baseline beside it).
    verdicts[group.flow] = group.outcome
    # Another failure of the minimal program on some flow is another defect's business.
    kind = group.signature.split(" | ", 1)[1]
    same_way = sorted({group.flow} | {flow for flow, sig in signatures.items() if sig.split(" | ", 1)[1] == kind})
    baselines = {f.name: f.baseline for f in flowreg.all_flows()}
    defect = Defect(
        group.key,
        group.signature,
        group.flow,
        group.outcome,
        member["property"],
        layer({flow: verdicts[flow] for flow in same_way}, baselines),
        verdicts,
        sorted({node["op"] for _, node in specmod.all_nodes(spec)}),
        specmod.count_ops(spec),
        shrunk.one_minimal,
        run.message or member.get("message", ""),
        same_way=same_way,
    )
    shrunk_path = _write_shrunk(run.directory, spec, member, group, defect.message, shrunk)
    repro.atomic_write(
        run.directory / "draft.md", draft(defect, spec, shrunk_path.with_suffix(".py").read_text(), repro.versions())
    )
    seen_elsewhere = [key for key, sig in ((_short(s), s) for s in signatures.values()) if key != group.key]
    defect.merged = sorted(set(seen_elsewhere))
    triage.save(defect)
    run.progress.unlink(missing_ok=True)
    log(f"triage {group.key}: {defect.nodes} node(s), {defect.layer}; fails this way on {', '.join(same_way)}")
    return defect


def _write_shrunk(directory: Path, spec: dict, member: dict, group: Group, message: str, shrunk) -> Path:
    """The group's minimal program as ``shrunk.json`` (and its standalone script)."""
    return repro.write(
        directory / "shrunk.json",
        spec,
        member["flows"],
        member["property"],
        group.outcome,
        message,
        script_flow=group.flow,
        shrink=shrunk.facts(member["spec"]),
    )


def _known_when_shrunk(session, spec: dict, flows: list, prop: str, oracles: list, flow: str) -> str:
    """The recorded finding that explains the minimal program's failure on
    ``flow``, attributed afresh (one cause, or two): a failure first seen
    beside many causes shows what it really is once shrunk."""
    from etprop.lowering.pipeline import ExportFailed

    try:
        result = session.run(spec, flows, prop, oracles, attribute=True)
    except ExportFailed:
        return ""
    return next((r.known for r in result.results if r.flow == flow and r.outcome.is_failure and r.known), "")


def _record_as_known(
    triage: Triage, group: Group, member: dict, spec: dict, shrunk, known: str, log: Callable[[str], None]
) -> Defect:
    """A group whose minimal program a recorded finding explains: a hit of
    that finding, with the shrunk program kept as its evidence."""
    directory = triage.directory(group.key)
    defect = Defect(
        group.key,
        group.signature,
        group.flow,
        group.outcome,
        member["property"],
        f"known finding {known} (explains the shrunk program)",
        {group.flow: group.outcome},
        sorted({node["op"] for _, node in specmod.all_nodes(spec)}),
        specmod.count_ops(spec),
        shrunk.one_minimal,
        member.get("message", ""),
        same_way=[group.flow],
        known=known,
    )
    _write_shrunk(directory, spec, member, group, defect.message, shrunk)
    triage.save(defect)
    (directory / "progress.json").unlink(missing_ok=True)
    log(f"triage {group.key}: shrunk to {defect.nodes} node(s), explained by known finding {known}")
    return defect


def run_queue(
    artifacts: Path,
    deadline: Optional[float],
    flow_modules: Optional[list[str]] = None,
    log: Callable[[str], None] = print,
    max_groups: Optional[int] = None,
    max_checks: int = 400,
) -> int:
    """Triage queued groups until none is left, ``max_groups`` are done or the
    deadline passes; returns how many were finished."""
    from etprop.verdicts.session import Session

    triage = Triage(artifacts)
    done = 0
    with tempfile.TemporaryDirectory(prefix="etprop-triage-") as scratch:
        session = Session(Path(scratch), flow_modules=flow_modules)
        try:
            while max_groups is None or done < max_groups:
                if deadline is not None and time.time() > deadline:
                    break
                queue = triage.pending(triage.groups(load_records(artifacts)))
                group = next((g for g in queue if triage.claim(g.key)), None)
                if group is None:
                    break
                try:
                    finished = triage_group(triage, group, session, deadline, log, max_checks)
                finally:
                    triage.release(group.key)
                if finished is None:
                    break
                done += 1
        finally:
            session.close()
    return done
