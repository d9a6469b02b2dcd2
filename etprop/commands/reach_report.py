"""The reach section of a campaign's reports: how much of the lowering code
its programs ran (etprop/lowering/reach.py), per component, over time, and
the largest functions it left unreached.

Built once per report from ARTIFACTS/reach/ (every process's meter data,
combined into ARTIFACTS/reach-combined.db); shards and other campaigns merge
through ``etprop coverage combine``.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from etprop.lowering import reach

# The report's plot: one colour per component, in COMPONENTS order.
_COLOURS = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#393b79",
    "#637939",
    "#8c6d31",
]


@dataclass
class ReachSection:
    components: dict = field(default_factory=dict)  # name -> reach.ComponentReach
    unreached: dict = field(default_factory=dict)  # name -> [(branches, function)]
    series: dict = field(default_factory=dict)  # name -> [(seconds, branch arcs)]
    measured: int = 0  # examples the meter measured
    examples: int = 0  # examples in the campaign
    every: int = 1  # one example in this many measured

    def text(self, functions: int = 3) -> list[str]:
        if not self.components:
            return []
        lines = [f"reach (branches of the lowering code run; {self._sampling()}):"]
        for name, counts in self.components.items():
            if not counts.branches:
                continue
            lines.append(
                f"  {name:24} branches {counts.branches_reached:5} / {counts.branches:<5} "
                f"({counts.branches_reached / counts.branches:4.0%}); lines {counts.lines_reached:5} / "
                f"{counts.lines:<5} ({counts.lines_reached / max(counts.lines, 1):4.0%})"
            )
            rows = self.unreached.get(name, [])[:functions]
            if rows:
                lines.append("    most unreached: " + "; ".join(f"{f} ({n})" for n, f in rows))
        return lines

    def _sampling(self) -> str:
        share = f"{self.measured} of {self.examples} examples measured"
        return share + (f", one in {self.every} sampled" if self.every > 1 else "")

    def markdown(self) -> list[str]:
        if not self.components:
            return []
        lines = [
            "",
            f"Reach: branches and lines of the lowering code run ({self._sampling()}).",
            "",
            "| component | branches reached | branches | lines reached | lines | most unreached functions |",
            "|---|---|---|---|---|---|",
        ]
        for name, counts in self.components.items():
            rows = "; ".join(f"`{f}` ({n})" for n, f in self.unreached.get(name, [])[:3])
            lines.append(
                f"| {name} | {counts.branches_reached} | {counts.branches} | {counts.lines_reached} | "
                f"{counts.lines} | {rows} |"
            )
        return lines

    def to_json(self) -> dict:
        return {
            "sampling": {"measured": self.measured, "examples": self.examples, "every": self.every},
            "components": {name: c.as_dict() for name, c in self.components.items()},
            "unreached_functions": {
                name: [{"function": f, "unreached_branches": n} for n, f in rows]
                for name, rows in self.unreached.items()
            },
            "over_time": {name: [list(point) for point in points] for name, points in self.series.items()},
        }

    def html(self) -> str:
        if not self.components:
            return ""
        esc = html.escape
        rows = "".join(
            f"<tr><td>{esc(name)}</td><td>{c.branches_reached} / {c.branches}</td>"
            f"<td>{c.lines_reached} / {c.lines}</td><td>"
            + "<br>".join(
                f'<code style="word-break:break-all">{esc(f)}</code> ({n})' for n, f in self.unreached.get(name, [])[:5]
            )
            + "</td></tr>"
            for name, c in self.components.items()
        )
        return (
            f"<h2>Reach: lowering code run</h2><p>{esc(self._sampling())}</p>{self.plot()}"
            "<table><tr><th>component</th><th>branches reached</th><th>lines reached</th>"
            f"<th>functions with the most unreached branches</th></tr>{rows}</table>"
        )

    def plot(self, width: int = 720, height: int = 320) -> str:
        """An SVG line plot: branch arcs reached against minutes, one line per component."""
        series = {name: points for name, points in self.series.items() if points and points[-1][1]}
        if not series:
            return "<p>No example was measured: no plot.</p>"
        left, bottom, top, right = 60, 40, 20, 220
        span_x = max(points[-1][0] for points in series.values()) / 60 or 1.0
        span_y = max(points[-1][1] for points in series.values()) or 1
        plot_w, plot_h = width - left - right, height - top - bottom

        def xy(seconds: float, arcs: int) -> str:
            return f"{left + seconds / 60 / span_x * plot_w:.1f},{top + plot_h - arcs / span_y * plot_h:.1f}"

        parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'role="img" aria-label="branch arcs reached over time" style="background:#fff">',
            f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#333"/>',
            f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#333"/>',
            f'<text x="{left + plot_w / 2}" y="{height - 8}" text-anchor="middle" font-size="12">'
            "minutes since the first example</text>",
            f'<text x="14" y="{top + plot_h / 2}" font-size="12" transform="rotate(-90 14 {top + plot_h / 2})" '
            'text-anchor="middle">branch arcs reached</text>',
        ]
        for fraction in (0.0, 0.5, 1.0):
            x, y = left + fraction * plot_w, top + plot_h - fraction * plot_h
            parts.append(
                f'<text x="{x:.0f}" y="{top + plot_h + 14}" font-size="10" text-anchor="middle">'
                f"{fraction * span_x:.1f}</text>"
            )
            parts.append(
                f'<text x="{left - 4}" y="{y + 3:.0f}" font-size="10" text-anchor="end">{fraction * span_y:.0f}</text>'
            )
        for index, (name, points) in enumerate(series.items()):
            colour = (
                _COLOURS[list(reach.COMPONENTS).index(name) % len(_COLOURS)]
                if name in reach.COMPONENTS
                else _COLOURS[index % len(_COLOURS)]
            )
            steps = [xy(0, 0)] + [xy(s, a) for s, a in points]
            parts.append(
                f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{" ".join(steps)}">'
                f"<title>{html.escape(name)}: {points[-1][1]}</title></polyline>"
            )
            y = top + 14 * index + 10
            parts.append(
                f'<rect x="{width - right + 10}" y="{y - 8}" width="10" height="10" fill="{colour}"/>'
                f'<text x="{width - right + 24}" y="{y + 1}" font-size="11">{html.escape(name)} '
                f"({points[-1][1]})</text>"
            )
        parts.append("</svg>")
        return "".join(parts)


def section(artifacts: Optional[Path], records: list[dict]) -> ReachSection:
    """The reach section of the campaign in ``artifacts`` (empty without meter data)."""
    if artifacts is None:
        return ReachSection()
    combined = reach.combine([Path(artifacts) / "reach"], Path(artifacts) / "reach-combined.db")
    if combined is None:
        return ReachSection()
    measured = reach.read(combined)
    every = _sampling(Path(artifacts))
    return ReachSection(
        measured.components,
        measured.functions,
        reach.over_time(combined, measured),
        sum(1 for r in records if "new_arcs" in r),
        len(records),
        every,
    )


def combined_section(directories: list[Path], into: Path) -> Optional[ReachSection]:
    """The reach of several campaigns together (their ARTIFACTS/reach/ data
    merged into ``into``, a reach folder itself), as one campaign's section; None without data."""
    folders = [d / "reach" if (d / "reach").is_dir() else d for d in directories]
    into.mkdir(parents=True, exist_ok=True)
    combined = reach.combine(folders, into / f"{reach.DATA_PREFIX}.merged")
    if combined is None:
        return None
    measured = reach.read(combined)
    return ReachSection(measured.components, measured.functions, reach.over_time(combined, measured))


def _sampling(artifacts: Path) -> int:
    try:
        return int((artifacts / "reach" / "every").read_text())
    except (OSError, ValueError):
        return 1
