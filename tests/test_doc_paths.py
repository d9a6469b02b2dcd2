"""Paths the docs and docstrings cite exist: in this tree, or (for a finding's
note pointing into upstream code) in the installed package it names."""

from __future__ import annotations

import importlib.util
import re
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIPPED_DIRS = {".venv", "artifacts", ".git"}
# A backticked token that looks like a file or folder path.
MARKDOWN_PATH = re.compile(r"`([\w.+/-]+/[\w.+-]*(?:\.(?:py|md|json|sh|toml|yml|yaml|ini|txt|html)|/))`")
# Paths of this tree named in Python docstrings and comments.
SOURCE_PATH = re.compile(
    r"(?<![\w/.])((?:etprop|strategies|oracles|flows|candidates|properties|findings|benchmarks|docs|ci)"
    r"/[\w/.+-]*\.(?:py|md|json|sh|ini|toml|yml))"
)
# Generated where a command runs, not kept in the tree.
GENERATED = ("artifacts/", "ARTIFACTS/")


def _roots() -> list[Path]:
    """Where a cited path may live: the tree, site-packages, and ExecuTorch's package."""
    roots = [ROOT, Path(sysconfig.get_paths()["purelib"])]
    spec = importlib.util.find_spec("executorch")
    if spec and spec.submodule_search_locations:
        roots.append(Path(next(iter(spec.submodule_search_locations))))
    return roots


def missing_paths(text: str, pattern: re.Pattern, here: Path, roots: list[Path]) -> list[str]:
    missing = []
    for match in pattern.finditer(text):
        path = match.group(1).split("#")[0]
        if path.startswith(GENERATED) or path.startswith("/"):
            continue
        if not any((root / path).exists() for root in [here, *roots]):
            missing.append(path)
    return missing


def _files(pattern: str) -> list[Path]:
    return [p for p in sorted(ROOT.glob(pattern)) if not SKIPPED_DIRS & set(p.relative_to(ROOT).parts)]


def test_every_path_a_markdown_file_cites_exists():
    roots = _roots()
    missing = {
        str(md.relative_to(ROOT)): found
        for md in _files("**/*.md")
        if (found := missing_paths(md.read_text(), MARKDOWN_PATH, md.parent, roots))
    }
    assert not missing, missing


def test_every_path_a_docstring_or_comment_cites_exists():
    roots = _roots()
    sources = [p for p in _files("**/*.py") if p.relative_to(ROOT).parts[0] != "tests"]
    missing = {
        str(path.relative_to(ROOT)): found
        for path in sources
        if (found := missing_paths(path.read_text(), SOURCE_PATH, path.parent, roots))
    }
    assert not missing, missing


def test_the_checker_reports_a_path_that_does_not_exist():
    text = "see `strategies/no_such_module.py` and `strategies/sizes.py`; etprop/lowering/nowhere.py"
    assert missing_paths(text, MARKDOWN_PATH, ROOT, [ROOT]) == ["strategies/no_such_module.py"]
    assert missing_paths(text, SOURCE_PATH, ROOT, [ROOT]) == [
        "strategies/no_such_module.py",
        "etprop/lowering/nowhere.py",
    ]
