"""Fuzzing campaigns: rounds of the properties under pytest (+ xdist), within a budget.

A campaign runs the property suite in rounds, each a pytest process with the
``fuzz`` Hypothesis profile, a seed derived from (shard, round, campaign
seed) so shards, rounds and campaigns run with another ``--seed`` explore
different programs (the same code and seed draw the same ones), and the shared example database, so a
failure found anywhere is replayed first everywhere. Rounds keep each pytest
process short-lived: a native crash or a hang costs one round, not the
campaign. The budget is checked between rounds and inside a round (examples
past the deadline are skipped); what still runs at the deadline is stopped
there, its example left pending on disk for ``etprop replay``. Results stream to
ARTIFACTS/results/*.jsonl; the summary and reports are built from them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from etprop import flows as flowreg
from etprop.commands.report import Summary, write_reports
from etprop.errors import UsageError
from etprop.strategies import coverage_corpus as coverage
from etprop.verdicts.outcomes import Outcome

# A time-budgeted round asks each property x flow item for this many examples
# (times its share): every round visits every item, so what each gets is set by
# the shares, not by the order items run in or which one fails first.
EXAMPLES_PER_ROUND = 1
# At most this share of the budget goes to shrinking and placing new failures.
TRIAGE_SHARE = 1 / 3
# Exploration stops starting examples, and triage shrink steps, this long
# before their deadlines (or a tenth of a shorter budget), so the work under
# way usually ends within the budget.
EXAMPLE_MARGIN_SECONDS = 60
# Whatever still runs this long before the end is stopped: the summary and
# reports are written inside the budget.
REPORT_SECONDS = 15
# With the reach meter on, the reports also combine and read its data
# (some 30 s for a 30-minute campaign here): the rounds stop that much earlier
# (a twentieth of a shorter budget).
REACH_REPORT_SECONDS = 45
# The reach meter (etprop/lowering/reach.py) measures one example in this many
# by default (benchmarks/reach_overhead.py measures what it costs).
REACH_EVERY = 3
# A progress line at least this often.
PROGRESS_SECONDS = 60


def run_until(command: list[str], until, env: dict | None = None) -> tuple[int | None, str]:
    """Run ``command`` and stop it with all its children (xdist workers, lowering
    workers) at ``until`` (a time, or a function giving it, asked again every
    second so the campaign can move it): its exit code and output, or None if
    it was stopped."""
    end = until if callable(until) else (lambda: until)
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    while True:
        try:
            output, _ = process.communicate(timeout=max(0.0, min(1.0, end() - time.time())))
            return process.returncode, output
        except subprocess.TimeoutExpired:
            if time.time() < end():
                continue
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            output, _ = process.communicate()
            return None, output


def properties_dir() -> Path:
    """Where the installed property modules are: located, not imported (they
    are pytest's to import, in its own process)."""
    found = importlib.util.find_spec("etprop.properties")
    if found is None or not found.submodule_search_locations:
        raise UsageError("etprop's property modules are not installed; reinstall etprop (pip install etprop)")
    return Path(found.submodule_search_locations[0])


def properties_command(seed: int, junit: Path) -> list[str]:
    """pytest over the installed property modules with their own configuration."""
    where = properties_dir()
    return [
        sys.executable,
        "-m",
        "pytest",
        str(where),
        "-c",
        str(where / "pytest.ini"),
        "--rootdir",
        str(where),
        "-q",
        "--no-header",
        "-p",
        "no:randomly",
        f"--etprop-seed={seed}",
        f"--junitxml={junit}",
        "-o",
        "junit_family=xunit2",
    ]


def campaign_exit_code(summary: Summary, internal_rounds: int) -> int:
    """3: no verdict to trust (nothing ran, a pytest round broke, etprop
    itself failed); 1: new failures (generator defects included); 0: clean."""
    internal = summary.count(Outcome.INTERNAL_ERROR)
    if summary.total_examples() == 0 or internal_rounds or internal:
        print(
            f"etprop fuzz: ERROR: {summary.total_examples()} examples ran, {internal_rounds} round(s) of "
            f"pytest broke, {internal} etprop internal error(s); the campaign's verdict cannot be trusted",
            file=sys.stderr,
        )
        return 3
    return 1 if summary.failures() else 0


def progress_line(summary: Summary, elapsed: float, budget: float) -> str:
    """One line of a campaign's progress: examples per flow, failures, rate, elapsed / budget."""
    per_flow: dict[str, int] = {}
    new = known = 0
    for record in summary.records:
        for flow in record["flows"]:
            per_flow[flow["flow"]] = per_flow.get(flow["flow"], 0) + 1
            if flow.get("known"):
                known += 1
            elif Outcome(flow["outcome"]).is_failure:
                new += 1
    rate = summary.total_examples() / max(elapsed / 60, 1e-9)
    flows = ", ".join(f"{name} {count}" for name, count in sorted(per_flow.items())) or "none yet"
    return (
        f"[{elapsed:5.0f}s / {budget:.0f}s] {summary.total_examples()} examples ({rate:.1f}/min); "
        f"flow results: {flows}; {new} new failing, {known} known-finding hits"
    )


class _Progress:
    """Prints ``progress_line`` every ``interval`` seconds while a campaign runs."""

    def __init__(self, artifacts: Path, started: float, budget: float, interval: float = PROGRESS_SECONDS):
        self.artifacts, self.started, self.budget, self.interval = artifacts, started, budget, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            print(progress_line(Summary.load(self.artifacts), time.time() - self.started, self.budget), flush=True)

    def __enter__(self) -> "_Progress":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class _RoundClock:
    """When a round stops. Exploration may use the whole budget until a
    failure waits for triage; from then on (checked every few seconds, inside
    a round too) it leaves the triage share, so a long round cannot starve
    shrinking. The exploration deadline goes to the round through a file its
    sessions read before each example."""

    CHECK_SECONDS = 5

    def __init__(self, path: Path, deadline: float, stop: float, margin: float, reserve: float, queued):
        self.path, self.deadline, self.stop, self.margin, self.reserve = path, deadline, stop, margin, reserve
        self.queued, self.reserved, self._checked = queued, False, 0.0
        self.explore_until = deadline
        self._check()

    def _check(self) -> None:
        self._checked = time.time()
        if not self.reserved and self.reserve and self.queued():
            self.reserved, self.explore_until = True, self.deadline - self.reserve
        written = self.path.with_suffix(".new")
        written.write_text(repr(self.explore_until - self.margin))
        written.replace(self.path)

    def round_end(self) -> float:
        if not self.reserved and time.time() - self._checked >= self.CHECK_SECONDS:
            self._check()
        return min(self.stop, self.explore_until)


def parse_shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise UsageError(f"--shard must look like i/N (e.g. 0/4), got '{text}'") from None
    if not 0 <= index < count:
        raise UsageError(f"--shard {text}: i must be in 0..N-1")
    return index, count


def round_seed(shard: tuple[int, int], round_index: int, seed: int = 0) -> int:
    key = f"etprop:{shard[0]}/{shard[1]}:{round_index}" + (f":{seed}" if seed else "")
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") % (2**63)


@dataclass
class Campaign:
    flows: list[str]
    minutes: float
    examples: int
    workers: int
    shard: tuple[int, int]
    artifacts: Path
    db: str = ""
    db_readonly: str = ""
    properties: str = ""
    flow_modules: list[str] = field(default_factory=list)
    shrink: bool = True
    seed: int = 0
    # The reach meter measures one example in this many (0: off).
    reach_every: int = REACH_EVERY

    @classmethod
    def from_args(cls, args) -> "Campaign":
        names = [n for n in args.flows.split(",") if n]
        chosen = [flowreg.get_available(n).name for n in names] or [f.name for f in flowreg.available_flows()]
        if args.workers < 1:
            raise UsageError("--workers must be at least 1")
        reach_every = REACH_EVERY if args.reach_every is None else args.reach_every
        if reach_every < 0:
            raise UsageError("--reach-every must be 0 (meter off) or more")
        seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
        return cls(
            chosen,
            args.minutes,
            args.examples,
            args.workers,
            parse_shard(args.shard),
            Path(args.artifacts),
            args.db,
            args.db_readonly,
            args.properties,
            args.flow_module,
            not args.no_shrink,
            seed,
            reach_every,
        )

    def _env(self, deadline_file: Path) -> dict:
        from etprop.verdicts.repro import atomic_write

        # What each item got so far: the round's order (pytest_plugin.pytest_collection_modifyitems).
        served = self.artifacts / "served.json"
        atomic_write(served, json.dumps(Summary.load(self.artifacts).served_per_item()))
        if self.reach_every:
            self._schedule()
        env = dict(os.environ)
        env.update(
            ETPROP_FLOWS=",".join(self.flows),
            ETPROP_ARTIFACTS=str(self.artifacts.resolve()),
            ETPROP_PROFILE="fuzz-noshrink",
            ETPROP_RECORD_ONLY="1",
            ETPROP_DEADLINE_FILE=str(deadline_file.resolve()),
            ETPROP_SERVED=str(served.resolve()),
            ETPROP_DB=self.db or str((self.artifacts / "hypothesis-db").resolve()),
            ETPROP_DB_READONLY=self.db_readonly,
            ETPROP_FLOW_MODULE=",".join(self.flow_modules),
            ETPROP_SHARD=f"{self.shard[0]}/{self.shard[1]}",
        )
        if self.reach_every:
            env.update(
                ETPROP_REACH_DIR=str((self.artifacts / "reach").resolve()),
                ETPROP_REACH_EVERY=str(self.reach_every),
                ETPROP_SCHEDULE=str((self.artifacts / "schedule.json").resolve()),
            )
        return env

    def _schedule(self) -> None:
        """Each item's share of the next round from the new lowering code it
        earned per CPU-second (etprop/commands/schedule.py), written for the
        round's plugin; the designed shares are those the last round collected."""
        from etprop.commands import schedule
        from etprop.verdicts.repro import atomic_write

        collected = self.artifacts / "collected.json"
        if not collected.is_file():
            return
        designed = json.loads(collected.read_text())
        scheduled = schedule.shares(Summary.load(self.artifacts).records, designed)
        atomic_write(
            self.artifacts / "schedule.json",
            json.dumps({item: share.as_dict() for item, share in scheduled.items()}, indent=1),
        )

    def _pytest_command(self, round_index: int, per_round: int, workers: int | None = None) -> list[str]:
        command = properties_command(
            round_seed(self.shard, round_index, self.seed), self.artifacts / "reports" / f"junit-round{round_index}.xml"
        )
        command += [f"--etprop-examples={per_round}", f"--etprop-round={round_index}"]
        workers = workers or self.workers
        if workers > 1:
            # Work stealing: a round's items are sorted by what they are owed,
            # and xdist's default hands each worker a consecutive block, so the
            # few long items would queue on one worker and the end of its
            # block would never start before the deadline.
            command += ["-n", str(workers), "--dist", "worksteal"]
        if self.properties:
            command += ["-k", self.properties]
        return command

    def _queued(self, summary: Summary) -> int:
        from etprop.commands.triage import Triage

        triage = Triage(self.artifacts)
        return len(triage.pending(triage.groups(summary.records)))

    def _triage(self, until: float, stop: float) -> None:
        """Shrink and place queued failure groups until ``until``: ``workers``
        processes, each taking the next unclaimed group until none is left,
        stopped at ``stop`` (the group under way stays queued)."""
        from etprop.commands.triage import Triage

        triage = Triage(self.artifacts)
        queued = len(triage.pending(triage.groups(Summary.load(self.artifacts).records)))
        if not queued:
            return
        command = [
            sys.executable,
            "-m",
            "etprop.commands.cli",
            "shrink",
            "--pending",
            "--artifacts",
            str(self.artifacts),
            "--until",
            str(until),
        ]
        for module in self.flow_modules:
            command += ["--flow-module", module]
        shrinkers = min(self.workers, queued)
        spare = self.workers - shrinkers
        shrunk = threading.Event()
        with ThreadPoolExecutor(shrinkers + bool(spare)) as pool:
            beside = pool.submit(self._explore_beside_triage, spare, until, shrunk) if spare else None
            outputs = list(pool.map(lambda _: run_until(command, stop)[1], range(shrinkers)))
            shrunk.set()
            if beside is not None:
                beside.result()
        for output in outputs:
            for line in output.splitlines():
                if line.startswith("triage "):
                    print("  " + line)

    def _explore_beside_triage(self, workers: int, until: float, shrunk: threading.Event) -> None:
        """An exploration round on the ``workers`` triage leaves idle (fewer
        groups queued than workers), until triage ends: shrinking one group
        must not leave the other cores waiting."""
        deadline_file = self.artifacts / "exploration-deadline-beside-triage"
        deadline_file.write_text(repr(until - self._margin))
        round_index, self._round = self._round, self._round + 1
        returncode, _ = run_until(
            self._pytest_command(round_index, EXAMPLES_PER_ROUND, workers),
            lambda: 0.0 if shrunk.is_set() else until,
            env=self._env(deadline_file),
        )
        if returncode not in (None, 0, 1, 5):
            self._internal_rounds += 1
        print(
            f"round {round_index} (beside triage, {workers} worker(s)): "
            + ("stopped when triage ended" if returncode is None else f"pytest exit {returncode}"),
            flush=True,
        )

    def _explore(self, clock_for, started: float) -> bool:
        """Rounds until the exploration deadline (``clock_for()`` gives each
        round its clock); False when the suite itself broke."""
        while True:
            summary = Summary.load(self.artifacts)
            clock = clock_for()
            # Past this, a round would skip every example it draws.
            if time.time() > clock.explore_until - clock.margin - 10:
                return True
            before, done = summary.total_examples(), summary.min_examples_per_cell()
            if self.examples and done >= self.examples:
                return True
            # A campaign counted in examples asks for what is missing at once.
            per_round = self.examples - done if self.examples else EXAMPLES_PER_ROUND
            returncode, output = run_until(
                self._pytest_command(self._round, per_round), clock.round_end, env=self._env(clock.path)
            )
            if returncode is None and clock.explore_until < clock.stop:
                status = "stopped to leave the triage share of the budget (the example under way is left pending)"
            elif returncode is None:
                status = "stopped at the end of the budget (the example under way is left pending)"
            else:
                status = {0: "passed", 1: "found failures", 5: "ran nothing"}.get(
                    returncode, f"pytest exit {returncode}"
                )
                if returncode not in (0, 1, 5):
                    self._internal_rounds += 1
                    print(output[-3000:])
            summary = Summary.load(self.artifacts)
            print(
                f"round {self._round}: {status}; " + progress_line(summary, time.time() - started, self.minutes * 60),
                flush=True,
            )
            self._round += 1
            if status == "found failures" and summary.total_examples() == before:
                # pytest failed without recording one example: the suite is broken, not a lowering.
                self._internal_rounds += 1
                print(output[-3000:])
                return False

    def run(self) -> int:
        sys.stdout.reconfigure(line_buffering=True)
        self.artifacts.mkdir(parents=True, exist_ok=True)
        started = time.time()
        deadline = started + self.minutes * 60
        stop = deadline - REPORT_SECONDS - (min(REACH_REPORT_SECONDS, self.minutes * 3) if self.reach_every else 0)
        margin = self._margin = min(EXAMPLE_MARGIN_SECONDS, self.minutes * 6)
        triage_budget, triage_spent = self.minutes * 60 * TRIAGE_SHARE, 0.0
        print(
            f"etprop fuzz: flows {', '.join(self.flows)}; budget {self.minutes:g} min"
            + (f" or {self.examples} examples per property x flow" if self.examples else "")
            + f"; {self.workers} worker(s); shard {self.shard[0]}/{self.shard[1]}; seed {self.seed} "
            f"(--seed {self.seed} draws these programs again); reach meter "
            + (f"on one example in {self.reach_every}" if self.reach_every else "off")
            + f"; artifacts {self.artifacts}"
        )
        if self.reach_every:
            (self.artifacts / "reach").mkdir(exist_ok=True)
            (self.artifacts / "reach" / "every").write_text(str(self.reach_every))
        self._round = self._internal_rounds = 0
        if not self.properties or "coverage" in self.properties:
            made = time.time()
            specs, wanted = coverage.stored(self.artifacts / "coverage")
            print(
                f"coverage corpus: {len(specs)} programs reaching {len(wanted)} combinations "
                f"({time.time() - made:.0f} s)"
            )

        def clock_for() -> _RoundClock:
            return _RoundClock(
                self.artifacts / "exploration-deadline",
                deadline,
                stop,
                margin,
                max(0.0, triage_budget - triage_spent) if self.shrink else 0.0,
                lambda: self._queued(Summary.load(self.artifacts)),
            )

        with _Progress(self.artifacts, started, self.minutes * 60):
            # Explore, then triage what was found; budget triage leaves (every
            # group shrunk early) goes back to exploring.
            while True:
                rounds_before = self._round
                healthy = self._explore(clock_for, started)
                # A shrink step or the run placing a defect may take a minute past
                # the time it starts: triage stops starting them that long before the end.
                triage_until = deadline - margin
                if not (
                    self.shrink
                    and time.time() < triage_until - 10
                    and triage_budget - triage_spent > 10
                    and self._queued(Summary.load(self.artifacts))
                ):
                    break
                began = time.time()
                self._triage(min(triage_until, began + triage_budget - triage_spent), stop)
                triage_spent += time.time() - began
                if not healthy or self._round == rounds_before:
                    break
        summary = Summary.load(self.artifacts)
        if self.shrink:
            print(f"triage: {triage_spent:.0f} s of {triage_budget:.0f} s allowed")
        print(summary.text())
        paths = write_reports(summary, self.artifacts / "reports")
        print("reports: " + ", ".join(str(p) for p in paths))
        return campaign_exit_code(summary, self._internal_rounds)
