"""Campaign summaries and reports, built from ARTIFACTS/results/*.jsonl.

Three renderings of one Summary: plain text (the terminal), markdown (a
pull-request comment) and a self-contained HTML page (outcome counts per flow
and property, op coverage per flow, failures with links to their repros).
JUnit XML comes from pytest itself (--junitxml), one file per round.
"""

from __future__ import annotations

import html
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from etprop.verdicts.outcomes import Outcome
from etprop.verdicts.repro import atomic_write


@dataclass
class DefectRow:
    """One defect (or one queued group, not yet shrunk) with what it was seen as."""

    title: str
    layer: str
    hits: int
    cells: dict
    repro: str
    draft: str = ""
    nodes: int = 0
    one_minimal: bool = False
    message: str = ""
    # The recorded finding its shrunk program turned out to be (triage.Defect.known).
    known: str = ""


@dataclass
class Summary:
    records: list[dict] = field(default_factory=list)
    artifacts: Path | None = None

    def defects(self) -> tuple[list[DefectRow], list[DefectRow]]:
        """(defects, queued groups), most hits first: the report's first section."""
        from etprop.commands.triage import Triage

        if self.artifacts is None:
            return [], []
        triage = Triage(self.artifacts)
        found = triage.defects()
        defects, queued = [], []
        for key, group in triage.groups(self.records).items():
            defect = found.get(key)
            if defect is None:
                queued.append(
                    DefectRow(
                        group.signature,
                        "not placed yet (queued)",
                        len(group.members),
                        group.cells(),
                        group.representative["repro"],
                        nodes=group.representative["nodes"],
                        message=group.representative["message"],
                    )
                )
                continue
            where = triage.directory(key)
            ops = ", ".join(defect.ops) or "-"
            title = (
                f"{defect.outcome} on {defect.flow} ({ops})"
                if defect.reproduced
                else f"{defect.outcome} on {defect.flow}: did not recur when run again"
            )
            defects.append(
                DefectRow(
                    title,
                    defect.layer,
                    len(group.members),
                    group.cells(),
                    str(where / "shrunk.json") if defect.reproduced else group.representative["repro"],
                    str(where / "draft.md") if defect.reproduced else "",
                    defect.nodes,
                    defect.one_minimal,
                    defect.message or group.representative["message"],
                    known=defect.known,
                )
            )
        order = lambda row: (row.layer, -row.hits, row.title)
        return sorted(defects, key=order), sorted(queued, key=order)

    @classmethod
    def load(cls, artifacts: Path) -> "Summary":
        from etprop.verdicts.check import load_records

        return cls(load_records(artifacts), Path(artifacts))

    def cells(self) -> dict[tuple[str, str], Counter]:
        cells: dict[tuple[str, str], Counter] = defaultdict(Counter)
        for record in self.records:
            for flow in record["flows"]:
                label = flow["outcome"] + (f" (known {flow['known']})" if flow.get("known") else "")
                cells[(record["property"], flow["flow"])][label] += 1
        return dict(cells)

    def quantization_cells(self) -> dict[tuple[str, str], Counter]:
        """Outcomes of quantized programs per (quantization scheme, flow)."""
        cells: dict[tuple[str, str], Counter] = defaultdict(Counter)
        for record in self.records:
            if record.get("quantization"):
                for flow in record["flows"]:
                    label = flow["outcome"] + (f" (known {flow['known']})" if flow.get("known") else "")
                    cells[(record["quantization"], flow["flow"])][label] += 1
        return dict(cells)

    def quantized_patterns(self) -> dict[tuple[str, str], tuple[int, int]]:
        """Per (flow, quantized pattern): GEMMs with a quantized weight inside a
        delegate, and in the programs, over the flow results where the
        delegation oracle ran (which Q/DQ patterns each flow fuses)."""
        totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        for record in self.records:
            for flow in record["flows"]:
                for pattern, (delegated, total) in (flow.get("quantized_patterns") or {}).items():
                    cell = totals[(flow["flow"], pattern)]
                    cell[0] += delegated
                    cell[1] += total
        return {cell: (delegated, total) for cell, (delegated, total) in totals.items()}

    def shares(self) -> dict[tuple[str, str], tuple[float, float]]:
        """Per property x flow: (designed, got) fractions of all flow results.
        Designed: the shares of the test items that report to the cell (each
        round asks an item for its share of examples); got: its flow results."""
        items: dict[tuple[str, str], dict] = defaultdict(dict)
        got: Counter = Counter()
        for record in self.records:
            for flow in record["flows"]:
                cell = (record["property"], flow["flow"])
                got[cell] += 1
                if record.get("item"):
                    items[cell][record["item"]] = record.get("share", 1)
        designed = {cell: sum(shares.values()) for cell, shares in items.items()}
        total_designed, total_got = sum(designed.values()) or 1, sum(got.values()) or 1
        return {cell: (designed.get(cell, 0) / total_designed, got[cell] / total_got) for cell in got}

    def item_shares(self) -> dict[str, tuple[float, float]]:
        """Per test item: (designed, got) fractions of all examples. Designed:
        the shares of every item the campaign collected (``collected.json``),
        so an item no round reached shows as got 0; items of older artifacts,
        from their results."""
        designed: dict[str, float] = {}
        collected = self.artifacts / "collected.json" if self.artifacts else None
        if collected and collected.is_file():
            designed.update(json.loads(collected.read_text()))
        got: Counter = Counter()
        for record in self.records:
            if record.get("item"):
                got[record["item"]] += 1
                designed.setdefault(record["item"], record.get("share", 1))
        total_designed, total_got = sum(designed.values()) or 1, sum(got.values()) or 1
        return {item: (share / total_designed, got[item] / total_got) for item, share in designed.items()}

    def least_served(self) -> tuple[str, float, list[str]] | None:
        """(item, got over designed, items never run) over every collected item
        with a designed share."""
        shares = {item: pair for item, pair in self.item_shares().items() if pair[0]}
        if not shares:
            return None
        item = min(shares, key=lambda name: (shares[name][1] / shares[name][0], name))
        never = sorted(name for name, (_, got) in shares.items() if not got)
        return item, shares[item][1] / shares[item][0], never

    def least_served_text(self) -> list[str]:
        least = self.least_served()
        if least is None:
            return []
        item, ratio, never = least
        lines = [f"least served item: {item}, {ratio:.2f} of its designed share"]
        if never:
            lines.append(f"items never run ({len(never)} of {len(self.item_shares())}): " + ", ".join(never))
        return lines

    def ops_per_lowering(self) -> dict[str, tuple[int, float]]:
        """Per property, and over all (``""``): flow results and the mean ops
        of the programs they lowered. A lowering costs a fixed second or so
        plus a little per op, so bigger programs buy more checking per second."""
        per: dict[str, list[int]] = defaultdict(list)
        for record in self.records:
            for _ in record["flows"]:
                per[record["property"]].append(record.get("nodes", 0))
                per[""].append(record.get("nodes", 0))
        return {prop: (len(sizes), sum(sizes) / len(sizes)) for prop, sizes in per.items()}

    def ops_text(self) -> str:
        sizes = self.ops_per_lowering()
        if not sizes:
            return ""
        count, mean = sizes.pop("")
        parts = ", ".join(f"{prop} {mean_ops:.1f}" for prop, (_, mean_ops) in sorted(sizes.items()))
        return f"ops per lowering: {mean:.1f} on average over {count} flow results ({parts})"

    def total_examples(self) -> int:
        return len(self.records)

    def served_per_item(self) -> dict[str, int]:
        """Examples judged per test item."""
        return dict(Counter(record["item"] for record in self.records if record.get("item")))

    def min_examples_per_cell(self) -> int:
        cells = self.cells()
        return min((sum(c.values()) for c in cells.values()), default=0)

    def failures(self) -> list[dict]:
        """New failures (not known findings): one per (property, flow, outcome), with a repro."""
        seen = {}
        for record in self.records:
            for flow in record["flows"]:
                if not Outcome(flow["outcome"]).is_failure or flow.get("known"):
                    continue
                key = (record["property"], flow["flow"], flow["outcome"])
                seen[key] = {
                    "property": key[0],
                    "flow": key[1],
                    "outcome": key[2],
                    "message": flow["message"],
                    "repro": record.get("repro"),
                }
        return list(seen.values())

    def regressions(self) -> list[dict]:
        """Programs where the candidate (last flow) did worse than the baseline
        (first flow): what a gate fails on (etprop/commands/compare.py)."""
        from etprop.commands.compare import compare

        found = []
        for record in self.records:
            change = compare(record)
            if change is None:
                continue
            base, candidate = record["flows"][0], record["flows"][-1]
            found.append(
                {
                    "property": record["property"],
                    "flow": candidate["flow"],
                    "outcome": candidate["outcome"],
                    "kind": change["kind"],
                    "why": change["why"],
                    "baseline": f"{base['flow']}: {base['outcome']}",
                    "message": candidate["message"],
                    "repro": record.get("repro"),
                }
            )
        return found

    def improvements(self) -> list[dict]:
        """Programs the baseline failed and the candidate passed."""
        from etprop.commands.compare import improved

        return [
            {
                "property": r["property"],
                "baseline": f"{r['flows'][0]['flow']}: {r['flows'][0]['outcome']}",
                "message": r["flows"][0]["message"],
            }
            for r in self.records
            if improved(r)
        ]

    def count(self, outcome: Outcome, flow: str | None = None) -> int:
        """Flow results with ``outcome`` (on ``flow`` only, when given)."""
        return sum(
            1 for r in self.records for f in r["flows"] if f["outcome"] == outcome.value and flow in (None, f["flow"])
        )

    def known_count(self) -> int:
        return sum(1 for r in self.records for f in r["flows"] if f.get("known"))

    def reach(self):
        """The reach section (etprop/commands/reach_report.py), read once per summary."""
        if getattr(self, "_reach", None) is None:
            from etprop.commands.reach_report import section

            self._reach = section(self.artifacts, self.records)
        return self._reach

    def attribution_counts(self) -> Counter:
        """Failures whose attribution ran, by how it ended (one cause, two
        causes, or only several together: new)."""
        return Counter(f["attribution"] for r in self.records for f in r["flows"] if f.get("attribution"))

    def attribution_text(self) -> str:
        counts = self.attribution_counts()
        if not counts:
            return ""
        total = sum(counts.values())
        several = total - counts.get("one cause", 0)
        return (
            f"attribution: {total} failing flow results attributed by intervention; more than one cause needed "
            f"in {several} ({several / total:.0%}): "
            + ", ".join(f"{n} {how}" for how, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        )

    def op_coverage(self) -> dict[str, Counter]:
        coverage: dict[str, Counter] = defaultdict(Counter)
        for record in self.records:
            for flow in record["flows"]:
                coverage[flow["flow"]].update(record.get("ops", []))
        return dict(coverage)

    def coverage(self) -> tuple[set[str], set[str]]:
        """The combinations (etprop/program/coverage_space.py) the campaign's
        programs reached, and those its coverage corpus's pool reaches (the
        drawable space the campaign stored in ``coverage/``; empty without one)."""
        reached = {key for record in self.records for key in record.get("coverage", [])}
        wanted: set[str] = set()
        if self.artifacts is not None:
            from etprop.program.coverage_space import key_text

            for path in sorted((self.artifacts / "coverage").glob("corpus-*.json"), key=lambda p: p.stat().st_mtime):
                try:
                    wanted = {key_text(tuple(key)) for key in json.loads(path.read_text())["wanted"]}
                except (OSError, ValueError, KeyError, TypeError):
                    continue
        return reached, wanted

    def coverage_rows(self) -> list[tuple[str, int, int]]:
        """(group, reached, in the drawable space) by kind of combination and by dtype."""
        from etprop.program.vocabulary import CONTROL_FLOW_OPS

        reached, wanted = self.coverage()
        space = wanted | reached

        def kind(key: str) -> str:
            if key.startswith("methods "):
                return "methods"
            if "=" in key:
                return "arguments"
            op = key.split(" ", 1)[0]
            return "control flow" if op.split(">")[-1] in CONTROL_FLOW_OPS else "ops"

        rows = []
        for label, group in (("kind", kind), ("dtype", lambda key: key[key.rindex("[") + 1 : -1])):
            for name in sorted({group(key) for key in space}):
                members = {key for key in space if group(key) == name}
                rows.append((f"{label}: {name}", len(members & reached), len(members)))
        return rows

    def coverage_text(self, shown: int = 20) -> list[str]:
        reached, wanted = self.coverage()
        if not reached:
            return []
        if wanted:
            lines = [
                f"coverage: {len(reached & wanted)} of the {len(wanted)} combinations (op, argument value, dtype) "
                f"the coverage corpus's pool reaches ({len(reached & wanted) / len(wanted):.0%})"
                + (f", and {len(reached - wanted)} outside it" if reached - wanted else "")
            ]
        else:
            lines = [f"coverage: {len(reached)} combinations (op, argument value, dtype); no coverage corpus stored"]
        lines += [f"  {group:42} {done:5} / {total}" for group, done, total in self.coverage_rows()]
        missing = sorted(wanted - reached)
        if missing:
            lines.append(
                f"  not reached ({min(shown, len(missing))} of {len(missing)}; all in coverage.json): "
                + "; ".join(missing[:shown])
            )
        return lines

    def _cells_text(self, row: DefectRow) -> str:
        return ", ".join(f"{cell} ({n})" for cell, n in sorted(row.cells.items(), key=lambda kv: -kv[1]))

    def headline(self) -> str:
        defects, queued = self.defects()
        known = [row for row in defects if row.known]
        new = [row for row in defects + queued if not row.known]
        failing = sum(row.hits for row in new)
        return (
            f"{self.total_examples()} examples; {failing} new failing flow results in "
            f"{len({c for row in new for c in row.cells})} property x flow cells: "
            f"{len(defects) - len(known)} defect(s) shrunk and placed, {len(queued)} failure group(s) queued; "
            f"{self.known_count() + sum(row.hits for row in known)} hits on known findings"
            + (f" ({sum(row.hits for row in known)} of them shown known only once shrunk)" if known else "")
        )

    def text(self) -> str:
        defects, queued = self.defects()
        lines = ["", self.headline()]
        if self.attribution_text():
            lines.append(self.attribution_text())
        if defects:
            lines.append("defects, by layer (hits: failing flow results; cells: property x flow where seen)")
        for row in defects:
            lines.append(
                f"  [{row.layer}] {row.title}: {row.hits} hit(s); {row.nodes} node(s)"
                + (", 1-minimal" if row.one_minimal else "")
            )
            lines.append(f"    seen in: {self._cells_text(row)}")
            lines.append(f"    repro: {row.repro}" + (f"  draft: {row.draft}" if row.draft else ""))
        if queued:
            lines.append(
                f"queued failure groups (not shrunk yet: etprop shrink --pending --artifacts {self.artifacts}):"
            )
        for row in queued:
            lines.append(f"  {row.title}: {row.hits} hit(s), smallest {row.nodes} node(s); repro: {row.repro}")
        shares = self.shares()
        lines += ["", "property x flow: outcomes (share of flow results: designed / got)"]
        for (prop, flow), counts in sorted(self.cells().items()):
            outcome_text = ", ".join(f"{n} {o}" for o, n in counts.most_common())
            designed, got = shares.get((prop, flow), (0.0, 0.0))
            lines.append(
                f"  {prop:24} {flow:22} {sum(counts.values()):5} examples ({designed:5.1%} / {got:5.1%}): "
                f"{outcome_text}"
            )
        short = [(got / designed, cell) for cell, (designed, got) in shares.items() if designed]
        if short:
            ratio, (prop, flow) = min(short)
            lines.append(f"  least served cell: {prop} x {flow}, {ratio:.2f} of its designed share")
        lines += [f"  {line}" for line in self.least_served_text()]
        if self.records:
            lines.append(self.ops_text())
        quantized = self.quantization_cells()
        if quantized:
            share = sum(1 for r in self.records if r.get("quantization"))
            lines += ["", f"quantized programs: {share} of {len(self.records)} examples; scheme x flow: outcomes"]
        for (scheme, flow), counts in sorted(quantized.items()):
            outcome_text = ", ".join(f"{n} {o}" for o, n in counts.most_common())
            lines.append(f"  {scheme:24} {flow:22} {sum(counts.values()):5} flow results: {outcome_text}")
        patterns = self.quantized_patterns()
        if patterns:
            lines += ["", "quantized GEMMs inside a delegate, per flow and pattern (Q/DQ fused / in the programs)"]
        for (flow, pattern), (delegated, total) in sorted(patterns.items()):
            lines.append(f"  {flow:22} {pattern:8} {delegated:5} / {total}")
        coverage = self.coverage_text()
        if coverage:
            lines += [""] + coverage
        reached = self.reach().text()
        if reached:
            lines += [""] + reached
        scheduled = self.schedule_text()
        if scheduled:
            lines += [""] + scheduled
        return "\n".join(lines)

    def schedule_text(self) -> list[str]:
        """The power schedule of the campaign's last round (schedule.json)."""
        from etprop.commands import schedule

        path = self.artifacts / "schedule.json" if self.artifacts else None
        if path is None or not path.is_file():
            return []
        try:
            entries = {item: schedule.ItemShare(**entry) for item, entry in json.loads(path.read_text()).items()}
        except (ValueError, TypeError):
            return []
        return schedule.text(entries)

    def markdown(self) -> str:
        defects, queued = self.defects()
        lines = ["## etprop campaign", "", self.headline(), ""]
        if self.attribution_text():
            lines[-1:] = ["", self.attribution_text(), ""]
        if defects or queued:
            lines += ["| layer | defect | hits | seen in | repro |", "|---|---|---|---|---|"]
        for row in defects:
            draft = f" ([draft]({row.draft}))" if row.draft else ""
            lines.append(
                f"| {row.layer} | {row.title}, {row.nodes} node(s){', 1-minimal' if row.one_minimal else ''} "
                f"| {row.hits} | {self._cells_text(row)} | `{row.repro}`{draft} |"
            )
        for row in queued:
            lines.append(f"| queued | `{row.title}` | {row.hits} | {self._cells_text(row)} | `{row.repro}` |")
        shares = self.shares()
        lines += ["", "| property | flow | examples | designed share | got | outcomes |", "|---|---|---|---|---|---|"]
        for (prop, flow), counts in sorted(self.cells().items()):
            outcome_text = ", ".join(f"{n} {o}" for o, n in counts.most_common())
            designed, got = shares.get((prop, flow), (0.0, 0.0))
            lines.append(
                f"| {prop} | `{flow}` | {sum(counts.values())} | {designed:.1%} | {got:.1%} | {outcome_text} |"
            )
        served = self.least_served_text()
        if served:
            lines += [""] + served
        if self.records:
            lines += ["", self.ops_text()]
        quantized = self.quantization_cells()
        if quantized:
            lines += ["", "| quantization scheme | flow | flow results | outcomes |", "|---|---|---|---|"]
        for (scheme, flow), counts in sorted(quantized.items()):
            outcome_text = ", ".join(f"{n} {o}" for o, n in counts.most_common())
            lines.append(f"| {scheme} | `{flow}` | {sum(counts.values())} | {outcome_text} |")
        patterns = self.quantized_patterns()
        if patterns:
            lines += ["", "| flow | quantized pattern | inside a delegate | in the programs |", "|---|---|---|---|"]
        for (flow, pattern), (delegated, total) in sorted(patterns.items()):
            lines.append(f"| `{flow}` | {pattern} | {delegated} | {total} |")
        rows = self.coverage_rows()
        if rows:
            lines += ["", "| coverage | reached | drawable |", "|---|---|---|"]
            lines += [f"| {group} | {done} | {total} |" for group, done, total in rows]
        lines += self.reach().markdown()
        return "\n".join(lines) + "\n"

    def html(self) -> str:
        esc = html.escape

        def badges(counts: Counter) -> str:
            return "".join(f'<span class="o {esc(o.split()[0])}">{n} {esc(o)}</span>' for o, n in counts.most_common())

        defects, queued = self.defects()
        defect_rows = (
            "".join(
                f"<tr><td>{esc(row.layer)}</td><td>{esc(row.title)}<br><small>{row.nodes} node(s)"
                f"{', 1-minimal' if row.one_minimal else ''}</small><pre>{esc(row.message[:1500])}</pre></td>"
                f"<td>{row.hits}</td>"
                f"<td>{esc(self._cells_text(row))}</td><td><a href='{esc(row.repro)}'>repro</a>"
                + (f" <a href='{esc(row.draft)}'>issue draft</a>" if row.draft else "")
                + "</td></tr>"
                for row in defects + queued
            )
            or "<tr><td colspan=5>none</td></tr>"
        )
        rows = "".join(
            f"<tr><td>{esc(prop)}</td><td><code>{esc(flow)}</code></td><td>{sum(c.values())}</td>"
            f"<td>{badges(c)}</td></tr>"
            for (prop, flow), c in sorted(self.cells().items())
        )
        quantized = "".join(
            f"<tr><td>{esc(scheme)}</td><td><code>{esc(flow)}</code></td><td>{sum(c.values())}</td>"
            f"<td>{badges(c)}</td></tr>"
            for (scheme, flow), c in sorted(self.quantization_cells().items())
        )
        quantized_table = (
            f"<h2>Quantized programs per scheme and flow</h2><table><tr><th>scheme</th><th>flow</th>"
            f"<th>flow results</th><th>outcomes</th></tr>{quantized}</table>"
            if quantized
            else ""
        )
        pattern_rows = "".join(
            f"<tr><td><code>{esc(flow)}</code></td><td>{esc(pattern)}</td><td>{delegated}</td><td>{total}</td></tr>"
            for (flow, pattern), (delegated, total) in sorted(self.quantized_patterns().items())
        )
        if pattern_rows:
            quantized_table += (
                "<h2>Quantized GEMMs inside a delegate</h2><table><tr><th>flow</th><th>pattern</th>"
                f"<th>inside a delegate</th><th>in the programs</th></tr>{pattern_rows}</table>"
            )
        coverage = self.op_coverage()
        all_ops = sorted({op for c in coverage.values() for op in c})
        cov_head = "".join(f"<th>{esc(flow)}</th>" for flow in sorted(coverage))
        cov_rows = "".join(
            f"<tr><td><code>{esc(op)}</code></td>"
            + "".join(
                f"<td class='{'hit' if coverage[f][op] else 'miss'}'>{coverage[f][op]}</td>" for f in sorted(coverage)
            )
            + "</tr>"
            for op in all_ops
        )
        return f"""<!doctype html><html><head><meta charset="utf-8"><title>etprop campaign</title>
<style>body{{font-family:sans-serif;margin:2em;color:#222}}table{{border-collapse:collapse;margin-bottom:2em}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}th{{background:#eee}}
.o{{display:inline-block;margin-right:6px;padding:1px 6px;border-radius:4px;background:#fdd}}
.o.pass{{background:#cfc}}.o.unsupported{{background:#eee}}.hit{{background:#cfc}}.miss{{background:#fdd}}
pre{{background:#f6f6f6;padding:6px;white-space:pre-wrap}}</style></head><body>
<h1>etprop campaign</h1><p>{esc(self.headline())}</p>
<h2>Defects</h2><table><tr><th>layer</th><th>defect</th><th>hits</th><th>seen in</th><th>files</th></tr>
{defect_rows}</table>
<h2>Outcomes per property and flow</h2>
<table><tr><th>property</th><th>flow</th><th>examples</th><th>outcomes</th></tr>{rows}</table>
{quantized_table}
{self.reach().html()}
<h2>Op coverage (examples containing each op)</h2><table><tr><th>op</th>{cov_head}</tr>{cov_rows}</table>
</body></html>"""


def write_reports(summary: Summary, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / "summary.md", directory / "report.html"]
    atomic_write(paths[0], summary.markdown())
    atomic_write(paths[1], summary.html())
    reached, wanted = summary.coverage()
    lowering = summary.reach().to_json() if summary.reach().components else None
    if reached or lowering:
        paths.append(directory / "coverage.json")
        atomic_write(
            paths[2],
            json.dumps(
                {
                    "reached": sorted(reached),
                    "not_reached": sorted(wanted - reached),
                    **({"reach": lowering} if lowering else {}),
                },
                indent=1,
            ),
        )
    return paths
