"""What a property talks to: check a spec on flows, fail with a useful message.

Examples run isolated in a warm worker process (etprop/lowering/isolation.py) unless
ETPROP_ISOLATION=0. A failure that looks like a recorded finding is attributed
to it only by intervention: the spec with every nominated cause neutralized is
run again; if the failure persists there, the neutralized spec is reported as a
new failure (the known cause cannot come back while it is shrunk). If it is
gone, the failure is known only when one finding's cause, neutralized alone,
makes it go (or two, each alone leaving a different failure the other
explains); otherwise it is new (Session._which). A new failure is confirmed once per failure class:
re-run in the same worker and in a fresh one; if the reruns disagree, the
example is reported as nondeterministic instead.
"""

from __future__ import annotations

import itertools
import os
import re
import time
from pathlib import Path
from typing import Optional

from hypothesis import assume, event, note, target
from hypothesis.control import currently_in_test_context

from etprop.lowering import stages
from etprop.lowering.isolation import Worker, WorkerDied, WorkerError
from etprop.lowering.pipeline import ExportFailed
from etprop.oracles import OracleFailure, Verdict
from etprop.program.spec import digest as specdigest
from etprop.verdicts import known_findings
from etprop.verdicts.check import (
    Artifacts,
    ExampleResult,
    FlowResult,
    Oracle,
    finish,
    run_example_by_name,
    run_example_measured,
)
from etprop.verdicts.outcomes import Outcome
from etprop.verdicts.signature import signature

WORKER_PRELOAD = ["etprop.verdicts.worker_preload"]
_FAILURE_TYPES: dict[Outcome, type] = {}


def failure_type(outcome: Outcome) -> type:
    """One exception class per outcome, so Hypothesis keeps a mismatch and a
    lowering error apart as distinct failures (and shrinks each separately)."""
    if outcome not in _FAILURE_TYPES:
        name = "".join(part.capitalize() for part in outcome.value.replace("-", " ").split()) + "Failure"
        _FAILURE_TYPES[outcome] = type(name, (OracleFailure,), {})
    return _FAILURE_TYPES[outcome]


# A campaign runs one drawn program in this many as drawn, so a fixed finding
# shows; the others with the known causes removed (_known_causes_removed).
AS_DRAWN_ONE_IN = 5


def _known_causes_removed(spec: dict, flows: list) -> dict:
    """Campaigns spend their budget on the unknown: a drawn program holding
    the cause of a finding recorded for its flows runs with that cause
    neutralized (known_findings.campaign_neutralization), except one program
    in AS_DRAWN_ONE_IN (chosen by its digest), which runs as drawn."""
    if int(specdigest(spec), 16) % AS_DRAWN_ONE_IN == 0:
        return spec
    rewritten, applied = known_findings.campaign_neutralization(spec, [flow.name for flow in flows])
    if applied:
        _label("known causes removed before running: " + ", ".join(applied))
    return rewritten


def _is_simplest_draw() -> bool:
    """Whether the example under way is Hypothesis's simplest (every choice at
    its simplest value). Hypothesis starts every test run with it, so in a
    campaign each item's first example of round 0 would be the same one-node
    program every campaign; False where Hypothesis does not expose its choices."""
    from hypothesis.control import _current_build_context

    context = _current_build_context.value
    nodes = getattr(getattr(context, "data", None), "nodes", None)
    try:
        return bool(nodes) and all(node.trivial for node in nodes)
    except AttributeError:
        return False


def _label(text: str) -> None:
    """A Hypothesis event when inside a Hypothesis test; nothing otherwise."""
    if currently_in_test_context():
        event(text)


def available_flow_names() -> list[str]:
    from etprop import flows

    return [flow.name for flow in flows.available_flows()]


def record_only() -> bool:
    """In a campaign a new failure is recorded, not raised (ETPROP_RECORD_ONLY=1)."""
    return os.environ.get("ETPROP_RECORD_ONLY", "0") == "1"


def _exploration_deadline() -> float | None:
    """When a campaign stops starting examples: read from the file it names in
    ETPROP_DEADLINE_FILE before each example, since the campaign moves it
    earlier once failures wait for triage."""
    path = os.environ.get("ETPROP_DEADLINE_FILE")
    if not path:
        return None
    try:
        return float(Path(path).read_text())
    except (OSError, ValueError):
        return None


def isolation_enabled() -> bool:
    return os.environ.get("ETPROP_ISOLATION", "1") != "0"


def _signature(result: ExampleResult) -> list[tuple]:
    """What must agree between identical runs: each flow's outcome. Not the
    .pte bytes: Core AI bundles carry a timestamp (finding COREAI-005)."""
    return [(r.flow, r.outcome) for r in result.results]


# How a failure's attribution ended (FlowResult.attribution), counted in a campaign's summary.
ONE_CAUSE, TWO_CAUSES, JOINT_ONLY = "one cause", "two causes", "several causes together only (new)"


def _persists(other: FlowResult, failure: FlowResult, found: list) -> bool:
    """Whether ``other`` (a run with some causes neutralized) still fails the
    way ``failure`` did: the same outcome, with a message some nominated finding matches."""
    return other.outcome is failure.outcome and any(re.search(f.pattern, other.message, re.S) for f in found)


_LOCATION = re.compile(r"method '([^']*)'.*?output (\d+)", re.S)
_WORST = re.compile(r"worst at \(([^)]*)\): eager ([^,]+), got ([^,;]+)")


def _failure_identity(result: FlowResult) -> tuple:
    """What tells two failures of one flow apart: the signature, and for a
    mismatch the method, the output and its worst element with both values (a
    signature keeps only the kind of difference)."""
    if result.outcome is not Outcome.MISMATCH:
        return (signature(result.flow, result.outcome.value, result.message),)
    place, worst = _LOCATION.search(result.message), _WORST.search(result.message)
    return (place.groups() if place else None, worst.groups() if worst else None)


def _acts(failure: FlowResult, without_first: FlowResult, without_second: FlowResult) -> bool:
    """Whether removing one of two causes changes what fails: then that cause
    acts, and the other acts if removing both clears what is left. A failure
    left unchanged by either removal is a third thing, not these two."""
    original = _failure_identity(failure)
    return original != _failure_identity(without_first) or original != _failure_identity(without_second)


def _explains(finding, left: FlowResult, neutralized_spec: dict) -> bool:
    """Whether ``finding`` is nominated for the failure ``left`` by a run of
    ``neutralized_spec`` (the pair rule of Session._which)."""
    return left.outcome.is_failure and any(
        f.id == finding.id
        for f in known_findings.nominate(left.flow, left.outcome.value, left.message, neutralized_spec)
    )


def _failed_everywhere(spec, names, prop, outcome: Outcome, oracle: str, message: str) -> ExampleResult:
    """The same failure for every flow: the program never reached a lowering."""
    results = [FlowResult(name, outcome, [Verdict.failed(oracle, message, outcome)]) for name in names]
    return ExampleResult(prop, spec, results)


class Session:
    def __init__(self, artifacts_dir: Path, isolated: bool | None = None, flow_modules: list[str] | None = None):
        self.artifacts = Artifacts(artifacts_dir)
        self.failed: set[tuple] = set()
        self.confirmed: set[tuple] = set()
        self.isolated = isolation_enabled() if isolated is None else isolated
        self.flow_modules = (
            flow_modules
            if flow_modules is not None
            else [m for m in os.environ.get("ETPROP_FLOW_MODULE", "").split(",") if m]
        )
        self._worker = Worker(self.flow_modules, WORKER_PRELOAD) if self.isolated else None
        self._judged: set[tuple] | None = None

    def already_judged(self, spec: dict, flows: list, prop: str) -> bool:
        """Whether this campaign already judged ``spec`` as drawn on these
        flows for this property (any round, any worker: ``judged/`` on disk;
        the result recorded may be of another program, a neutralized one).
        Each round's first example is Hypothesis's simplest program, and a
        round replays the examples the database keeps: judging them again
        would spend the budget on what is known."""
        import json

        folder = self.artifacts.root / "judged"
        if self._judged is None:
            self._judged = set()
            for path in folder.glob("*.jsonl"):
                for line in path.read_text().splitlines():
                    try:
                        self._judged.add(tuple(json.loads(line)))
                    except (ValueError, TypeError):
                        continue
        key = (prop, ",".join(f.name for f in flows), specdigest(spec))
        if key in self._judged:
            return True
        self._judged.add(key)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / self.artifacts.results_file.name, "a") as handle:
            handle.write(json.dumps(list(key)) + "\n")
        return False

    def available_flows(self) -> list[str]:
        """Flows available where examples run (the worker knows the entry
        points' flows and this session's flow modules, not every flow this
        process has registered)."""
        if self._worker is None:
            return available_flow_names()
        return self._worker.call(available_flow_names)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()

    def run(self, spec, flows, prop, oracles, attribute: bool = False) -> ExampleResult:
        """One run, recorded; no confirmation, no raising but ExportFailed. ``attribute``:
        attribute failures to known findings (replays do, and shrinks of a new failure,
        which must not drift to a known one)."""
        result = (self._attributed_run if attribute else self._run)(spec, flows, prop, oracles)
        self._finish(result, flows)
        return result

    def _attributed_run(self, spec, flows, prop, oracles) -> ExampleResult:
        """One run with its failures attributed. A program torch.export
        rejects fails export on every flow: known when a recorded finding's
        cause, neutralized, lets it export and run; otherwise recorded and
        raised (a generator defect, or a new one of torch)."""
        try:
            first = self._run(spec, flows, prop, oracles, record_export_failure=False)
        except ExportFailed as exc:
            first = _failed_everywhere(spec, [f.name for f in flows], prop, Outcome.EXPORT_ERROR, "generator", str(exc))
        result = self._attribute(spec, flows, prop, oracles, first)
        unexplained = [r for r in result.results if r.outcome is Outcome.EXPORT_ERROR and not r.known]
        if unexplained:
            self._finish(result, flows)
            raise ExportFailed(unexplained[0].message)
        return result

    def _finish(self, result: ExampleResult, flows) -> None:
        for example in [result] + result.followups:
            finish(example, [f.name for f in flows], self.artifacts)

    def _run(self, spec, flows, prop, oracles, worker=None, record_export_failure: bool = True) -> ExampleResult:
        """One run, not yet recorded (the pending file stays until ``finish``).
        An export failure is recorded as a generator defect unless
        ``record_export_failure`` is False (a spec etprop derived, not drew)."""
        names = [f.name for f in flows]
        try:
            if not self.isolated:
                return run_example_measured(spec, flows, prop, oracles, self.artifacts)
            worker = worker or self._worker
            try:
                return worker.call(
                    run_example_by_name,
                    spec=spec,
                    flow_names=names,
                    prop=prop,
                    oracles=oracles,
                    artifacts_root=str(self.artifacts.root),
                )
            except WorkerError as exc:
                if exc.type_name == "ExportFailed":
                    raise ExportFailed(str(exc)) from None
                raise RuntimeError(f"etprop itself failed in the worker: {exc}\n{exc.formatted}") from None
            except WorkerDied as died:
                return self._died(spec, names, prop, died)
        except ExportFailed as exc:
            if record_export_failure:
                self._record_all(spec, names, prop, Outcome.EXPORT_ERROR, "generator", str(exc))
            raise
        except RuntimeError as exc:
            self._record_all(spec, names, prop, Outcome.INTERNAL_ERROR, "etprop", str(exc))
            raise

    def _record_all(self, spec, names, prop, outcome: Outcome, oracle: str, message: str) -> None:
        """A verdict for no flow (the program never reached a lowering): recorded, with its repro."""
        finish(_failed_everywhere(spec, names, prop, outcome, oracle, message), names, self.artifacts)

    def _died(self, spec, names, prop, died: WorkerDied) -> ExampleResult:
        """The worker died in one flow's stage: that flow crashed (or timed out);
        the others have no verdict (their oracles never finished), so they are
        "not run", never a pass."""
        outcome = Outcome.CRASH if died.kind == "crash" else Outcome.TIMEOUT
        message = f"{died.kind}: {died.detail} in {stages.describe(died.stage)}"
        culprit = died.stage.get("flow") or names[-1]
        results = [
            FlowResult(name, outcome, [Verdict.failed("isolation", message, outcome)])
            if name == culprit
            else FlowResult(
                name,
                Outcome.NOT_RUN,
                [Verdict.failed("isolation", f"not run: the worker died ({message})", Outcome.NOT_RUN)],
            )
            for name in names
        ]
        return ExampleResult(prop, spec, results)

    def _attribute(self, spec, flows, prop, oracles, result: ExampleResult, depth: int = 0) -> ExampleResult:
        """Attribute failures to nominated findings by neutralizing their causes.

        A failure that persists the same way (same outcome, a nominated
        pattern) on the neutralized spec is new, and the neutralized run is the
        result (its repro cannot bring the known cause back). A failure that is
        gone, or has turned into another one, is known; another failure of the
        neutralized spec that no finding explains is kept as a follow-up
        example, recorded and reported on its own."""
        nominated = {
            r.flow: known_findings.nominate(r.flow, r.outcome.value, r.message, spec)
            for r in result.results
            if r.outcome.is_failure
        }
        nominated = {flow: found for flow, found in nominated.items() if found}
        findings = list({f.id: f for found in nominated.values() for f in found}.values())
        if not findings or depth > 2:
            return result
        neutral, changed = known_findings.neutralized(spec, findings)
        if not changed:
            return result
        _label("attribution: neutralized " + ", ".join(f.id for f in findings))
        try:
            again = self._attribute(
                neutral,
                flows,
                prop,
                oracles,
                self._run(neutral, flows, prop, oracles, record_export_failure=False),
                depth + 1,
            )
        except ExportFailed:
            # The neutralization made a program torch.export rejects: no
            # evidence either way, so the failure stays unattributed (new).
            _label("attribution: the neutralized spec does not export")
            self.artifacts.pending_path(neutral, prop).unlink(missing_ok=True)
            return result
        alone_runs: dict = {}
        for index, flow_result in enumerate(result.results):
            found = nominated.get(flow_result.flow)
            if not found:
                continue
            other = again.results[index]
            if not other.known and _persists(other, flow_result, found):
                self.artifacts.pending_path(spec, prop).unlink(missing_ok=True)
                return again
            flow_result.known = self._which(spec, flows, prop, oracles, index, flow_result, found, alone_runs, again)
        # What the neutralized run's own attribution left after neutralizing
        # a further cause: recorded one level down only, so lift it here.
        nested, again.followups = again.followups, []
        if again.new_failures:
            result.followups.append(again)
        else:
            # Not an example of its own, but a program that ran: what passed
            # serves mutation analysis like any other corpus program.
            self.artifacts.keep_in_corpus(again)
            self.artifacts.pending_path(neutral, prop).unlink(missing_ok=True)
        result.followups.extend(nested)
        return result

    def _which(
        self, spec, flows, prop, oracles, index: int, failure, found: list, alone_runs: dict, joint: ExampleResult
    ) -> Optional[str]:
        """Which nominated finding explains a failure that their causes,
        neutralized together (``joint``), made go; None when neither one nor
        two of them do, and the failure is new.

        Known means one cause: the first finding, most specific first, whose
        cause alone makes the failure go (each try lowers the program again;
        ``alone_runs`` keeps each single neutralization's run for the
        example's other flows). Two findings ("A+B") only when each alone
        leaves a failure that the other explains (nominated for it, and gone
        with both causes removed), and removing one of them changes what
        fails (``_acts``). Many rewrites at once change so much of a program
        that almost any failure goes, so a joint disappearance alone explains
        nothing."""
        ordered = sorted(found, key=lambda f: f.specificity, reverse=True)
        left: dict = {}
        for finding in ordered:
            if len(found) == 1:
                run = joint
            else:
                if finding.id not in alone_runs:
                    alone_runs[finding.id] = self._run_alone(spec, flows, prop, oracles, [finding], joint)
                run = alone_runs[finding.id]
            if run is None:
                continue
            other = run.results[index]
            if not _persists(other, failure, found):
                failure.attribution = ONE_CAUSE
                return finding.id
            left[finding.id] = (other, run.spec)
        for first, second in itertools.combinations(ordered, 2):
            if not (
                first.id in left
                and second.id in left
                and _acts(failure, left[first.id][0], left[second.id][0])
                and _explains(second, *left[first.id])
                and _explains(first, *left[second.id])
            ):
                continue
            key = "+".join(sorted((first.id, second.id)))
            if key not in alone_runs:
                alone_runs[key] = (
                    joint if len(found) == 2 else self._run_alone(spec, flows, prop, oracles, [first, second], joint)
                )
            if alone_runs[key] is None:
                continue
            both = alone_runs[key].results[index]
            if not any(_persists(both, gone, found) for gone in (failure, left[first.id][0], left[second.id][0])):
                failure.attribution = TWO_CAUSES
                return f"{first.id}+{second.id}"
        failure.attribution = JOINT_ONLY
        _label(f"attribution: {len(found)} causes explain it only together: new")
        return None

    def _run_alone(
        self, spec, flows, prop, oracles, findings: list, joint: Optional[ExampleResult]
    ) -> ExampleResult | None:
        """The example with these findings' causes (one, or a pair) neutralized;
        None when that changes nothing or makes a program torch.export rejects.
        When the other nominated causes' rewrites changed nothing, the program
        is the joint one, whose run (``joint``) serves: a lowering is
        deterministic, and its pending file may be a follow-up's."""
        alone, changed = known_findings.neutralized(spec, findings)
        if not changed:
            return None
        if joint is not None and alone == joint.spec:
            return joint
        try:
            return self._run(alone, flows, prop, oracles, record_export_failure=False)
        except ExportFailed:
            return None
        finally:
            self.artifacts.pending_path(alone, prop).unlink(missing_ok=True)

    def _confirm(self, spec, flows, prop, oracles, first: ExampleResult) -> ExampleResult:
        """Re-run a new failure class in the same worker and a fresh one."""
        key = (prop, tuple(f.name for f in flows), tuple(r.outcome for r in first.results))
        if key in self.confirmed or not self.isolated:
            return first
        self.confirmed.add(key)
        again = self._run(spec, flows, prop, oracles)
        fresh_worker = Worker(self.flow_modules, WORKER_PRELOAD)
        try:
            fresh = self._run(spec, flows, prop, oracles, worker=fresh_worker)
        finally:
            fresh_worker.close()
        signatures = {tuple(_signature(r)) for r in (first, again, fresh)}
        if len(signatures) == 1:
            return first
        outcomes = " / ".join(
            ", ".join(f"{r.flow}: {r.outcome.value}" for r in run.results) for run in (first, again, fresh)
        )
        results = [
            FlowResult(
                r.flow,
                Outcome.NONDETERMINISTIC,
                [
                    Verdict.failed(
                        "determinism",
                        f"identical runs disagree (first / same process / fresh process): {outcomes}",
                        Outcome.NONDETERMINISTIC,
                    )
                ],
            )
            for r in first.results
        ]
        return ExampleResult(prop, spec, results)

    def check(self, spec: dict, flows: list, prop: str, oracles: list[Oracle]) -> ExampleResult | None:
        deadline = _exploration_deadline()
        key = (prop, tuple(f.name for f in flows))
        # Past the budget, new exploration stops; a property that has failed in
        # this process keeps running so Hypothesis can finish shrinking it.
        if deadline is not None and time.time() > deadline and key not in self.failed:
            _label("not run: past the campaign's budget")
            return None
        if record_only() and currently_in_test_context():
            if _is_simplest_draw():
                _label("skipped: Hypothesis's simplest example")
                assume(False)
            spec = _known_causes_removed(spec, flows)
        if record_only() and currently_in_test_context() and self.already_judged(spec, flows, prop):
            _label("skipped: already judged in this campaign")
            assume(False)
        result = self._attributed_run(spec, flows, prop, oracles)
        if result.new_failures:
            result = self._confirm(result.spec, flows, prop, oracles, result)
        # A follow-up (a new failure of the neutralized spec) is confirmed like
        # any other; one that does not recur stays recorded as nondeterministic
        # (never retried away), but only a confirmed one fails the property.
        result.followups = [
            self._confirm(f.spec, flows, prop, oracles, f) if f.new_failures else f for f in result.followups
        ]
        self._finish(result, flows)
        if result.reach and currently_in_test_context():
            # Hypothesis's targeted phase climbs toward programs that reach
            # lowering code the process had not reached (etprop/lowering/reach.py).
            target(float(sum(result.reach["new_arcs"].values())), label="new lowering arcs")
        for flow_result in result.results:
            _label(
                f"{flow_result.flow}: {flow_result.outcome.value}"
                + (f" (known {flow_result.known})" if flow_result.known else "")
            )
        failures = result.new_failures or [
            r
            for followup in result.followups
            for r in followup.new_failures
            if r.outcome is not Outcome.NONDETERMINISTIC
        ]
        if failures:
            self.failed.add(key)
            first = failures[0]
            if currently_in_test_context():
                note("repro written to " + str(result.repro or next(f.repro for f in result.followups if f.repro)))
            if record_only():
                # A campaign: recorded; the property explores on, and the
                # campaign's triage shrinks and merges what was found. Each
                # signature is a target of its own, so the example database
                # keeps the smallest example of each and other shards replay it.
                if currently_in_test_context():
                    for label in {signature(f.flow, f.outcome.value, f.message) for f in failures}:
                        target(1.0, label="etprop failure: " + label)
                _label(f"new failure recorded: {first.flow}: {first.outcome.value}")
                return result
            failed = next(v for v in first.verdicts if not v.ok)
            raise failure_type(first.outcome)(failed) from None
        return result
