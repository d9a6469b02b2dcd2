"""Mutation analysis of the system under test: small faults planted in
ExecuTorch's own lowering code, and whether a campaign's programs expose them.

Mutants are generated, not picked: mutmut's libcst operators (a comparison or
boolean flipped, a constant or string changed, an argument dropped, an
assignment to None, a unary operator removed, ``break``/``continue`` and
``is``/``in`` swapped, ...) plus a statement deleted, over every file of the
chosen components of the reach meter (etprop/lowering/reach.py). A mutant
runs in a layered environment whose only change is the mutated module,
loaded in place of the installed one (etprop/lowering/shadow.py); the
installed package is never edited.

Which programs a mutant runs: the stored campaign programs whose measured
example reached the mutated line (the meter's per-example contexts), each on
the flow it ran on, until one kills it. Killed: any verdict differs from the
unmutated lowering of the same program on the same flow (outcome, any
oracle's verdict, the lowering's structural facts). Equivalent: every covering
program gives the same ``.pte`` bytes and the same outcome. Not covered: no
stored program reached the line.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

from etprop.errors import UsageError
from etprop.lowering import reach

KILLED, SURVIVED, EQUIVALENT, NOT_COVERED = "killed", "survived", "equivalent", "not covered"

# What each mutated node's type means, for the survivors' list.
_KINDS = {
    "ComparisonTarget": "comparison flipped",
    "BooleanOperation": "boolean flipped",
    "UnaryOperation": "unary operator removed",
    "Integer": "constant changed",
    "Float": "constant changed",
    "SimpleString": "string changed",
    "ConcatenatedString": "string changed",
    "FormattedString": "string changed",
    "Assign": "assigned None",
    "AnnAssign": "assigned None",
    "AugAssign": "augmented assignment made plain",
    "Call": "argument dropped or swapped",
    "Name": "name swapped",
    "BinaryOperation": "arithmetic operator swapped",
    "IfExp": "condition forced",
    "SimpleStatementLine": "statement deleted",
    "In": "membership flipped",
    "NotIn": "membership flipped",
    "Is": "identity flipped",
    "IsNot": "identity flipped",
    "Continue": "break and continue swapped",
    "Break": "break and continue swapped",
}


def _requires_mutmut():
    try:
        import libcst  # noqa: F401
        from mutmut.mutation import mutators  # noqa: F401
    except ImportError:
        raise UsageError("mutation analysis needs mutmut and libcst: pip install 'etprop[mutation]'") from None


def _statement_deleted(node):
    """A statement replaced by ``pass`` (not a docstring, an import or a bare ``pass``)."""
    import libcst as cst

    if len(node.body) != 1:
        return
    statement = node.body[0]
    if isinstance(statement, (cst.Pass, cst.Import, cst.ImportFrom, cst.Global, cst.Nonlocal)):
        return
    if isinstance(statement, cst.Expr) and isinstance(statement.value, (cst.SimpleString, cst.ConcatenatedString)):
        return
    yield node.with_changes(body=[cst.Pass()])


def operators() -> list:
    """mutmut's operators, and a statement deleted."""
    _requires_mutmut()
    import libcst as cst
    from mutmut.mutation.mutators import mutation_operators

    return list(mutation_operators) + [(cst.SimpleStatementLine, _statement_deleted)]


@dataclass(frozen=True)
class Mutant:
    component: str
    path: str  # the installed source file
    module: str  # its import name
    ordinal: int  # its place among the file's mutants, in generation order
    line: int
    kind: str
    before: str
    after: str

    @property
    def key(self) -> str:
        return hashlib.sha256(f"{self.path}:{self.ordinal}:{self.after}".encode()).hexdigest()[:12]

    def to_json(self) -> dict:
        return dict(self.__dict__, key=self.key)


def _module_name(path: Path) -> str:
    """The import name of an installed source file (the first package root on sys.path)."""
    import sys

    for entry in sorted((Path(p) for p in sys.path if p), key=lambda p: -len(str(p))):
        try:
            relative = path.relative_to(entry)
        except ValueError:
            continue
        parts = list(relative.with_suffix("").parts)
        if parts and parts[-1] == "__init__":
            parts.pop()
        if parts and all(part.isidentifier() for part in parts):
            return ".".join(parts)
    raise UsageError(f"{path} is not importable from this environment")


def _file_mutations(path: Path):
    """(module tree, positions, mutations) of one source file, in a stable order."""
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider
    from mutmut.mutation.file_mutation import MutationVisitor
    from mutmut.mutation.pragma_handling import IgnoredCode

    wrapper = MetadataWrapper(cst.parse_module(path.read_text()))
    visitor = MutationVisitor(operators(), IgnoredCode(set(), set(), set()))
    module = wrapper.visit(visitor)
    return module, wrapper.resolve(PositionProvider), visitor.mutations


def source_files(components: list[str]) -> dict[str, list[Path]]:
    """Each component's Python files, tests left out (reach.OMIT)."""
    import fnmatch

    paths = reach.component_paths()
    unknown = [name for name in components if name not in reach.COMPONENTS]
    if unknown:
        raise UsageError(f"unknown component(s) {unknown}: choose from {', '.join(reach.COMPONENTS)}")
    found = {}
    for name in components:
        if name not in paths:
            continue
        where = paths[name]
        files = [where] if where.is_file() else sorted(where.rglob("*.py"))
        found[name] = [f for f in files if not any(fnmatch.fnmatch(str(f), pattern) for pattern in reach.OMIT)]
    return found


def catalogue(components: list[str]) -> list[Mutant]:
    """Every mutant of the components' files, in a stable order."""
    mutants = []
    for component, files in source_files(components).items():
        for path in files:
            module_name = _module_name(path)
            tree, positions, mutations = _file_mutations(path)
            for ordinal, mutation in enumerate(mutations):
                position = positions.get(mutation.original_node)
                mutants.append(
                    Mutant(
                        component,
                        str(path),
                        module_name,
                        ordinal,
                        position.start.line if position else 0,
                        _KINDS.get(type(mutation.original_node).__name__, type(mutation.original_node).__name__),
                        tree.code_for_node(mutation.original_node).strip()[:120],
                        tree.code_for_node(mutation.mutated_node).strip()[:120],
                    )
                )
    return mutants


def mutated_source(mutant: Mutant) -> str:
    """The mutant's whole file."""
    tree, _, mutations = _file_mutations(Path(mutant.path))
    mutation = mutations[mutant.ordinal]
    return tree.deep_replace(mutation.original_node, mutation.mutated_node).code


def sample(mutants: list[Mutant], count: Optional[int], seed: int) -> list[Mutant]:
    if count is None or count >= len(mutants):
        return list(mutants)
    return sorted(random.Random(seed).sample(mutants, count), key=lambda m: (m.component, m.path, m.ordinal))


# ----- which stored programs reach a line ----------------------------------------------------


@dataclass(frozen=True)
class Program:
    """A stored campaign program and the flow it ran on."""

    context: str
    prop: str
    flow: str
    spec_path: str


_CONTEXT = re.compile(r"^[\d.]+\|(?P<prop>[^|]+)\|(?P<digest>[0-9a-f]+)\|(?P<flows>.+)$")


def stored_specs(artifacts: Path) -> dict[str, Path]:
    """Digest -> a file holding that spec: the corpus (passing programs) and
    the repro history (failing ones)."""
    found = {}
    for path in sorted((artifacts / "repros" / "history").glob("*.json")):
        found[path.stem.rsplit("--", 1)[-1]] = path
    for path in sorted((artifacts / "corpus").glob("*.pt")):
        found[path.stem.rsplit("--", 1)[-1]] = path
    return found


def load_spec(path: Path) -> dict:
    if path.suffix == ".pt":
        import torch

        return torch.load(path, weights_only=False)["spec"]
    return json.loads(path.read_text())["spec"]


@dataclass
class CoverageIndex:
    """Per source file and line, the stored programs that reached it."""

    lines: dict[str, dict[int, list[Program]]] = field(default_factory=dict)

    @classmethod
    def of(cls, artifacts: Path) -> "CoverageIndex":
        combined = reach.combine([artifacts / "reach"], artifacts / "reach-combined.db")
        if combined is None:
            raise UsageError(f"{artifacts} has no reach data: run the campaign with the meter on (the default)")
        specs = stored_specs(artifacts)
        index = cls()
        for context, files in reach.example_contexts(combined).items():
            match = _CONTEXT.match(context)
            if not match or match["digest"] not in specs:
                continue
            program = Program(context, match["prop"], match["flows"].split(",")[0], str(specs[match["digest"]]))
            for path, lines in files.items():
                per_line = index.lines.setdefault(str(Path(path).resolve()), {})
                for line in lines:
                    per_line.setdefault(line, []).append(program)
        return index

    def covering(self, mutant: Mutant) -> list[Program]:
        """Programs that reached the mutant's line, the quickest first (by property, smallest spec)."""
        found = self.lines.get(str(Path(mutant.path).resolve()), {}).get(mutant.line, [])
        return sorted(found, key=lambda p: (Path(p.spec_path).stat().st_size, p.context))


# ----- judging ------------------------------------------------------------------------------


def verdict_of(answer: dict) -> tuple:
    """What must agree between the unmutated and the mutated lowering."""
    oracles = tuple((o["oracle"], o["ok"]) for o in answer.get("oracles", []))
    facts = json.dumps(answer.get("facts", {}), sort_keys=True, default=str)
    return answer.get("outcome"), oracles, facts


def judge(pairs: list[tuple[dict, dict]]) -> str:
    """A mutant's status from (unmutated, mutated) answers of its covering programs run so far."""
    if not pairs:
        return NOT_COVERED
    if any(verdict_of(before) != verdict_of(after) for before, after in pairs):
        return KILLED
    if all(before.get("pte_sha256") and before.get("pte_sha256") == after.get("pte_sha256") for before, after in pairs):
        return EQUIVALENT
    return SURVIVED


@dataclass
class Outcome:
    mutant: Mutant
    status: str
    programs: int = 0
    seconds: float = 0.0
    killed_by: str = ""


def run_mutant(
    mutant: Mutant,
    programs: list[Program],
    start_environment: Callable[[dict], object],
    baseline: Callable[[Program], dict],
    scratch: Path,
    max_programs: int,
) -> Outcome:
    """Run ``mutant`` on its covering programs (at most ``max_programs``), stopping at the first kill."""
    import time

    from etprop.lowering import shadow

    started = time.time()
    if not programs:
        return Outcome(mutant, NOT_COVERED)
    source = scratch / f"{mutant.key}.py"
    source.write_text(mutated_source(mutant))
    from etprop.commands.environments import EnvironmentFailed, OutOfTime

    pairs: list[tuple[dict, dict]] = []
    environment = None
    try:
        # A mutant that breaks the import of its module stops the worker from starting (UsageError).
        environment = start_environment({shadow.ENV: f"{mutant.module}={source}"})
        for program in programs[:max_programs]:
            before = baseline(program)
            after = environment.run(load_spec(Path(program.spec_path)), program.prop, program.flow, attribute=False)
            pairs.append((before, after))
            if judge(pairs) == KILLED:
                return Outcome(mutant, KILLED, len(pairs), time.time() - started, program.context)
    except (EnvironmentFailed, OutOfTime, UsageError) as exc:
        # The mutated environment's worker did not start, died or hung: a verdict that differs.
        return Outcome(mutant, KILLED, len(pairs) + 1, time.time() - started, f"worker failed: {exc}"[:200])
    finally:
        if environment is not None:
            environment.close(force=True)
    return Outcome(mutant, judge(pairs), len(pairs), time.time() - started)


def by_component(outcomes: list[Outcome]) -> Iterator[tuple[str, dict]]:
    components: dict[str, dict] = {}
    for outcome in outcomes:
        row = components.setdefault(
            outcome.mutant.component,
            {"generated": 0, "seconds": 0.0, KILLED: 0, SURVIVED: 0, EQUIVALENT: 0, NOT_COVERED: 0},
        )
        row["generated"] += 1
        row[outcome.status] += 1
        row["seconds"] += outcome.seconds
    yield from components.items()
