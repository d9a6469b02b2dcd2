"""The reach meter: branch coverage of the lowering code a program drives.

etprop's oracles judge what a lowering returns; the meter says which code of
the system under test the lowering ran: ExecuTorch's XNNPACK backend, its Core
AI backend and coreai-torch's converter, EXIR's passes and lowering entry
points, torchao's PT2E. It is coverage.py (branch mode) started in the process
that lowers (the isolated worker, or the test process without isolation),
one dynamic context per example (``time|property|digest|flows``), and the data
written after every example, so a worker that dies loses only the example that
killed it. Each process writes its own data file under the directory
``ETPROP_REACH_DIR`` names; ``combine`` merges them (and other campaigns').

Per example, ``Meter.example`` returns the branch arcs it reached that this
process had not reached before, per component: what a campaign steers by.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

ENV = "ETPROP_REACH_DIR"
# One example in this many is measured (by its key's hash); the others run untraced.
SAMPLE_ENV = "ETPROP_REACH_EVERY"
DATA_PREFIX = "reach"

# Component name -> (package, path inside it or "" for the whole package).
# The order is the report's.
COMPONENTS: dict[str, tuple[str, str]] = {
    "xnnpack passes": ("executorch.backends.xnnpack", "_passes"),
    "xnnpack partitioner": ("executorch.backends.xnnpack", "partition"),
    "xnnpack operators": ("executorch.backends.xnnpack", "operators"),
    "xnnpack quantizer": ("executorch.backends.xnnpack", "quantizer"),
    "xnnpack preprocess": ("executorch.backends.xnnpack", "xnnpack_preprocess.py"),
    "coreai backend": ("executorch.backends.apple.coreai", ""),
    "coreai-torch converter": ("coreai_torch", ""),
    "exir passes": ("executorch.exir", "passes"),
    "exir emitter": ("executorch.exir", "emit"),
    "exir memory planning": ("executorch.exir", "memory_planning.py"),
    "exir lowering": ("executorch.exir", "backend"),
    "exir program": ("executorch.exir", "program"),
    "torchao pt2e": ("torchao.quantization", "pt2e"),
}
# Never the system under test: tests shipped inside the packages.
OMIT = ["*/test/*", "*/tests/*", "*/third-party/*"]


def _package_dir(package: str) -> Optional[Path]:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def component_paths() -> dict[str, Path]:
    """Each component's directory or file, where the package is installed."""
    found = {}
    for name, (package, inside) in COMPONENTS.items():
        root = _package_dir(package)
        if root is not None and (root / inside).exists():
            found[name] = root / inside if inside else root
    return found


def relocated(path: str) -> str:
    """A measured file's path in this environment: data written by another
    installation of the same packages (a campaign run from another checkout
    or environment) names its own site-packages."""
    import sysconfig

    marker = f"{os.sep}site-packages{os.sep}"
    if marker in path:
        here = Path(sysconfig.get_paths()["purelib"]) / path.split(marker, 1)[1]
        if here.exists():
            return str(here.resolve())
    return str(Path(path).resolve())


def component_of(path: str, paths: Optional[dict[str, Path]] = None) -> Optional[str]:
    """The component a source file belongs to (None: not the system under test)."""
    resolved = Path(path)
    for name, where in (paths or component_paths()).items():
        if resolved == where or where in resolved.parents:
            return name
    return None


def source_dirs(paths: Optional[dict[str, Path]] = None) -> list[str]:
    """The directories coverage.py measures: each component's, or its file's folder."""
    dirs = {str(p if p.is_dir() else p.parent) for p in (paths or component_paths()).values()}
    return sorted(dirs)


def new_coverage(data_file: Optional[str], paths: Optional[dict[str, Path]] = None):
    """A coverage.py measurement of the components, branch mode, no rc file
    (the project's own configuration must not change what is measured)."""
    import coverage

    return coverage.Coverage(
        data_file=data_file, branch=True, config_file=False, source_dirs=source_dirs(paths), omit=OMIT, messages=False
    )


class Meter:
    """coverage.py in one process, started for each measured example only
    (tracing costs the examples it measures, not the others)."""

    def __init__(self, directory: Path, every: int = 1):
        directory.mkdir(parents=True, exist_ok=True)
        self.paths = component_paths()
        name = f"{DATA_PREFIX}.{socket.gethostname()}.{os.getpid()}"
        self.coverage = new_coverage(str(directory / name), self.paths)
        self.every = max(1, every)
        self.context = ""
        # What the campaign reached before this process started (every data
        # file already in the directory): a round's new process does not count
        # what earlier rounds reached as new.
        self.seen: dict[str, set] = reached_in(data_files([directory]))

    def measures(self, key: str) -> bool:
        import hashlib

        return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % self.every == 0

    @contextlib.contextmanager
    def example(self, key: str) -> Iterator["Measurement"]:
        """One example (when sampled) under the context ``time|key``: the
        lowering code it runs inside ``measuring()`` windows is recorded, and
        the measurement it yields is filled once the example ends."""
        global _ACTIVE
        found = Measurement()
        if not self.measures(key):
            yield found
            return
        self.context, _ACTIVE = f"{time.time():.1f}|{key}", self
        try:
            yield found
        finally:
            _ACTIVE, self.context = None, ""
            found.measured, found.new_arcs = True, self._new_arcs()

    def start_window(self) -> None:
        self.coverage.start()
        self.coverage.switch_context(self.context)

    def stop_window(self) -> None:
        self.coverage.stop()

    def _new_arcs(self) -> dict[str, int]:
        """Arcs the campaign had not reached before the example (as far as
        this process knows: its own examples and the data present when it
        started), per component. The example's data is written first."""
        data = self.coverage.get_data()
        self.coverage.save()
        new: dict[str, int] = {}
        for path in data.measured_files():
            fresh = set(data.arcs(path) or ()) - self.seen.setdefault(path, set())
            if fresh:
                self.seen[path] |= fresh
                component = component_of(path, self.paths)
                if component is not None:
                    new[component] = new.get(component, 0) + len(fresh)
        return new


@dataclass
class Measurement:
    """One example's: whether it was measured, and the branch arcs it reached
    that its process had not, per component."""

    measured: bool = False
    new_arcs: dict = field(default_factory=dict)

    def as_record(self) -> dict:
        return {"new_arcs": self.new_arcs} if self.measured else {}


_METER: Optional[Meter] = None
# The meter measuring the example under way in this process, and how deep in
# ``measuring()`` windows the code is.
_ACTIVE: Optional[Meter] = None
_DEPTH = 0


@contextlib.contextmanager
def measuring() -> Iterator[None]:
    """A window of the system under test (PT2E quantization, lowering): traced
    when an example is being measured, untraced otherwise. Export, the eager
    references and the runtime run outside windows, so the tracer's cost
    falls on the code it measures."""
    global _DEPTH
    meter_now = _ACTIVE
    if meter_now is None:
        yield
        return
    if _DEPTH == 0:
        meter_now.start_window()
    _DEPTH += 1
    try:
        yield
    finally:
        _DEPTH -= 1
        if _DEPTH == 0:
            meter_now.stop_window()


def meter() -> Optional[Meter]:
    """This process's meter when ``ETPROP_REACH_DIR`` is set (started once)."""
    global _METER
    directory = os.environ.get(ENV)
    if not directory:
        return None
    if _METER is None:
        _METER = Meter(Path(directory), int(os.environ.get(SAMPLE_ENV, "1")))
    return _METER


@contextlib.contextmanager
def measured(key: str) -> Iterator[Measurement]:
    """One example under this process's meter, or nothing measured without one."""
    current = meter()
    if current is None:
        yield Measurement()
        return
    with current.example(key) as found:
        yield found


# ----- reading a campaign's data ------------------------------------------------------------


@dataclass
class ComponentReach:
    """Branches and lines of one component: the possible ones, the reached ones."""

    branches: int = 0
    branches_reached: int = 0
    lines: int = 0
    lines_reached: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def data_files(directories: list[Path]) -> list[Path]:
    return sorted(
        p
        for d in directories
        for p in Path(d).glob(f"{DATA_PREFIX}.*")
        if p.is_file() and not p.name.endswith(("-journal", "-wal", "-shm"))
    )


def reached_in(files: list[Path]) -> dict[str, set]:
    """The arcs recorded in meter data files, per source file (all contexts)."""
    from coverage import CoverageData

    reached: dict[str, set] = {}
    for path in files:
        try:
            data = CoverageData(str(path))
            data.read()
            for source in data.measured_files():
                reached.setdefault(source, set()).update(data.arcs(source) or ())
        except Exception:  # a file another process is still creating
            continue
    return reached


def combine(directories: list[Path], into: Path) -> Optional[Path]:
    """Every meter data file under ``directories`` merged into ``into``
    (None when there is none). The inputs stay."""
    files = data_files(directories)
    if not files:
        return None
    into.parent.mkdir(parents=True, exist_ok=True)
    into.unlink(missing_ok=True)
    cov = new_coverage(str(into))
    cov.combine([str(f) for f in files], keep=True)
    cov.save()
    return into


@dataclass
class Reach:
    """A combined measurement read per component: totals, the branch arcs
    reached per file, and the functions with the most unreached branches."""

    components: dict[str, ComponentReach]
    reached: dict[str, set]  # file -> branch arcs reached
    possible: dict[str, set]  # file -> every branch arc
    functions: dict[str, list]  # component -> [(unreached branches, "module.function"), ...]
    owners: dict[str, dict] = field(default_factory=dict)  # file -> {branch arc: "module.function"}


def read(data_file: Path, functions_shown: int = 8) -> Reach:
    """The components' branches and lines, reached and possible, from a combined data file."""
    import tempfile

    paths = component_paths()
    cov = new_coverage(str(data_file), paths)
    cov.load()
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "reach.json"
        try:
            cov.json_report(outfile=str(report), ignore_errors=True)
            files = json.loads(report.read_text())["files"]
        except Exception:  # coverage.py reports "No data to report" as an exception
            files = {}
    components = {name: ComponentReach() for name in paths}
    reached: dict[str, set] = {}
    possible: dict[str, set] = {}
    functions: dict[str, list] = {name: [] for name in paths}
    owners: dict[str, dict] = {}
    for path, entry in files.items():
        absolute = relocated(path)
        component = component_of(absolute, paths)
        if component is None:
            continue
        summary = entry["summary"]
        counts = components[component]
        counts.branches += summary.get("num_branches", 0)
        counts.branches_reached += summary.get("covered_branches", 0)
        counts.lines += summary.get("num_statements", 0)
        counts.lines_reached += summary.get("covered_lines", 0)
        taken = {tuple(arc) for arc in entry.get("executed_branches", [])}
        reached[absolute] = taken
        possible[absolute] = taken | {tuple(arc) for arc in entry.get("missing_branches", [])}
        module = _module_name(absolute, component, paths)
        for function, detail in entry.get("functions", {}).items():
            if not function:
                continue
            missing = detail.get("summary", {}).get("missing_branches", 0)
            if missing:
                functions[component].append((missing, f"{module}.{function}"))
            for arc in detail.get("executed_branches", []) + detail.get("missing_branches", []):
                owners.setdefault(absolute, {})[tuple(arc)] = f"{module}.{function}"
    for name in functions:
        functions[name] = sorted(functions[name], key=lambda row: (-row[0], row[1]))[:functions_shown]
    return Reach(components, reached, possible, functions, owners)


def _module_name(path: str, component: str, paths: dict[str, Path]) -> str:
    package, inside = COMPONENTS[component]
    root = paths[component]
    base = root if root.is_dir() else root.parent
    relative = Path(path).relative_to(base).with_suffix("")
    prefix = package + (("." + inside.replace("/", ".")) if inside and root.is_dir() else "")
    parts = [part for part in relative.parts if part != "__init__"]
    return ".".join([prefix] + parts)


def over_time(data_file: Path, reach: Reach) -> dict[str, list[tuple[float, int]]]:
    """Per component, (seconds since the first example, branch arcs reached so
    far) after each example, in the order the examples ran."""
    from coverage import CoverageData

    data = CoverageData(str(data_file))
    data.read()
    paths = component_paths()
    contexts = sorted((float(c.split("|", 1)[0]), c) for c in data.measured_contexts() if "|" in c)
    if not contexts:
        return {}
    start = contexts[0][0]
    files = [f for f in data.measured_files() if relocated(f) in reach.possible]
    owner = {f: component_of(relocated(f), paths) for f in files}
    union: dict[str, set] = {f: set() for f in files}
    counts = {name: 0 for name in reach.components}
    series: dict[str, list[tuple[float, int]]] = {name: [] for name in reach.components}
    import re

    first_lines = {path: _first_lines(path) for path in files}
    for moment, context in contexts:
        data.set_query_contexts(["^" + re.escape(context) + "$"])
        for path in files:
            first = first_lines[path]
            arcs = {(first(a), first(b)) for a, b in data.arcs(path) or ()} & reach.possible[relocated(path)]
            fresh = arcs - union[path]
            if fresh:
                union[path] |= fresh
                counts[owner[path]] += len(fresh)
        for name in series:
            series[name].append((round(moment - start, 1), counts[name]))
    return series


def _first_lines(path: str):
    """A statement's first line for any of its lines: coverage.py reports arcs
    between statements' first lines, and records them between raw lines."""
    from coverage.parser import PythonParser

    try:
        parser = PythonParser(filename=path)
        parser.parse_source()
    except Exception:
        return lambda line: line
    return lambda line: parser.first_line(line) if line > 0 else -parser.first_line(-line)


def example_contexts(data_file: Path) -> dict[str, dict[str, set]]:
    """Per example context, the lines it reached per file: which stored
    programs reach a given line (mutation analysis runs only those)."""
    from coverage import CoverageData

    data = CoverageData(str(data_file))
    data.read()
    found: dict[str, dict[str, set]] = {}
    for path in data.measured_files():
        for line, contexts in data.contexts_by_lineno(path).items():
            for context in contexts:
                if "|" in context:
                    found.setdefault(context, {}).setdefault(relocated(path), set()).add(line)
    return found
