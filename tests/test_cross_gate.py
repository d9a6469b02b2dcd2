"""The gate across Python environments: each environment lowers in its own
process and answers in plain data; this process compares and decides.

The comparison is tested on hand-made answers; the environments end to end
on two small programs: the same environment on both sides passes, and an
environment whose XNNPACK relu is deliberately wrong (a sitecustomize from
ci/gate_demo/) fails with a repro shrunk there that passes in the baseline."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from etprop.commands import cross_gate
from etprop.commands.environments import Environment, create
from etprop.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ROOT / "tests" / "fixtures" / "gate"
BROKEN_RELU = ROOT / "ci" / "gate_demo" / "broken_relu_sitecustomize.py"


def _answer(outcome="pass", message="", known=None, pte=1000, delegates=1, portable=None):
    return {
        "outcome": outcome,
        "message": message,
        "known": known,
        "facts": {
            "flow": "xnnpack",
            "pte_bytes": pte,
            "delegate_calls": delegates,
            "portable_ops": portable or {},
            "binding_bytes": 0,
        }
        if outcome == "pass"
        else {},
    }


def _item(base, cand):
    return cross_gate.Item("drawn mixed #0", "mixed", {"methods": {}}, {"baseline": base, "candidate": cand})


MISMATCH = (
    "[eager equivalence] FAILED (mismatch): method 'forward', normal inputs: output 0 (4, 8): "
    "{n} / 32 elements differ; worst at (0, 0): eager 0, got {got}, allowed difference 1e-05 "
)


@pytest.mark.parametrize(
    "base, cand, kind",
    [
        (_answer(), _answer("mismatch", MISMATCH.format(n=3, got=0.5)), "newly failing"),
        (_answer(), _answer("lowering error", "RuntimeError: boom"), "newly failing"),
        (_answer(), _answer("unsupported by ExecuTorch", "while_loop"), "newly unsupported"),
        (_answer(), _answer("export error", "does not export here"), "does not build in the candidate environment"),
        (
            _answer("mismatch", MISMATCH.format(n=3, got=0.001)),
            _answer("mismatch", MISMATCH.format(n=30, got=0.5)),
            "worse mismatch",
        ),
        (_answer("lowering error", "RuntimeError: one"), _answer("run error", "error 0x12"), "changed failure"),
        (_answer(), _answer("mismatch", "elements differ", known="XNN-001"), "known finding XNN-001 newly hit"),
        (_answer(pte=1000), _answer(pte=9000), "structural regression"),
        (_answer(portable={}), _answer(portable={"tanh": 1}), "structural regression"),
    ],
)
def test_a_candidate_environment_doing_worse_is_a_regression_of_its_kind(base, cand, kind):
    found = cross_gate.judge(_item(base, cand), "baseline", "candidate")
    assert found is not None and found["kind"] == kind, found


@pytest.mark.parametrize(
    "base, cand",
    [
        (_answer(), _answer()),
        (_answer("mismatch", MISMATCH.format(n=3, got=0.5)), _answer()),
        (_answer("lowering error", "RuntimeError: one"), _answer("lowering error", "RuntimeError: one")),
        (_answer(pte=9000, portable={"tanh": 2}), _answer(pte=1000)),
    ],
)
def test_a_candidate_environment_doing_as_well_or_better_is_no_regression(base, cand):
    assert cross_gate.judge(_item(base, cand), "baseline", "candidate") is None


def test_the_tally_and_structure_lines_count_what_changed():
    items = [
        _item(_answer(), _answer()),
        _item(_answer("lowering error", "RuntimeError: one"), _answer()),
        _item(_answer(pte=9000, portable={"tanh": 2}), _answer(pte=1000)),
        _item(_answer(), _answer("run error", "error 0x12")),
    ]
    assert cross_gate.tally(items, "baseline", "candidate") == {"passing": 2, "fixed": 1, "newly failing": 1}
    lines = cross_gate.structure_summary(items, "baseline", "candidate")
    assert "structure: .pte bytes: 1 better (9000 -> 1000 over those programs)" in lines
    assert "structure: ops outside delegates: 1 better (2 -> 0 over those programs)" in lines


def test_an_interpreter_that_is_not_there_is_a_one_line_error(tmp_path):
    with pytest.raises(UsageError, match="no Python interpreter at"):
        Environment(str(tmp_path / "nowhere" / "python"), "candidate", tmp_path / "a").start()


def test_an_environment_without_etprop_names_the_install_command(tmp_path):
    base = subprocess.run(
        [sys.executable, "-c", "import sys; print(sys._base_executable)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    subprocess.run([base, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    with pytest.raises(UsageError) as raised:
        Environment(str(tmp_path / "bare" / "bin" / "python"), "candidate", tmp_path / "a").start()
    message = str(raised.value)
    assert "has no etprop" in message and "pip install --no-deps" in message and "\n" not in message


def _gate(tmp_path, candidate_python, name):
    """The gate on the two fixture programs; its budget (shrinking included) ends before
    pytest's 900 s timeout, and leaves a loaded machine room to shrink."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "etprop.commands.cli",
            "gate",
            "--baseline-env",
            sys.executable,
            "--candidate-env",
            candidate_python,
            "--flow",
            "xnnpack",
            "--programs",
            str(PROGRAMS),
            "--minutes",
            "14",
            "--artifacts",
            str(tmp_path / f"gate-{name}"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )


@pytest.mark.slow
def test_the_same_environment_on_both_sides_passes_with_no_difference(tmp_path):
    run = _gate(tmp_path, sys.executable, "same")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "VERDICT: PASS: no regression on 2 programs" in run.stdout
    assert "per program: 2 passing" in run.stdout and "structure:" not in run.stdout


@pytest.mark.slow
def test_a_deliberately_broken_lowering_in_the_candidate_environment_fails_with_a_shrunk_repro(tmp_path):
    python = create(tmp_path / "broken", sys.executable, sitecustomize=BROKEN_RELU)
    run = _gate(tmp_path, python, "broken")
    assert run.returncode == 1, run.stdout + run.stderr
    assert re.search(r"VERDICT: FAIL: 1 program\(s\) regressed .*newly failing: .*mismatch", run.stdout)
    shrunk = re.search(
        r"shrunk in the candidate environment to (\d+) node\(s\): (\S+) "
        r"\(baseline environment on it: pass\)",
        run.stdout,
    )
    assert shrunk and int(shrunk.group(1)) <= 3, run.stdout
    replay = subprocess.run(
        [python, "-P", "-m", "etprop.commands.cli", "repro", shrunk.group(2), "--artifacts", str(tmp_path / "replay")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert replay.returncode == 1 and "still failing" in replay.stdout, replay.stdout + replay.stderr


def test_replay_in_another_environment_runs_that_environments_etprop(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "etprop.commands.cli",
            "replay",
            "--env",
            sys.executable,
            str(PROGRAMS / "no_relu.json"),
            "--artifacts",
            str(tmp_path / "replay"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "no_relu.json" in run.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "etprop.commands.cli", "replay", "--env", str(tmp_path / "none" / "python")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert missing.returncode == 2 and "no Python interpreter at" in missing.stderr


class _FakeEnvironment:
    """Answers by a rule instead of lowering: enough to drive CrossGate."""

    def __init__(self, label, failing, slow=()):
        self.label, self.failing, self.slow, self.asked = label, failing, slow, []

    def run(self, spec, prop, flow, deadline=None, attribute=True):
        from etprop.commands.environments import OutOfTime

        self.asked.append(spec["name"])
        if spec["name"] in self.slow:
            raise OutOfTime()
        bad = any(name in self.failing for name in spec["name"].split("+"))
        return _answer("mismatch", MISMATCH.format(n=3, got=0.5)) if bad else _answer()


def test_a_packed_program_that_fails_is_judged_by_its_parts(tmp_path):
    """A known failure in one packed part must not hide a regression in
    another, and a regression is narrowed to its part before shrinking."""
    parts = [cross_gate.Item(f"coverage #0 part {i}", "mixed", {"name": name}) for i, name in enumerate("abc")]
    packed = cross_gate.Item("coverage #0 (3 programs packed)", "mixed", {"name": "a+b+c"}, parts=parts)
    passing = cross_gate.Item("coverage #1", "mixed", {"name": "d"})
    baseline, candidate = _FakeEnvironment("baseline", {"a"}), _FakeEnvironment("candidate", {"a", "c"})
    gate = cross_gate.CrossGate(baseline, candidate, "xnnpack", "xnnpack", 5, [packed, passing])
    gate.run(started=__import__("time").time())
    assert baseline.asked == ["a+b+c", "a", "b", "c", "d"]
    compared = gate.compared()
    assert [item.source for item in compared] == [p.source for p in parts] + ["coverage #1"]
    regressed = [item.source for item in compared if cross_gate.judge(item, "baseline", "candidate")]
    assert regressed == ["coverage #0 part 2"]


@pytest.mark.slow
def test_a_flow_that_prints_to_stdout_does_not_break_the_workers_channel(tmp_path):
    noisy = str(ROOT / "tests" / "fixtures" / "noisy_flows.py")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "etprop.commands.cli",
            "gate",
            "--baseline-env",
            sys.executable,
            "--candidate-env",
            sys.executable,
            "--flow",
            "test-noisy",
            "--flow-module",
            noisy,
            "--programs",
            str(PROGRAMS / "no_relu.json"),
            "--artifacts",
            str(tmp_path / "gate"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert run.returncode == 0 and "VERDICT: PASS: no regression on 1 programs" in run.stdout, run.stdout + run.stderr
    assert "noisy flow: native-style write" in (tmp_path / "gate" / "candidate" / "worker.log").read_text()


def test_a_program_the_budget_cuts_short_is_not_compared_and_breaks_nothing():
    items = [cross_gate.Item(f"drawn mixed #{i}", "mixed", {"name": name}) for i, name in enumerate("xyz")]
    baseline, candidate = _FakeEnvironment("baseline", set()), _FakeEnvironment("candidate", set(), slow={"y"})
    gate = cross_gate.CrossGate(baseline, candidate, "xnnpack", "xnnpack", 5, items)
    gate.run(started=__import__("time").time())
    assert candidate.asked == ["x", "y"] and not gate.broken
    assert [item.source for item in gate.compared()] == ["drawn mixed #0"]


def test_the_same_crash_in_two_environments_is_no_regression_whatever_the_flows_are_called():
    crash = "[isolation] FAILED (crash): crash: SIGABRT in runtime execution of 'forward' ({})"
    base = dict(_answer("crash", crash.format("xnnpack")), flow="xnnpack")
    cand = dict(_answer("crash", crash.format("xnnpack+fold-pkg")), flow="xnnpack+fold-pkg")
    assert cross_gate.judge(_item(base, cand), "baseline", "candidate") is None


def test_a_message_naming_a_module_of_the_flows_backend_is_the_same_failure_in_both():
    """The baseline flow's name inside a module path is not the flow: XNN-016's
    message (object addresses differ between processes too) under two flow names."""
    error = (
        "[lowering] FAILED (lowering error): RuntimeError: Invalid input type map given, "
        "<executorch.backends.xnnpack.operators.node_visitor.InputTypeToIndex object at {}>, 3, "
        "[p_program_w21_weight, args_0]"
    )
    base = dict(_answer("lowering error", error.format("0x7f5b0bb0d0d0"), known="XNN-016"), flow="xnnpack")
    cand = dict(_answer("lowering error", error.format("0x7f3fc79e5990"), known="XNN-016"), flow="xnnpack+fold-pkg")
    assert cross_gate.judge(_item(base, cand), "baseline", "candidate") is None
    other = dict(cand, message=error.replace("Invalid input type map", "Unsupported dtype"))
    assert cross_gate.judge(_item(base, other), "baseline", "candidate")["kind"] == "changed failure"


def test_replay_calls_a_finding_failing_for_another_reason_changed():
    """coreai-torch 0.4.3 fails every Core AI program in lowering: a finding
    recorded as one lowering error is not "still failing" there."""
    from etprop.commands.replay import Replayed

    recorded = "[lowering] FAILED (lowering error): IndexError: list index out of range"
    broken = "[lowering] FAILED (lowering error): AttributeError: 'AIProgram' object has no attribute 'get_graph'"
    same = Replayed(Path("f.json"), "lowering error", "lowering error", recorded, recorded)
    other = Replayed(Path("f.json"), "lowering error", "lowering error", broken, recorded)
    assert same.status == "still failing" and other.status == "changed"
    assert "get_graph" in other.line() and "get_graph" not in same.line()
    assert Replayed(Path("f.json"), "mismatch", "pass", "", recorded).status == "fixed"
    traced = recorded + '\n  File "x.py", line 3, in pool_shape\nIndexError: list index out of range'
    assert Replayed(Path("f.json"), "lowering error", "lowering error", traced, recorded).status == "still failing"
    attributed = Replayed(Path("f.json"), "lowering error", "lowering error", broken, recorded, known="COREAI-009")
    assert attributed.status == "still failing"


class _OpRuleEnvironment:
    """Fails (one and the same lowering error) on the programs ``fails`` picks
    by their ops."""

    def __init__(self, label: str, fails):
        self.label, self.fails = label, fails

    def run(self, spec, prop, flow, deadline=None, attribute=True):
        from etprop.program import spec as specmod

        if self.fails({node["op"] for _, node in specmod.all_nodes(spec)}):
            return _answer("lowering error", "RuntimeError: boom")
        return _answer()


def test_shrinking_a_regression_keeps_the_baseline_passing():
    """The candidate fails on relu (its regression) and on tanh, which the
    baseline fails on too wherever no relu is. The first smaller program
    tried keeps tanh: shrinking that watched the candidate alone goes there
    and ends on a program failing in both; the gate's shrink keeps relu."""
    from etprop.commands.shrink import shrink_to
    from etprop.program.spec import FORMAT

    spec = {
        "format": FORMAT,
        "state": {},
        "methods": {
            "forward": {
                "inputs": [{"name": "x", "shape": [2, 8], "dtype": "float32"}],
                "nodes": [
                    {"id": "a", "op": "sigmoid", "args": ["x"]},
                    {"id": "b", "op": "tanh", "args": ["a"]},
                    {"id": "c", "op": "relu", "args": ["x"]},
                    {"id": "d", "op": "gelu", "args": ["c"]},
                ],
                "outputs": ["b", "d"],
            }
        },
    }
    baseline = _OpRuleEnvironment("baseline", lambda ops: "tanh" in ops and "relu" not in ops)
    candidate = _OpRuleEnvironment("candidate", lambda ops: "tanh" in ops or "relu" in ops)
    gate = cross_gate.CrossGate(baseline, candidate, "xnnpack", "xnnpack")
    item = cross_gate.Item(
        "drawn mixed #0", "mixed", spec, {env.label: env.run(spec, "mixed", "xnnpack") for env in (baseline, candidate)}
    )
    found = cross_gate.judge(item, "baseline", "candidate")
    assert found and found["kind"] == "newly failing"

    shrunk = cross_gate.shrink_regression(gate, item, found)
    assert [n["op"] for n in shrunk.spec["methods"]["forward"]["nodes"]] == ["relu"]
    assert shrunk.answers["baseline"]["outcome"] == "pass"

    blind = shrink_to(spec, lambda s: candidate.run(s, "mixed", "x")["outcome"] != "pass", log=lambda line: None)
    assert baseline.run(blind.spec, "mixed", "x")["outcome"] != "pass"


def test_findings_of_the_gated_backends_come_before_the_coverage_corpus_the_others_after():
    from etprop.commands.cross_gate import _finding_items
    from etprop.verdicts import known_findings

    relevant, others = _finding_items(("xnnpack", "xnnpack+fold-pkg"))
    by_id = {f.id: f for f in known_findings.load()}
    ids = lambda items: {item.source.removeprefix("finding ") for item in items}
    assert relevant and others
    assert all(any(flow.startswith("xnnpack") for flow in by_id[i].flows) for i in ids(relevant))
    assert not any(flow.startswith("xnnpack") for i in ids(others) for flow in by_id[i].flows)
    assert "COREAI-006" in ids(others)
    everything, none = _finding_items()
    assert len(everything) == len(relevant) + len(others) and not none


def test_the_drawn_programs_include_windows_of_real_models(monkeypatch):
    from etprop.commands import cross_gate
    from etprop.oracles.sets import ORACLES_BY_PROPERTY
    from etprop.strategies import model_zoo

    if not model_zoo.installed():
        pytest.skip(model_zoo.INSTALL_HINT)
    monkeypatch.setattr(cross_gate, "coverage_corpus", lambda seed, pack_size: ([], set()))
    monkeypatch.setattr(cross_gate.coverage, "families", lambda: {})
    items, _ = cross_gate.corpus(0, 2, findings=False)
    assert [item.source for item in items] == ["drawn real_models #0", "drawn real_models #1"]
    assert {item.prop for item in items} == {"real_models"} and "real_models" in ORACLES_BY_PROPERTY
