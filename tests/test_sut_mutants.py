"""Mutants of the system under test (etprop/commands/sut_mutants.py) and the
import shadow that applies one (etprop/lowering/shadow.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from etprop.commands import sut_mutants as sm
from etprop.lowering import shadow

pytest.importorskip("mutmut", reason="mutation analysis needs the mutation extra")


def test_the_catalogue_covers_every_file_of_a_component_with_the_classic_operators():
    mutants = [m for m in sm.catalogue(["xnnpack preprocess"])]
    assert len(mutants) > 50
    assert {m.component for m in mutants} == {"xnnpack preprocess"}
    kinds = {m.kind for m in mutants}
    assert {"comparison flipped", "statement deleted", "argument dropped or swapped", "constant changed"} <= kinds
    assert len({m.key for m in mutants}) == len(mutants)
    mutant = next(m for m in mutants if m.kind == "comparison flipped")
    source = sm.mutated_source(mutant)
    original = Path(mutant.path).read_text()
    assert source != original and mutant.after in source
    compile(source, mutant.path, "exec")


def test_a_sample_is_seeded_and_ordered():
    mutants = sm.catalogue(["xnnpack preprocess"])
    assert sm.sample(mutants, 10, 1) == sm.sample(mutants, 10, 1) != sm.sample(mutants, 10, 2)
    assert sm.sample(mutants, None, 0) == mutants


def test_the_shadow_replaces_one_module_in_a_process_and_the_processes_it_starts(tmp_path):
    """The layered environment's sitecustomize (here on PYTHONPATH) installs
    the shadow in every interpreter, so a worker process started with spawn
    loads the mutated file too; without ETPROP_SHADOW nothing changes."""
    package = tmp_path / "site" / "installed_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from installed_pkg.lowering import MARK\n")
    (package / "lowering.py").write_text("MARK = 'installed'\n")
    fake = tmp_path / "lowering.py"
    fake.write_text("MARK = 'shadowed'\n")
    site = tmp_path / "site"
    (site / "sitecustomize.py").write_text(shadow.SITECUSTOMIZE)
    code = (
        "import multiprocessing\n"
        "def mark(_):\n"
        "    import installed_pkg\n"
        "    return installed_pkg.MARK\n"
        "if __name__ == '__main__':\n"
        "    with multiprocessing.get_context('spawn').Pool(1) as pool:\n"
        "        print('child', pool.map(mark, [0])[0])\n"
        "    print('parent', mark(0))\n"
    )
    script = tmp_path / "probe.py"
    script.write_text(code)
    base = {"PATH": "/usr/bin", "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    name = "installed_pkg.lowering"
    done = subprocess.run(
        [sys.executable, str(script)],
        env={**base, shadow.ENV: f"{name}={fake}"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "child shadowed" in done.stdout and "parent shadowed" in done.stdout, done.stderr[-2000:]
    plain = subprocess.run([sys.executable, str(script)], env=base, capture_output=True, text=True, timeout=600)
    assert "child installed" in plain.stdout and "parent installed" in plain.stdout, plain.stderr[-2000:]


def _answer(outcome="pass", ok=True, sha="a", size=10):
    return {
        "outcome": outcome,
        "oracles": [{"oracle": "eager equivalence", "ok": ok}],
        "facts": {"size": size},
        "pte_sha256": sha,
    }


def test_a_mutant_is_killed_by_any_verdict_that_differs_and_equivalent_only_on_the_same_bytes():
    same = _answer()
    assert sm.judge([]) == sm.NOT_COVERED
    assert sm.judge([(same, _answer())]) == sm.EQUIVALENT
    assert sm.judge([(same, _answer(sha="b"))]) == sm.SURVIVED
    assert sm.judge([(same, _answer(outcome="mismatch", ok=False))]) == sm.KILLED
    assert sm.judge([(same, _answer(size=11, sha="b"))]) == sm.KILLED, "a structural difference is a kill"
    assert sm.judge([(same, _answer(sha="b")), (same, _answer(outcome="lowering error"))]) == sm.KILLED
