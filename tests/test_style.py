"""The code is ruff-clean, lint and format (configured in pyproject.toml)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("command", [["check", "--output-format", "concise"], ["format", "--check"]])
def test_ruff_is_clean(command):
    done = subprocess.run([sys.executable, "-m", "ruff", *command, "."], cwd=ROOT, capture_output=True, text=True)
    assert "No module named ruff" not in done.stderr, "ruff is missing: bash ci/test.sh installs the dev extra"
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]
