"""``etprop gate --baseline-env PY --candidate-env PY``: gate a change that is
another installation (an ExecuTorch build, a backend package release, an
outside partitioner package), not a flow of this process.

This process draws every program once and decides; each environment lowers
and runs the programs with its own libraries (etprop/commands/env_worker.py,
crash-isolated, single-flow oracles and attribution there) and answers in
plain data. The corpus runs in this order within the budget: the programs of
the findings recorded on the gated flows' backends, the coverage corpus, the
other findings' programs, then programs drawn from a fixed seed, family by
family.
Per program the candidate's result is compared with the baseline's as the
in-process gate compares them (etprop/commands/compare.py), then their
lowerings' facts by the differential oracle (size, delegate calls, ops left
outside delegates). Each kind of regression is shrunk by this process on
both environments: a smaller program is kept only when the gate still
judges it the same regression (the candidate fails as before, the baseline
still does not), and its repro is written in the candidate's artifacts.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from etprop.commands.compare import compare, improved
from etprop.commands.environments import Environment, EnvironmentFailed, OutOfTime
from etprop.errors import UsageError
from etprop.lowering import reach
from etprop.oracles import differential
from etprop.program import spec as specmod
from etprop.strategies import coverage_corpus as coverage
from etprop.strategies import model_zoo
from etprop.strategies.model_windows import real_model_windows
from etprop.verdicts.outcomes import Outcome
from etprop.verdicts.signature import signature

DEFAULT_MINUTES = 15.0
# Shrinking the regressions found gets what is left, and at least this share of the budget.
SHRINK_SHARE = 0.25
SHRINK_AT_MOST = 3
DEFAULT_PER_FAMILY = 6
PROGRESS_EVERY = 10
NOT_COVERED_SHOWN = 25


@dataclass
class Item:
    source: str  # "finding XNN-018" or "drawn mixed #3"
    prop: str
    spec: dict
    answers: dict = field(default_factory=dict)  # environment label -> worker answer
    # A packed coverage program: the programs it computes side by side, run
    # on their own where the packed one fails on either side.
    parts: list["Item"] = field(default_factory=list)


def _backend(flow: str) -> str:
    """The backend a flow lowers to: ``xnnpack+fold`` and ``xnnpack`` share one."""
    return flow.split("+")[0]


def _finding_items(flows: tuple[str, ...] = ()) -> tuple[list[Item], list[Item]]:
    """Recorded findings' programs: (those seen on the gated flows' backends,
    the others). Without ``flows`` every finding is relevant."""
    from etprop.verdicts import known_findings, repro

    backends = {_backend(flow) for flow in flows}
    relevant, others = [], []
    for finding in known_findings.load():
        if finding.repro.endswith(".json"):
            record = repro.read(finding.repro_path)
            item = Item(f"finding {finding.id}", record["property"], record["spec"])
            on_gated = not backends or any(_backend(flow) in backends for flow in finding.flows)
            (relevant if on_gated else others).append(item)
    return relevant, others


def program_items(paths: list[str]) -> list[Item]:
    """The programs of repro files (or directories of them) given by the user."""
    from etprop.verdicts import repro

    files = [f for p in paths for f in (sorted(Path(p).glob("*.json")) if Path(p).is_dir() else [Path(p)])]
    if not files:
        raise UsageError(f"--programs {' '.join(paths)}: no repro files (.json) there")
    items = []
    for path in files:
        record = repro.read(path)
        items.append(Item(f"program {path.name}", record["property"], record["spec"]))
    return items


def coverage_corpus(
    seed: int, pool_per_family: int = coverage.POOL_PER_FAMILY, pack_size: int = coverage.PACK_SIZE
) -> tuple[list[Item], set]:
    """The coverage corpus (strategies/coverage_corpus.py) as gate items, a
    packed program judged by its parts where it fails; and the combinations
    its pool reaches."""
    specs, wanted = coverage.chosen(seed, pool_per_family)
    items = []
    for program, group in coverage.packed(specs, pack_size):
        if len(group) == 1 and program is group[0]:
            items.append(Item(f"coverage #{len(items)}", coverage.family_of(program), program))
            continue
        parts = [
            Item(f"coverage #{len(items)} part {i}", coverage.family_of(spec), spec) for i, spec in enumerate(group)
        ]
        items.append(
            Item(
                f"coverage #{len(items)} ({len(group)} programs packed)",
                coverage.family_of(group[0]),
                program,
                parts=parts,
            )
        )
    return items, wanted


def corpus(
    seed: int, per_family: int, findings: bool = True, pack_size: int = coverage.PACK_SIZE, flows: tuple[str, ...] = ()
) -> tuple[list[Item], set]:
    """Recorded findings seen on the gated flows' backends first, then the
    coverage corpus, then the other findings (a Core AI finding's program says
    little about an XNNPACK change, and running it first would delay the
    coverage corpus), then ``per_family`` drawn programs of each family,
    interleaved so a short budget still reaches every family; and the
    combinations the coverage corpus aims at."""
    relevant, others = _finding_items(flows) if findings else ([], [])
    covering, wanted = coverage_corpus(seed, pack_size=pack_size)
    items = relevant + covering + others
    by_family = {name: coverage.drawn(strategy, per_family, seed + 1) for name, strategy in coverage.families().items()}
    if model_zoo.installed():  # drawn here; the environments only build the specs
        by_family["real_models"] = coverage.drawn(real_model_windows(), per_family, seed + 1)
    for index in range(per_family):
        for name, specs in by_family.items():
            if index < len(specs):
                items.append(Item(f"drawn {name} #{index}", name, specs[index]))
    return items, wanted


def _flow_record(answer: dict, label: str) -> dict:
    """The answer as the in-process comparison reads a flow result; named by
    its flow, which a message may name too (a crash does)."""
    return {
        "flow": answer.get("flow", label),
        "outcome": answer["outcome"],
        "known": answer.get("known"),
        "message": answer.get("message", ""),
    }


def judge(item: Item, baseline: str, candidate: str) -> Optional[dict]:
    """What the candidate environment did worse on this program, or None."""
    base, cand = item.answers[baseline], item.answers[candidate]
    record = {"property": item.prop, "flows": [_flow_record(base, baseline), _flow_record(cand, candidate)]}
    changed = compare(record)
    if changed:
        if cand["outcome"] == Outcome.EXPORT_ERROR.value:
            changed["kind"] = "does not build in the candidate environment"
        return dict(changed, outcome=cand["outcome"], message=cand.get("message", ""))
    if cand["outcome"] == Outcome.PASS.value and base.get("facts") and cand.get("facts"):
        structural = differential.compare_facts(base["facts"], cand["facts"])
        if not structural.ok:
            return {
                "kind": "structural regression",
                "why": "both pass; the candidate's lowering is worse",
                "outcome": Outcome.VIOLATION.value,
                "message": structural.message,
            }
    return None


def tally(items: list[Item], baseline: str, candidate: str) -> Counter:
    """Programs by what the candidate changed: passing, fixed, still failing
    (the same way), newly failing, changed failure."""
    counts: Counter = Counter()
    for item in items:
        base, cand = item.answers[baseline], item.answers[candidate]
        failing = [Outcome(a["outcome"]).is_failure or a["outcome"] == Outcome.UNSUPPORTED.value for a in (base, cand)]
        found = judge(item, baseline, candidate)
        if found:
            counts[found["kind"]] += 1
        elif failing == [True, False]:
            counts["fixed"] += 1
        elif failing == [True, True]:
            counts["still failing"] += 1
        else:
            counts["passing"] += 1
    return counts


def structural_changes(item: Item, baseline: str, candidate: str) -> dict:
    """Size, delegate calls and ops left outside delegates, where they changed:
    name -> (baseline, candidate, better)."""
    base, cand = item.answers[baseline].get("facts"), item.answers[candidate].get("facts")
    if not base or not cand:
        return {}
    changes = {}
    if abs(cand["pte_bytes"] - base["pte_bytes"]) > differential.SIZE_SLACK_BYTES:
        changes[".pte bytes"] = (base["pte_bytes"], cand["pte_bytes"], cand["pte_bytes"] < base["pte_bytes"])
    if cand["delegate_calls"] != base["delegate_calls"]:
        changes["delegate calls"] = (base["delegate_calls"], cand["delegate_calls"], None)
    left = (sum(base["portable_ops"].values()), sum(cand["portable_ops"].values()))
    if left[0] != left[1]:
        changes["ops outside delegates"] = (*left, left[1] < left[0])
    return changes


def structure_summary(items: list[Item], baseline: str, candidate: str) -> list[str]:
    """One line per structural fact: on how many programs it got better or
    worse, and by how much in total."""
    totals: dict = {}
    for item in items:
        for name, (before, after, better) in structural_changes(item, baseline, candidate).items():
            entry = totals.setdefault(name, {"better": 0, "worse": 0, "changed": 0, "before": 0, "after": 0})
            entry["better" if better else "worse" if better is False else "changed"] += 1
            entry["before"] += before
            entry["after"] += after
    lines = []
    for name, entry in totals.items():
        counts = ", ".join(f"{entry[k]} {k}" for k in ("better", "worse", "changed") if entry[k])
        lines.append(f"structure: {name}: {counts} ({entry['before']} -> {entry['after']} over those programs)")
    return lines


@dataclass
class CrossGate:
    baseline: Environment
    candidate: Environment
    baseline_flow: str
    candidate_flow: str
    minutes: float = DEFAULT_MINUTES
    items: list[Item] = field(default_factory=list)
    broken: dict = field(default_factory=dict)  # environment label -> why its worker failed
    started: float = field(default_factory=time.time)

    def _walk(self, environment: Environment, flow: str, until: float, items: list[Item]) -> None:
        for done, item in enumerate(items):
            if time.time() > until:
                print(f"  {environment.label}: budget reached after {done} of {len(items)} programs", flush=True)
                return
            if done and done % PROGRESS_EVERY == 0:
                print(f"  {environment.label}: {done} of {len(items)} programs", flush=True)
            # A packed program that fails here is run part by part at once,
            # not after the whole corpus, which the budget may not reach.
            for program in [item] + item.parts:
                if program is not item and Outcome(item.answers[environment.label]["outcome"]) is Outcome.PASS:
                    break
                if environment.label in program.answers:
                    continue
                try:
                    # A failing packed program is judged by its parts: attributing
                    # its failure (lowering it again per nominated cause) is wasted.
                    program.answers[environment.label] = environment.run(
                        program.spec, program.prop, flow, deadline=until, attribute=not program.parts
                    )
                except OutOfTime:
                    print(
                        f"  {environment.label}: budget reached during program {done + 1} of {len(items)} "
                        "(stopped; not compared)",
                        flush=True,
                    )
                    return
                except EnvironmentFailed as exc:
                    self.broken[environment.label] = str(exc).splitlines()[0]
                    return

    def _both(self, items: list[Item], until: float) -> None:
        walkers = [
            threading.Thread(target=self._walk, args=(env, flow, until, items))
            for env, flow in ((self.baseline, self.baseline_flow), (self.candidate, self.candidate_flow))
        ]
        for walker in walkers:
            walker.start()
        for walker in walkers:
            walker.join()

    def _answered(self, item: Item) -> bool:
        return self.baseline.label in item.answers and self.candidate.label in item.answers

    @property
    def deadline(self) -> float:
        return self.started + self.minutes * 60

    def run(self, started: float) -> None:
        """The corpus in both environments; then the parts of every packed
        program that failed on either side, each on its own, so a known
        failure in one part hides nothing in the others and a regression is
        narrowed to its part."""
        self.started = started
        until = started + self.minutes * 60 * (1 - SHRINK_SHARE)
        self._both(self.items, until)
        unpack = [
            part
            for item in self.items
            if item.parts
            and self._answered(item)
            and any(Outcome(a["outcome"]) is not Outcome.PASS for a in item.answers.values())
            for part in item.parts
            if not self._answered(part)
        ]
        if unpack:
            print(f"  running the {len(unpack)} parts of packed programs that failed on either side", flush=True)
            self._both(unpack, until)

    def compared(self) -> list[Item]:
        """Every program answered by both environments; a packed program
        whose parts all ran is replaced by them."""
        leaves = []
        for item in self.items:
            if (
                item.parts
                and all(self._answered(part) for part in item.parts)
                and any(Outcome(a["outcome"]) is not Outcome.PASS for a in item.answers.values())
            ):
                leaves += item.parts
            elif self._answered(item):
                leaves.append(item)
        return leaves


def _coverage(items: list[Item], wanted: set) -> tuple[list[str], set]:
    """What the compared programs covered, and what they did not: report
    lines, and the combinations reached."""
    from etprop.program import coverage_space
    from etprop.program.vocabulary import CONTROL_FLOW_OPS, OPS

    reached = set()
    for item in items:
        for spec in [part.spec for part in item.parts] or [item.spec]:
            reached |= coverage_space.keys(spec)
    ops = {key[0].split(">")[-1].split(":")[0] for key in reached}
    dtypes = sorted({key[3] for key in reached})
    lines = [
        f"covered: {len(ops)} ops, {len({k for k in reached if k[1]})} (op, argument value, dtype) "
        f"combinations, program dtypes {', '.join(dtypes)}"
    ]
    if wanted:
        lines.append(
            f"coverage corpus: {len(reached & wanted)} of the {len(wanted)} combinations its seeded pool reaches"
        )
        missed = Counter(f"{key[0]}{'.' + key[1] if key[1] else ''}" for key in wanted - reached)
        if missed:
            shown = ", ".join(f"{name} {n}" for name, n in missed.most_common(NOT_COVERED_SHOWN))
            more = len(missed) - NOT_COVERED_SHOWN
            lines.append(
                f"not covered (combinations by op and argument, most first): {shown}"
                + (f", and {more} more (coverage.json lists every combination)" if more > 0 else "")
            )
    never = sorted((set(OPS) | set(CONTROL_FLOW_OPS)) - {"layer"} - ops)
    if never:
        lines.append(f"ops never run: {', '.join(never)}")
    return lines, reached


SHRINK_CHECKS = 150


def regression_key(found: dict) -> str:
    """One kind of regression: its kind and its message's signature (how the
    report groups regressions and what shrinking keeps)."""
    return f"{found['kind']}: {signature('', found['outcome'], found['message'])}"


def shrink_regression(gate: CrossGate, item: Item, found: dict, log=lambda line: None) -> Item:
    """The smallest program found that is still this regression, judged by the
    gate's own rule on both environments: each step is lowered in the
    candidate environment and, where it fails there, in the baseline one, and
    kept only when the candidate still fails the same way and the baseline
    still does not. The item returned carries both environments' answers;
    the item itself when no smaller program is."""
    from etprop.commands.shrink import shrink_to

    key = regression_key(found)
    smallest = {"item": item}

    def still_regresses(spec: dict) -> bool:
        probe = Item(item.source, item.prop, spec)
        try:
            probe.answers[gate.candidate.label] = gate.candidate.run(
                spec, item.prop, gate.candidate_flow, deadline=gate.deadline
            )
            if Outcome(probe.answers[gate.candidate.label]["outcome"]) is Outcome.PASS:
                return False
            probe.answers[gate.baseline.label] = gate.baseline.run(
                spec, item.prop, gate.baseline_flow, deadline=gate.deadline
            )
        except (OutOfTime, EnvironmentFailed):
            return False
        again = judge(probe, gate.baseline.label, gate.candidate.label)
        if again and regression_key(again) == key:
            smallest["item"] = probe
            return True
        return False

    shrink_to(item.spec, still_regresses, log=log, max_checks=SHRINK_CHECKS, deadline=gate.deadline)
    return smallest["item"]


def _shrink(gate: CrossGate, item: Item, found: dict, lines: list[str]) -> None:
    from etprop.verdicts import repro

    shrunk = shrink_regression(gate, item, found)
    answer = shrunk.answers[gate.candidate.label]
    path = gate.candidate.artifacts / "gate-repros" / f"{specmod.digest(shrunk.spec)}.json"
    repro.write(
        path,
        shrunk.spec,
        [gate.candidate_flow],
        item.prop,
        answer["outcome"],
        answer.get("message", ""),
        script=False,
        shrink={"nodes_before": specmod.count_ops(item.spec), "nodes": specmod.count_ops(shrunk.spec)},
    )
    if shrunk is item:
        lines.append(
            f"    not shrunk (no smaller program is still this regression, or the budget ended); repro: {path}"
        )
        return
    on_baseline = shrunk.answers[gate.baseline.label]["outcome"]
    lines.append(
        f"    shrunk in the candidate environment to {specmod.count_ops(shrunk.spec)} node(s): {path} "
        f"(baseline environment on it: {on_baseline})"
    )


def run_cross_gate(args) -> int:
    started = time.time()
    artifacts = Path(args.artifacts)
    baseline_flow = args.baseline or args.flow
    candidate_flow = args.candidate or args.flow
    if not (baseline_flow and candidate_flow):
        raise UsageError(
            "name the flow to gate: --flow F (the same in both environments) or --baseline F --candidate G"
        )
    if artifacts.exists() and any(artifacts.iterdir()):
        raise UsageError(f"'{artifacts}' is not empty; give the gate a fresh --artifacts directory")
    # Each environment's workers meter the lowering code they run (etprop/lowering/reach.py):
    # `etprop coverage combine ARTIFACTS/baseline` reads what the gate reached there.
    baseline, candidate = (
        Environment(
            python,
            label,
            artifacts / label,
            tuple(args.flow_module),
            extra_env={reach.ENV: str((artifacts / label / "reach").resolve())},
        )
        for python, label in ((args.baseline_env, "baseline"), (args.candidate_env, "candidate"))
    )
    with baseline, candidate:
        return _gate(_GateRun(args, started, artifacts, baseline, candidate, baseline_flow, candidate_flow))


def _versions_line(env: Environment) -> str:
    return ", ".join(f"{name} {version}" for name, version in env.versions.items() if version)


@dataclass
class _GateRun:
    """One cross-environment gate: what it compares, and where its report goes."""

    args: Any
    started: float
    artifacts: Path
    baseline: Environment
    candidate: Environment
    baseline_flow: str
    candidate_flow: str
    header: list = field(default_factory=list)

    def __post_init__(self):
        self.header = [
            f"etprop gate: {self.baseline_flow} in {self.baseline.python} against {self.candidate_flow} in "
            f"{self.candidate.python}; budget {self.args.minutes:g} min, seed {self.args.seed}",
            f"  baseline environment: {_versions_line(self.baseline)}",
            f"  candidate environment: {_versions_line(self.candidate)}",
        ]

    def finish(self, verdict: str, code: int, body: list[str]) -> int:
        """Print what the header did not already print, write gate.md, return ``code``."""
        text = "\n".join(body + [verdict])
        printed = body[: len(self.header)] == self.header
        print("\n".join(body[len(self.header) :] + [verdict]) if printed else text)
        (self.artifacts / "gate.md").write_text("```\n" + text + "\n```\n")
        return code


def _gate(run: _GateRun) -> int:
    print("\n".join(run.header), flush=True)
    unavailable = _unavailable_verdict(run)
    if unavailable is not None:
        return unavailable
    items, wanted = _corpus_for(run)
    gate = CrossGate(run.baseline, run.candidate, run.baseline_flow, run.candidate_flow, run.args.minutes, items)
    gate.run(run.started)
    compared = gate.compared()
    body = list(run.header)
    body.extend(f"the {label} environment's worker failed: {why}" for label, why in gate.broken.items())
    if not compared:
        return run.finish("VERDICT: ERROR: no program ran in both environments", 3, body)
    base, cand = run.baseline.label, run.candidate.label
    regressions = [(item, found) for item in compared if (found := judge(item, base, cand))]
    improvements = [item for item in compared if _improved(item, base, cand)]
    sources = Counter(item.source.split(" ")[0] for item in compared)
    body.append(
        f"checked: {len(compared)} programs in both environments "
        f"({', '.join(f'{n} {kind}' for kind, n in sources.items())}; corpus of {len(gate.items)})"
    )
    body.append("per program: " + ", ".join(f"{n} {kind}" for kind, n in tally(compared, base, cand).items()))
    coverage_lines, reached = _coverage(compared, wanted)
    body.extend(coverage_lines)
    (run.artifacts / "coverage.json").write_text(
        json.dumps({"reached": sorted(reached), "not reached": sorted(wanted - reached)}, indent=1)
    )
    groups = _regression_groups(regressions)
    _report_regressions(gate, groups, body)
    body.extend(
        f"improvement: {item.source}: the candidate passes where the baseline {item.answers[base]['outcome']}"
        for item in improvements
    )
    body.extend(structure_summary(compared, base, cand))
    _write_answers(run.artifacts, gate)
    return _verdict(run, gate, compared, regressions, groups, improvements, body)


def _unavailable_verdict(run: _GateRun) -> Optional[int]:
    """The verdict when a flow cannot run in its environment (None when both can)."""
    missing = run.baseline.unavailable(run.baseline_flow)
    if missing:
        return run.finish(
            f"VERDICT: ERROR: {run.baseline_flow} cannot run in the baseline environment: {missing}", 3, run.header
        )
    missing = run.candidate.unavailable(run.candidate_flow)
    if missing:
        return run.finish(
            f"VERDICT: FAIL: {run.candidate_flow} runs in the baseline environment but not in the candidate "
            f"environment: {missing}",
            1,
            run.header,
        )
    return None


def _corpus_for(run: _GateRun) -> tuple[list, set]:
    """The user's programs, or the coverage corpus packed for the smaller runtime of the two."""
    if run.args.programs:
        return program_items(run.args.programs), set()
    pack_size = min(
        coverage.pack_size_for(env.runtimes.get(flow))
        for env, flow in ((run.baseline, run.baseline_flow), (run.candidate, run.candidate_flow))
    )
    return corpus(
        run.args.seed, run.args.per_family, pack_size=pack_size, flows=(run.baseline_flow, run.candidate_flow)
    )


def _improved(item, base: str, cand: str) -> bool:
    return improved({"flows": [_flow_record(item.answers[base], base), _flow_record(item.answers[cand], cand)]})


def _regression_groups(regressions: list) -> dict[str, list]:
    groups: dict[str, list] = {}
    for item, found in regressions:
        groups.setdefault(regression_key(found), []).append((item, found))
    return groups


def _report_regressions(gate: CrossGate, groups: dict[str, list], body: list[str]) -> None:
    """One line per kind of regression with its smallest program, then the
    first kinds' smallest programs shrunk in the candidate environment."""
    for members in groups.values():
        item, found = min(members, key=lambda pair: specmod.count_ops(pair[0].spec))
        first_line = found["message"].splitlines()[0] if found["message"] else found["outcome"]
        body.append(
            f"REGRESSION ({len(members)} program(s)): {found['kind']}: {found['outcome']}: "
            f"{first_line[:240]} ({found['why']})"
        )
        body.append(f"    e.g. {item.source}, {specmod.count_ops(item.spec)} node(s)")
    for key in list(groups)[:SHRINK_AT_MOST]:
        item, found = min(groups[key], key=lambda pair: specmod.count_ops(pair[0].spec))
        if found["kind"] != "structural regression":
            body.append(f"  shrinking: {key[:120]}")
            _shrink(gate, item, found, body)


def _write_answers(artifacts: Path, gate: CrossGate) -> None:
    (artifacts / "answers.jsonl").write_text(
        "".join(
            json.dumps({"source": i.source, "property": i.prop, "digest": specmod.digest(i.spec), "answers": i.answers})
            + "\n"
            for i in gate.items
        )
    )


def _verdict(run: _GateRun, gate, compared, regressions, groups, improvements, body) -> int:
    if groups:
        first = next(iter(groups.values()))[0][1]
        reason = f"{first['kind']}: {(first['message'].splitlines() or [first['outcome']])[0][:200]}"
        return run.finish(
            f"VERDICT: FAIL: {len(regressions)} program(s) regressed in the candidate environment, "
            f"{len(groups)} kind(s); " + (reason if len(groups) == 1 else f"first: {reason}"),
            1,
            body,
        )
    if gate.broken:
        return run.finish("VERDICT: ERROR: an environment's worker failed before the corpus was done", 3, body)
    return run.finish(
        f"VERDICT: PASS: no regression on {len(compared)} programs ({len(improvements)} improvement(s))", 0, body
    )
