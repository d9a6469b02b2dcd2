"""No verdict without a run: outcomes come from the stage and the exception,
flows that did not run say so, and a campaign with nothing to show fails."""

from __future__ import annotations

import dataclasses
import json

import pytest

from etprop import flows
from etprop.commands.campaign import campaign_exit_code
from etprop.commands.report import Summary
from etprop.lowering import pipeline
from etprop.oracles.sets import SINGLE_FLOW
from etprop.program import builder
from etprop.verdicts.outcomes import Outcome
from etprop.verdicts.session import Session


def _raising_flow(message: str):
    def fail(graph_module):
        raise RuntimeError(message)

    return dataclasses.replace(flows.get("portable"), name="test-raising", transform_passes=lambda: [fail])


@pytest.mark.parametrize("message", ["a dependency cycle between partitions", "while_loop is not supported"])
def test_a_lowering_error_is_not_classified_by_a_word_in_its_message(tiny_spec, while_loop_spec, message):
    spec = while_loop_spec if "while_loop" in message else tiny_spec
    lowering = pipeline.lower(builder.build(spec), _raising_flow(message))
    assert lowering.outcome is Outcome.LOWERING_ERROR, lowering.error


def test_a_wrapped_lowering_error_names_its_cause_on_its_first_line(tiny_spec):
    """ExecuTorch's pass manager re-raises any pass's error as "An error
    occurred when running the '...' pass": the signature triage groups by is
    taken from the first line, which must name the underlying error."""
    from etprop.verdicts.signature import signature

    lowering = pipeline.lower(builder.build(tiny_spec), _raising_flow("planted index problem"))
    first = lowering.error.splitlines()[0]
    assert "An error occurred when running" in first and "(cause: RuntimeError: planted index problem in fail)" in first
    other = pipeline.lower(builder.build(tiny_spec), _raising_flow("another problem"))
    assert signature("portable", "lowering error", lowering.error) != signature(
        "portable", "lowering error", other.error
    )


def test_only_the_emitters_while_loop_limitation_is_unsupported(while_loop_spec):
    lowering = pipeline.lower(builder.build(while_loop_spec), flows.get("portable"))
    assert lowering.outcome is Outcome.UNSUPPORTED, lowering.error
    assert lowering.error.startswith("to_executorch: InternalError")


def _record(*outcomes: str) -> dict:
    return {
        "property": "mixed",
        "digest": "d",
        "ops": [],
        "nodes": 1,
        "repro": None,
        "flows": [{"flow": f"f{i}", "outcome": o, "known": None, "message": ""} for i, o in enumerate(outcomes)],
    }


def test_a_campaign_exit_code_needs_examples_and_a_sound_suite(capsys):
    assert campaign_exit_code(Summary([]), 0) == 3
    assert "0 examples ran" in capsys.readouterr().err
    assert campaign_exit_code(Summary([_record("pass")]), 1) == 3
    assert campaign_exit_code(Summary([_record("etprop internal error")]), 0) == 3
    assert campaign_exit_code(Summary([_record("pass", "mismatch")]), 0) == 1
    assert campaign_exit_code(Summary([_record("export error")]), 0) == 1
    assert campaign_exit_code(Summary([_record("pass", "not run")]), 0) == 0


def test_not_run_is_no_failure_and_no_pass():
    assert not Outcome.NOT_RUN.is_failure and Outcome.NOT_RUN is not Outcome.PASS
    summary = Summary([_record("not run", "crash")])
    assert [f["outcome"] for f in summary.failures()] == ["crash"]


def test_an_export_failure_is_recorded_as_a_generator_defect(tmp_path, tiny_spec, monkeypatch):
    def reject(built):
        raise pipeline.ExportFailed("torch.export rejected method 'forward': injected")

    monkeypatch.setattr(pipeline, "export_program", reject)
    session = Session(tmp_path, isolated=False)
    with pytest.raises(pipeline.ExportFailed):
        session.check(tiny_spec, [flows.get("portable")], "mixed", SINGLE_FLOW)
    summary = Summary.load(tmp_path)
    assert [f["outcome"] for f in summary.failures()] == ["export error"]
    (record,) = summary.records
    assert json.loads(open(record["repro"]).read())["spec"] == tiny_spec
