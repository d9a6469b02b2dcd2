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
class Summary:
    records: list[dict] = field(default_factory=list)

    @classmethod
    def load(cls, artifacts: Path) -> "Summary":
        records = []
        for path in sorted((Path(artifacts) / "results").glob("*.jsonl")):
            for line in path.read_text().splitlines():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line cut by a killed process; the rest stays readable
        return cls(records)

    def cells(self) -> dict[tuple[str, str], Counter]:
        cells: dict[tuple[str, str], Counter] = defaultdict(Counter)
        for record in self.records:
            for flow in record["flows"]:
                label = flow["outcome"] + (f" (known {flow['known']})" if flow.get("known") else "")
                cells[(record["property"], flow["flow"])][label] += 1
        return dict(cells)

    def total_examples(self) -> int:
        return len(self.records)

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
                seen[key] = {"property": key[0], "flow": key[1], "outcome": key[2],
                             "message": flow["message"], "repro": record.get("repro")}
        return list(seen.values())

    def regressions(self) -> list[dict]:
        """Candidate (last flow) failures on programs where the baseline (first
        flow) did not fail the same way: what a gate fails on."""
        found = []
        for record in self.records:
            base, candidate = record["flows"][0], record["flows"][-1]
            if len(record["flows"]) < 2 or not Outcome(candidate["outcome"]).is_failure \
                    or candidate.get("known") or candidate["outcome"] == base["outcome"]:
                continue
            found.append({"property": record["property"], "flow": candidate["flow"], "outcome": candidate["outcome"],
                          "baseline": f"{base['flow']}: {base['outcome']}", "message": candidate["message"],
                          "repro": record.get("repro")})
        return found

    def count(self, outcome: Outcome, flow: str | None = None) -> int:
        """Flow results with ``outcome`` (on ``flow`` only, when given)."""
        return sum(1 for r in self.records for f in r["flows"]
                   if f["outcome"] == outcome.value and flow in (None, f["flow"]))

    def known_count(self) -> int:
        return sum(1 for r in self.records for f in r["flows"] if f.get("known"))

    def op_coverage(self) -> dict[str, Counter]:
        coverage: dict[str, Counter] = defaultdict(Counter)
        for record in self.records:
            for flow in record["flows"]:
                coverage[flow["flow"]].update(record.get("ops", []))
        return dict(coverage)

    def text(self) -> str:
        lines = ["", "summary (property x flow: outcomes)"]
        for (prop, flow), counts in sorted(self.cells().items()):
            outcome_text = ", ".join(f"{n} {o}" for o, n in counts.most_common())
            lines.append(f"  {prop:24} {flow:22} {sum(counts.values()):5} examples: {outcome_text}")
        failures = self.failures()
        lines.append(f"new failures: {len(failures)}")
        for failure in failures:
            lines.append(f"  {failure['property']} / {failure['flow']}: {failure['outcome']}: "
                         f"{failure['message'][:160]}")
            lines.append(f"    repro: {failure['repro']}")
        return "\n".join(lines)

    def markdown(self) -> str:
        lines = ["## etprop campaign", "", "| property | flow | examples | outcomes |", "|---|---|---|---|"]
        for (prop, flow), counts in sorted(self.cells().items()):
            outcome_text = ", ".join(f"{n} {o}" for o, n in counts.most_common())
            lines.append(f"| {prop} | `{flow}` | {sum(counts.values())} | {outcome_text} |")
        failures = self.failures()
        lines += ["", f"**New failures: {len(failures)}**", ""]
        for failure in failures:
            lines.append(f"- `{failure['flow']}` / {failure['property']}: **{failure['outcome']}**: "
                         f"{failure['message'][:200]} (repro: `{failure['repro']}`)")
        return "\n".join(lines) + "\n"

    def html(self) -> str:
        esc = html.escape
        def badges(counts: Counter) -> str:
            return "".join(f'<span class="o {esc(o.split()[0])}">{n} {esc(o)}</span>'
                           for o, n in counts.most_common())

        rows = "".join(
            f"<tr><td>{esc(prop)}</td><td><code>{esc(flow)}</code></td><td>{sum(c.values())}</td>"
            f"<td>{badges(c)}</td></tr>" for (prop, flow), c in sorted(self.cells().items()))
        coverage = self.op_coverage()
        all_ops = sorted({op for c in coverage.values() for op in c})
        cov_head = "".join(f"<th>{esc(flow)}</th>" for flow in sorted(coverage))
        cov_rows = "".join(
            f"<tr><td><code>{esc(op)}</code></td>"
            + "".join(f"<td class='{'hit' if coverage[f][op] else 'miss'}'>{coverage[f][op]}</td>"
                      for f in sorted(coverage)) + "</tr>" for op in all_ops)
        failures = "".join(
            f"<li><b>{esc(f['flow'])}</b> / {esc(f['property'])}: <b>{esc(f['outcome'])}</b> "
            f"<a href='{esc(str(f['repro'] or ''))}'>repro</a><pre>{esc(f['message'][:1500])}</pre></li>"
            for f in self.failures()) or "<li>none</li>"
        return f"""<!doctype html><html><head><meta charset="utf-8"><title>etprop campaign</title>
<style>body{{font-family:sans-serif;margin:2em;color:#222}}table{{border-collapse:collapse;margin-bottom:2em}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}th{{background:#eee}}
.o{{display:inline-block;margin-right:6px;padding:1px 6px;border-radius:4px;background:#fdd}}
.o.pass{{background:#cfc}}.o.unsupported{{background:#eee}}.hit{{background:#cfc}}.miss{{background:#fdd}}
pre{{background:#f6f6f6;padding:6px;white-space:pre-wrap}}</style></head><body>
<h1>etprop campaign</h1><p>{self.total_examples()} examples, {len(self.failures())} new failures,
{self.known_count()} hits on known defects.</p>
<h2>Outcomes per property and flow</h2><table><tr><th>property</th><th>flow</th><th>examples</th><th>outcomes</th></tr>{rows}</table>
<h2>Failures</h2><ul>{failures}</ul>
<h2>Op coverage (examples containing each op)</h2><table><tr><th>op</th>{cov_head}</tr>{cov_rows}</table>
</body></html>"""


def write_reports(summary: Summary, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / "summary.md", directory / "report.html"]
    atomic_write(paths[0], summary.markdown())
    atomic_write(paths[1], summary.html())
    return paths
