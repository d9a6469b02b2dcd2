"""Finding power of a campaign: the share of semantic mutants its corpus kills
(a benchmark: it prints figures, asserts nothing).

A campaign keeps, per example, the spec and what each passing flow's runtime
returned (``ARTIFACTS/corpus/``). Each mutant of the catalogue
(etprop/program/semantic_mutants.py) changes one op's semantics in the eager
reference; it is killed, per program dtype, when some corpus program of that
dtype holding the op, with the lowered outputs left as they were, fails the
suite's own oracle (oracles/tolerance.judge) against the mutated reference.
No lowering runs. A mutant no program of the corpus can tell apart in
float64 is equivalent (reported, not counted); one no program holds is a
survivor "never drawn". Quantized programs and programs that write a buffer
in place are left out (their references are the converted program and a call
sequence).

    .venv/bin/python benchmarks/mutation_score.py --artifacts artifacts [--flows xnnpack] [--limit N]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch

from etprop.verdicts.mutation_score import load_corpus, score


def _why_it_survived(row: dict) -> tuple[str, str]:
    """(a short class, the sentence) for one surviving mutant."""
    if row["status"] != "never drawn":
        return "inside the bound", (
            f"changes the float64 result of some of {row['programs']} programs; no stored output fails"
        )
    if row.get("unbuilt"):
        return "variants do not build", (
            f"{row['held']} programs hold the op; in {row['unbuilt']} of the {row['programs']} in a form it "
            "changes, every variant fails to build (it changes a shape the rest of the program needs)"
        )
    if row["held"]:
        return "no form it changes", (
            f"{row['held']} programs hold the op, none in a form the mutant changes "
            "(the argument at its default, no twin operand or weight)"
        )
    return "op not held", "no corpus program holds the op"


def report(rows: list[dict], entries: list[dict], skipped: Counter, catalogue_size: int, command: str) -> None:
    counted = [r for r in rows if r["status"] != "equivalent"]
    killed = [r for r in counted if r["status"] == "killed"]
    print(
        f"\n{datetime.date.today()} · {platform.node()} ({platform.machine()}, {torch.get_num_threads()} threads)"
        f" · `{command}`"
    )
    print(
        f"corpus: {len(entries)} programs ({', '.join(f'{n} {why}' for why, n in skipped.items()) or 'none'}"
        f" left out); catalogue: {catalogue_size} mutants x {len({r['dtype'] for r in rows})} dtype(s), "
        f"{len(rows)} rows (an argument counted only in the dtypes the strategies draw it in)"
    )
    share = len(killed) / len(counted) if counted else 0.0
    print(
        f"killed {len(killed)} / {len(counted)} ({share:.1%}); equivalent (not counted): "
        f"{sum(r['status'] == 'equivalent' for r in rows)}"
    )
    if killed:
        print(
            f"until the first kill: median {statistics.median(r['examples'] for r in killed):g} examples, "
            f"{statistics.median(r['seconds'] for r in killed):.0f} s of campaign time"
        )
    for label, key in (
        ("op family", lambda r: r["mutant"].family),
        ("dtype", lambda r: r["dtype"]),
        ("mutant kind", lambda r: r["mutant"].kind),
    ):
        groups = defaultdict(list)
        for row in counted:
            groups[key(row)].append(row)
        print(f"\n| {label} | killed | total | share |\n|---|---|---|---|")
        for name, group in sorted(groups.items()):
            done = sum(r["status"] == "killed" for r in group)
            print(f"| {name} | {done} | {len(group)} | {done / len(group):.0%} |")
    survivors = [r for r in counted if r["status"] != "killed"]
    reached = [r for r in counted if r["status"] in ("killed", "survived")]
    print(
        f"\nof the mutants some corpus program could show (not equivalent, drawn): "
        f"{len(killed)} / {len(reached)} killed"
    )
    reasons = [(row, _why_it_survived(row)) for row in survivors]
    counts = Counter(short for _, (short, _) in reasons)
    print(f"\nsurvivors ({len(survivors)}): " + ", ".join(f"{n} {short}" for short, n in counts.most_common()))
    for row, (_, why) in reasons:
        print(f"- {row['mutant'].name} [{row['dtype']}]: {why}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", default="artifacts", help="a campaign's artifacts directory")
    parser.add_argument("--flows", default="", help="only these flows' outputs (comma-separated)")
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        help="at most N programs tried per mutant and dtype (of those in a form it changes)",
    )
    args = parser.parse_args()
    from etprop.program.semantic_mutants import catalogue

    artifacts = Path(args.artifacts)
    if not (artifacts / "corpus").is_dir():
        sys.exit(f"mutation_score: no corpus in {artifacts}/corpus; run a campaign first (bash ci/fuzz.sh)")
    entries, skipped = load_corpus(artifacts, set(filter(None, args.flows.split(","))) or None)
    mutants = catalogue()
    print(
        f"vocabulary: {len({m.op for m in mutants})} ops and layer types, {len(mutants)} semantic mutants; "
        f"corpus {len(entries)} programs"
    )
    started = time.time()
    rows = score(
        entries,
        mutants,
        args.limit,
        progress=lambda row: print(
            f"  {row['mutant'].name} [{row['dtype']}]: {row['status']}"
            + (
                f" by example {row['examples']} on {', '.join(row['flows'])}"
                if row["status"] == "killed"
                else f" ({row['held']} programs hold it, {row['programs']} in a form it changes)"
            ),
            flush=True,
        ),
    )
    report(rows, entries, skipped, len(mutants), "python " + " ".join(sys.argv))
    print(f"scored in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
