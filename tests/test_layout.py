"""The package's shape: layers import downward only, the engine never imports
the test layer, and a built wheel carries everything a campaign needs."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# What each group may import from etprop (besides the leaves below). flows and
# candidates are lowering recipes, so they sit with the lowering group.
LOWERING = {"lowering", "flows", "candidates"}
ALLOWED = {
    "program": {"program"},
    "strategies": {"program", "strategies"},
    **{group: {"program"} | LOWERING for group in LOWERING},
    "oracles": {"program", "oracles"} | LOWERING,
    "verdicts": {"program", "oracles", "verdicts"} | LOWERING,
    "commands": {"program", "oracles", "verdicts", "commands", "strategies"} | LOWERING,
}
LEAVES = {"etprop", "etprop.errors", "etprop.verdicts.outcomes"}


def package_dirs() -> dict[str, Path]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = config["package-dir"]
    return {package: ROOT / mapping.get(package, package.replace(".", "/")) for package in config["packages"]}


def engine_modules() -> dict[str, Path]:
    """Every module the package installs, except the property modules (the test layer)."""
    modules = {}
    for package, folder in package_dirs().items():
        if package == "etprop.properties":
            continue
        for path in sorted(folder.glob("*.py")):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return modules


def group_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else None


def etprop_imports(path: Path, module: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("etprop")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("etprop"):
            # ``from etprop import flows`` imports the submodule etprop.flows.
            if node.module == "etprop":
                found |= {f"etprop.{alias.name}" for alias in node.names}
            else:
                found.add(node.module)
    return found


def test_no_two_modules_share_a_name():
    names = [path.stem for path in engine_modules().values() if path.stem != "__init__"]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_each_group_imports_only_the_groups_below_it():
    offences = []
    for module, path in engine_modules().items():
        group = group_of(module)
        if group is None:
            continue
        for target in etprop_imports(path, module):
            if target in LEAVES or target.startswith("etprop.findings"):
                continue
            if group_of(target) not in ALLOWED[group]:
                offences.append(f"{module} imports {target}")
    assert not offences, offences


def module_imports(path: Path, modules: set[str]) -> set[str]:
    """The engine modules ``path`` imports, at any depth of the file (a
    function's own import counts): ``from etprop.a import b`` is etprop.a.b
    when that is a module, else etprop.a."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("etprop"):
            found |= {
                f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                for alias in node.names
            }
    return found & modules


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return circles


# builder renders a quantized spec's PT2E steps from quantize, which builds on
# builder's float program; they separate when the generated-source preludes
# leave builder for modules of their own.
ALLOWED_CIRCLES = [["etprop.program.builder", "etprop.program.quantize"]]


def test_no_import_circles():
    modules = engine_modules()
    graph = {module: module_imports(path, set(modules)) - {module} for module, path in modules.items()}
    circles = [circle for circle in import_circles(graph) if circle not in ALLOWED_CIRCLES]
    assert not circles, circles


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_circles(graph) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


def test_the_engine_imports_without_the_test_layer():
    """Every engine module imports with etprop.properties made unimportable."""
    modules = sorted(engine_modules())
    code = (
        "import importlib, sys\n"
        "sys.modules['etprop.properties'] = None\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "assert sys.modules['etprop.properties'] is None\n"
        "print(len(sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_checker_sees_an_upward_import(tmp_path):
    """The rule above can fail: an oracle importing a command is an offence."""
    path = tmp_path / "bad.py"
    path.write_text("from etprop.commands import campaign\nfrom etprop import errors\n")
    targets = etprop_imports(path, "etprop.oracles.bad")
    assert group_of("etprop.commands.campaign") not in ALLOWED["oracles"]
    assert targets == {"etprop.commands", "etprop.errors"}


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory):
    """etprop built as a wheel and installed, without dependencies, into a
    virtual environment layered over this one (torch and executorch come from here)."""
    base = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(base / "dist"),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next((base / "dist").glob("etprop-*.whl"))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # Plain path lines: this environment's packages, but not its editable etprop finder.
    (site / "layered-over-test-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    outside = base / "outside"
    outside.mkdir()
    return wheel, venv, outside


def _run(venv: Path, cwd: Path, *args, timeout=900):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ETPROP_", "PYTEST_"))}
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    return subprocess.run(
        [str(venv / "bin" / "etprop"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_wheel_carries_findings_properties_and_flows(installed_wheel):
    wheel, venv, outside = installed_wheel
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "etprop/findings/index.json" in names
    assert "etprop/properties/pytest.ini" in names and "etprop/properties/test_single_method.py" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    declared = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[etprop.flows]" in declared and "etprop.candidates.xnnpack_fold" in declared
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import etprop; print(etprop.__file__)"],
        cwd=outside,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(venv)), f"etprop imported from {where}, not from the wheel"


def test_the_installed_wheel_lists_its_flows(installed_wheel):
    _, venv, outside = installed_wheel
    result = _run(venv, outside, "flows")
    assert result.returncode == 0, result.stderr
    listed = [line.split()[0] for line in result.stdout.splitlines() if line and not line.startswith(" ")]
    assert listed == ["portable", "xnnpack", "coreai", "xnnpack+fold", "xnnpack+cf", "coreai+multifunction"]


def test_the_installed_wheel_carries_and_replays_the_findings(installed_wheel):
    """Every finding's repro ships in the wheel (tests/test_findings.py replays
    each from the checkout); the installed etprop replays one spec repro per
    runtime (portable, XNNPACK, Core AI) from its own package data."""
    wheel, venv, outside = installed_wheel
    names = set(zipfile.ZipFile(wheel).namelist())
    index = json.loads((ROOT / "findings" / "index.json").read_text())
    assert index and all(f"etprop/findings/{entry['repro']}" in names for entry in index)
    assert {f"etprop/findings/repros/{p.name}" for p in (ROOT / "findings" / "repros").iterdir()} <= names
    package = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import etprop.findings as f, os; print(os.path.dirname(f.__file__))"],
        cwd=outside,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    chosen = {}
    for entry in index:
        if entry["repro"].endswith(".json"):
            chosen.setdefault(entry["flows"][0], entry["repro"])
    paths = [str(Path(package) / chosen[flow]) for flow in ("portable", "xnnpack", "coreai")]
    result = _run(venv, outside, "replay", *paths, "--artifacts", str(outside / "replay"))
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    replayed = [line for line in result.stdout.splitlines() if line.startswith("still failing")]
    assert len(replayed) == 3 and result.returncode == 1, result.stdout[-3000:]


def test_the_installed_wheel_runs_a_campaign_outside_the_checkout(installed_wheel):
    _, venv, outside = installed_wheel
    artifacts = outside / "campaign"
    result = _run(
        venv,
        outside,
        "fuzz",
        "--seed",
        "0",
        "--reach-every",
        "1",
        "--flows",
        "portable",
        "--properties",
        "mixed",
        "--examples",
        "1",
        "--workers",
        "1",
        "--minutes",
        "5",
        "--artifacts",
        str(artifacts),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [
        json.loads(line) for path in (artifacts / "results").glob("*.jsonl") for line in path.read_text().splitlines()
    ]
    assert records and all(r["property"] == "mixed" for r in records)
    # The reach meter runs by default, in the installed package too.
    assert all("new_arcs" in r for r in records), "an example of the campaign was not measured"
    assert "reach (branches of the lowering code run" in result.stdout, result.stdout[-3000:]
    reached = json.loads((artifacts / "reports" / "coverage.json").read_text())["reach"]["components"]
    assert reached["xnnpack passes"]["branches"] > 0 and reached["exir passes"]["branches_reached"] > 0
