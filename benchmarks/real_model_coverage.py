"""How much of real architectures the spec vocabulary can express (a
benchmark: it prints figures, asserts nothing).

Exports every recipe of ``etprop.strategies.model_zoo`` and classifies each
ATen node occurrence of its graph (``etprop.strategies.model_windows``):
expressed, computed from parameters only, integer and indexing, or not
expressed. Printed per model and per kind, weighted by frequency:

- vision: expressed share of all ATen occurrences;
- text and speech: expressed share of the float dataflow (all occurrences but
  integer and indexing ones), the integer and indexing share beside it;
- the ops not expressed, most frequent first: the vocabulary's to-do list.

    .venv/bin/python benchmarks/real_model_coverage.py [MODEL ...]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from collections import Counter

INTEGER = "integer and indexing"
PARAMETERS = "parameters only"
EXPRESSED = "expressed"


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="recipe names (default: every installed one)")
    args = parser.parse_args(argv)
    from etprop.strategies import model_windows, model_zoo

    names = args.models or model_zoo.installed()
    if not names:
        print(f"real_model_coverage: no model library installed: {model_zoo.INSTALL_HINT}", file=sys.stderr)
        return 2
    started = time.monotonic()
    per_kind: dict[str, Counter] = {}
    missing: Counter = Counter()
    print("| model | kind | ATen ops | expressed | parameters only | integer and indexing | not expressed |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        recipe = model_zoo.BY_NAME[name]
        classes = model_windows.model_graph(name).classes
        total = sum(classes.values())
        not_expressed = {key.split(": ", 1)[1]: n for key, n in classes.items() if key.startswith("not expressed")}
        missing.update(not_expressed)
        per_kind.setdefault(recipe.kind, Counter()).update(classes)
        print(
            f"| {name} | {recipe.kind} | {total} | {_share(classes[EXPRESSED], total)} | "
            f"{classes[PARAMETERS]} | {classes[INTEGER]} | "
            f"{', '.join(f'{op} {n}' for op, n in sorted(not_expressed.items(), key=lambda i: -i[1])) or '-'} |"
        )
    print("\n| kind | ATen ops | expressed of all | expressed of float dataflow | integer and indexing |")
    print("|---|---|---|---|---|")
    for kind, classes in per_kind.items():
        total = sum(classes.values())
        dataflow = total - classes[INTEGER]
        print(
            f"| {kind} | {total} | {_share(classes[EXPRESSED], total)} | {_share(classes[EXPRESSED], dataflow)} | "
            f"{_share(classes[INTEGER], total)} |"
        )
    print(
        "\nnot expressed, most frequent first: " + (", ".join(f"{op} {n}" for op, n in missing.most_common()) or "none")
    )
    print(
        f"\n{datetime.date.today()} · {platform.node()} ({platform.machine()}) · "
        f"`python benchmarks/real_model_coverage.py{' ' + ' '.join(args.models) if args.models else ''}` · "
        f"{time.monotonic() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
