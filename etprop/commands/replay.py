"""Replaying repros: one file (``etprop repro``) or all of them (``etprop replay``).

A replay rebuilds the spec, lowers it with the recorded flows and runs the
recorded property's oracles, then compares the result with the recorded one:
still failing (the same outcome and defect), fixed, or changed (fails
differently). Replays run in the isolated worker like any example, so a repro
of a crash or a hang replays as a "crash" or "timeout" outcome instead of
taking the command down.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from etprop import flows
from etprop.errors import UsageError
from etprop.lowering.pipeline import ExportFailed
from etprop.verdicts import repro
from etprop.verdicts.known_findings import FINDINGS_DIR
from etprop.verdicts.outcomes import Outcome
from etprop.verdicts.session import Session
from etprop.verdicts.signature import signature

# The innermost function a signature names: a recorded finding's message is
# often its exception line alone, without the traceback that names it.
_IN_FUNCTION = re.compile(r" \(in [^)]*\)$")


@dataclass
class Replayed:
    path: Path
    recorded: str
    now: str
    message: str
    recorded_message: str = ""
    known: Optional[str] = None  # the recorded finding the failure is attributed to now

    @property
    def still_failing(self) -> bool:
        return Outcome(self.now).is_failure

    def _same_failure(self) -> bool:
        """Attributed to a recorded finding (its cause neutralized, the failure
        gone), or failing with the recorded message's signature."""
        if self.known or not self.recorded_message:
            return True
        loose = [
            _IN_FUNCTION.sub("", signature("", self.now, message)) for message in (self.recorded_message, self.message)
        ]
        return loose[0] == loose[1]

    @property
    def status(self) -> str:
        """Still failing means failing the same way: the recorded outcome, and
        the same defect (another library may fail the same program for another
        reason: that is "changed")."""
        if not self.still_failing:
            return "fixed" if self.recorded not in (None, "pending", "pass") else "passes"
        if self.recorded == "pending":
            return "still failing"
        return "still failing" if self.now == self.recorded and self._same_failure() else "changed"

    def line(self) -> str:
        """One line of ``etprop replay``; a changed failure says what it is now."""
        text = f"{self.status:14} {self.path}  (recorded: {self.recorded}, now: {self.now})"
        if self.status == "changed" and self.message:
            text += f": {self.message.splitlines()[0][:200]}"
        return text


def oracles_for(prop: str) -> list:
    from etprop.oracles.sets import ORACLES_BY_PROPERTY

    try:
        return ORACLES_BY_PROPERTY[prop]
    except KeyError:
        raise UsageError(
            f"repro names unknown property '{prop}'; known: {', '.join(sorted(ORACLES_BY_PROPERTY))}"
        ) from None


def replay_file(
    path: Path,
    artifacts: Path,
    verbose: bool = False,
    session: Optional[Session] = None,
    flow_modules: Optional[list[str]] = None,
) -> Replayed:
    return replay_record(repro.read(path), path, artifacts, verbose, session, flow_modules, checked=True)


def replay_record(
    record: dict,
    path,
    artifacts: Path,
    verbose: bool = False,
    session: Optional[Session] = None,
    flow_modules: Optional[list[str]] = None,
    checked: bool = False,
) -> Replayed:
    """Replay a repro record, checked like a file unless ``checked`` (it may come from anywhere)."""
    if not checked:
        repro.check_record(record, str(path))
    drift = repro.version_drift(record)
    if drift and verbose:
        print("note: made with other versions: " + "; ".join(drift))
    chosen = [flows.get_available(name) for name in record["flows"]]
    own = session is None
    session = session or Session(artifacts / "replay", flow_modules=flow_modules)
    try:
        result = session.run(
            record["spec"], chosen, record["property"], oracles_for(record["property"]), attribute=True
        )
    except ExportFailed as exc:
        # torch.export rejects the program: the generator's defect, still there.
        replayed = Replayed(
            path, record.get("outcome"), Outcome.EXPORT_ERROR.value, str(exc), record.get("message") or ""
        )
        if verbose:
            print(f"export error (torch.export rejects the program; no flow ran): {str(exc).splitlines()[0]}")
            print(f"verdict: {replayed.status} (recorded: {replayed.recorded}, now: {replayed.now})")
        return replayed
    finally:
        if own:
            session.close()
    worst = next((r for r in reversed(result.results) if r.outcome.is_failure), result.results[-1])
    replayed = Replayed(
        path, record.get("outcome"), worst.outcome.value, worst.message, record.get("message") or "", worst.known
    )
    if verbose:
        for flow_result in result.results:
            print(
                f"{flow_result.flow}: {flow_result.outcome.value}"
                + (f" (known finding {flow_result.known})" if flow_result.known else "")
            )
            for verdict in flow_result.verdicts:
                print(f"  {verdict}")
        for followup in result.followups:
            for flow_result in followup.new_failures:
                print(
                    f"with the known cause neutralized, {flow_result.flow} fails anew: "
                    f"{flow_result.outcome.value}: {flow_result.message[:300]} (repro: {followup.repro})"
                )
        print(f"verdict: {replayed.status} (recorded: {replayed.recorded}, now: {replayed.now})")
    return replayed


@dataclass
class ReplaySummary:
    replayed: list[Replayed]

    @property
    def still_failing(self) -> bool:
        return any(r.still_failing for r in self.replayed)


def _repro_files(paths: list[Path]) -> list[Path]:
    found = []
    for path in paths:
        if path.is_dir():
            found += sorted(p for p in path.rglob("*.json") if not p.name.startswith("."))
        elif path.exists():
            found.append(path)
    return [p for p in found if p.name != "index.json"]


def replay_all(artifacts: Path, paths: list[Path], flow_modules: Optional[list[str]] = None) -> ReplaySummary:
    paths = paths or [artifacts / "repros", artifacts / "pending", FINDINGS_DIR / "repros"]
    replayed = []
    session = Session(artifacts / "replay", flow_modules=flow_modules)
    try:
        for path in _repro_files(paths):
            try:
                result = replay_file(path, artifacts, session=session)
            except UsageError as exc:
                print(f"{path}: skipped: {exc}")
                continue
            replayed.append(result)
            print(result.line())
    finally:
        session.close()
    counts = {}
    for r in replayed:
        counts[r.status] = counts.get(r.status, 0) + 1
    print("replay: " + (", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "nothing to replay"))
    return ReplaySummary(replayed)
