"""Campaign triage (etprop/commands/triage.py): every failure group shrunk, one
defect per cause, each placed in the layer it belongs to."""

import json
from pathlib import Path

from etprop.commands import shrink, triage
from etprop.commands.report import Summary
from etprop.oracles.sets import SINGLE_FLOW
from etprop.program import spec as specmod
from etprop.program.spec import FORMAT
from etprop.verdicts import repro
from etprop.verdicts.session import Session
from etprop.verdicts.signature import signature

ROOT = Path(__file__).resolve().parent.parent
EXPORT_DEFECT = str(ROOT / "tests" / "fixtures" / "export_defect.py")


def _chain(ops: list[str], shape=(2, 8), dtype="float32") -> dict:
    nodes, last = [], "x"
    for index, op in enumerate(ops):
        nodes.append({"id": f"v{index}", "op": op, "args": [last]})
        last = f"v{index}"
    return {
        "format": FORMAT,
        "state": {},
        "methods": {
            "forward": {
                "inputs": [{"name": "x", "shape": list(shape), "dtype": dtype}],
                "nodes": nodes,
                "outputs": [last],
            }
        },
    }


def test_signature_keeps_the_kind_of_failure_and_blanks_what_varies_with_the_program():
    first = (
        "[eager equivalence] FAILED (mismatch): method 'forward', normal inputs: output 1 (2, 4): "
        "8 / 8 elements differ; worst at (0, 0): eager -0.9, got -0.09, allowed difference 8.8e-06"
    )
    second = (
        "[eager equivalence] FAILED (mismatch): method 'prefill', large inputs: output 0 (3,): "
        "1 / 3 elements differ; worst at (2,): eager 4, got 5, allowed difference 0.1"
    )
    nonfinite = (
        "[eager equivalence] FAILED (mismatch): method 'forward', large inputs: output 8 (3, 3): "
        "9 / 9 elements are non-finite where eager and float64 are finite; first at (0, 0)"
    )
    assert signature("xnnpack", "mismatch", first) == signature("xnnpack", "mismatch", second)
    assert signature("xnnpack", "mismatch", first) != signature("xnnpack", "mismatch", nonfinite)
    assert signature("xnnpack", "mismatch", first) != signature("portable", "mismatch", first)
    error = "[lowering] FAILED (lowering error): ValueError: node (p_w{}_weight) is tagged with (tag{})"
    assert signature("coreai", "lowering error", error.format(1, 4)) == signature(
        "coreai", "lowering error", error.format(7, 2)
    )
    at = "[lowering] FAILED (lowering error): RuntimeError: bad map <InputTypeToIndex object at {}>, 3"
    assert signature("xnnpack", "lowering error", at.format("0x7fa447144bd0")) == signature(
        "xnnpack", "lowering error", at.format("0x7f0c12e9a010")
    )
    assert signature("coreai", "lowering error", error.format(1, 4)) != signature(
        "coreai", "lowering error", "[lowering] FAILED (lowering error): KeyError: 'x'"
    )


def test_signature_blanks_the_flow_a_message_names_and_nothing_else():
    """A failure that names its flow is one failure on every flow that shows
    it (triage then places it in the backend, not in one candidate)."""

    def coverage(flow):
        return (
            f"[delegation coverage] FAILED (property violation): 1 GEMM(s) that {flow} promises to delegate "
            "run on portable kernels: forward/aten_convolution_default (convolution, quantized weight)"
        )

    detail = [
        signature(flow, "property violation", coverage(flow)).split(" | ", 1)[1]
        for flow in ("xnnpack", "xnnpack+fold", "coreai+multifunction")
    ]
    assert detail[0] == detail[1] == detail[2] and "<flow>" in detail[0]
    quoted = "[lowering] FAILED (lowering error): KeyError: in executorch.backends.xnnpack.partition (xnnpack+fold)"
    assert "backends.xnnpack.partition" in signature("xnnpack", "lowering error", quoted)
    assert "(xnnpack+fold)" in signature("xnnpack", "lowering error", quoted)
    assert "<flow>" not in signature("", "lowering error", quoted), "no flow named: nothing blanked"


def _functional_tensor_error(quoted_frames: int) -> str:
    """A lowering error whose text quotes another traceback (torch.fx's
    "Original traceback"), then the traceback of the raise itself."""
    text = (
        "RuntimeError: Attempting to use FunctionalTensor on its own.\n\nWhile executing %scan\n"
        "Original traceback:\n"
        + "".join(f'  File "<eval_with_key>.{i}", line 9, in forward\n    x\n' for i in range(quoted_frames))
    )
    raised = (
        '  File "torch/_ops.py", line 875, in __call__\n    return self._op(*args)\n'
        '  File "torch/_subclasses/functional_tensor.py", line 286, in __torch_dispatch__\n'
        "    raise RuntimeError(\n"
    )
    return "[lowering] FAILED (lowering error): " + text + "\n" + raised + text


def test_signature_names_the_frame_that_raised_not_frames_the_message_quotes():
    one, three = _functional_tensor_error(1), _functional_tensor_error(3)
    assert signature("xnnpack", "lowering error", one) == signature("xnnpack", "lowering error", three)
    assert "(in __torch_dispatch__)" in signature("xnnpack", "lowering error", one)


def test_a_recorded_failure_keeps_the_signature_of_its_whole_message(tmp_path):
    """The stored message is cut short; grouping uses the signature taken
    from the whole one, so a rerun's failure matches its group."""
    from etprop.oracles import Verdict
    from etprop.verdicts.check import Artifacts, ExampleResult, FlowResult
    from etprop.verdicts.outcomes import Outcome

    message = _functional_tensor_error(60)
    verdict = Verdict.failed("lowering", message.split("FAILED (lowering error): ", 1)[1], Outcome.LOWERING_ERROR)
    failed = FlowResult("xnnpack", Outcome.LOWERING_ERROR, [verdict])
    assert len(failed.message) > 2000
    Artifacts(tmp_path).record(ExampleResult("mixed", _chain(["relu"]), [failed]))
    (group,) = triage.Triage(tmp_path).groups(Summary.load(tmp_path).records).values()
    assert group.signature == signature("xnnpack", "lowering error", failed.message)


def test_canonical_form_ignores_names_and_seeds_but_not_the_program():
    spec = _chain(["relu", "tanh"])
    renamed = json.loads(json.dumps(spec).replace('"v0"', '"first"').replace('"x"', '"inp"'))
    assert triage.canonical(spec) == triage.canonical(renamed)
    assert triage.canonical(spec) != triage.canonical(_chain(["tanh", "relu"]))


def test_layer_is_named_from_the_flows_that_fail():
    baselines = {
        "portable": None,
        "xnnpack": "portable",
        "coreai": "portable",
        "xnnpack+fold": "xnnpack",
        "coreai+multifunction": "coreai",
    }
    assert triage.layer({"portable": "mismatch", "xnnpack": "mismatch"}, baselines).startswith("export / EXIR")
    assert triage.layer({"xnnpack": "mismatch", "xnnpack+fold": "mismatch"}, baselines) == "xnnpack backend"
    assert triage.layer({"xnnpack+fold": "mismatch"}, baselines) == "candidate xnnpack+fold"
    assert (
        triage.layer({"coreai": "lowering error", "xnnpack+fold": "mismatch"}, baselines)
        == "candidate xnnpack+fold and coreai backend"
    )


def test_shrunk_spec_is_one_minimal():
    """The 'defect': a float16 tanh after a relu on an input with 8 columns.
    Every single step from the result that still builds makes it pass."""

    def still_fails(spec):
        ops = [n["op"] for _, n in specmod.all_nodes(spec)]
        inp = spec["methods"]["forward"]["inputs"][0]
        return "tanh" in ops and "relu" in ops and inp["dtype"] == "float16" and inp["shape"][-1] == 8

    start = _chain(["sigmoid", "relu", "abs", "tanh", "neg", "exp_bounded"], shape=(6, 8), dtype="float16")
    result = shrink.shrink_to(start, still_fails, log=lambda line: None)
    assert result.one_minimal and still_fails(result.spec)
    assert [n["op"] for _, n in specmod.all_nodes(result.spec)] == ["relu", "tanh"]
    assert result.spec["methods"]["forward"]["inputs"][0]["shape"] == [1, 8]
    tried = [candidate for _, candidate in shrink.candidates(result.spec)]
    assert tried and not any(
        still_fails(shrink.prune(c)) for c in tried if shrink.size(shrink.prune(c)) < shrink.size(result.spec)
    )
    capped = shrink.shrink_to(start, still_fails, log=lambda line: None, max_checks=2)
    assert not capped.one_minimal


def _record(digest: str, ops: list[str], flow="xnnpack", prop="mixed") -> dict:
    return {
        "property": prop,
        "digest": digest,
        "ops": ops,
        "nodes": len(ops),
        "flows": [
            {
                "flow": flow,
                "outcome": "mismatch",
                "known": None,
                "message": "[eager equivalence] FAILED (mismatch): 1 / 4 elements differ",
            }
        ],
    }


def test_a_failure_without_the_defects_ops_is_not_counted_as_that_defect(tmp_path):
    """A second defect with the same message is not hidden behind the first."""
    records = [_record("a", ["relu", "tanh"]), _record("b", ["relu", "sigmoid"]), _record("c", ["tanh"])]
    place = triage.Triage(tmp_path)
    (group,) = place.groups(records).values()
    place.save(
        triage.Defect(
            group.key,
            group.signature,
            "xnnpack",
            "mismatch",
            "mixed",
            "xnnpack backend",
            {"xnnpack": "mismatch"},
            ["tanh"],
            1,
            True,
            "m",
        )
    )
    groups = place.groups(records)
    assert sorted(len(g.members) for g in groups.values()) == [1, 2]
    assert [m["ops"] for m in groups[group.key].members] == [["relu", "tanh"], ["tanh"]]
    (rest,) = place.pending(groups)
    assert rest.members[0]["ops"] == ["relu", "sigmoid"]


def test_one_defect_seen_through_two_properties_and_two_flows_is_one_report(tmp_path, monkeypatch):
    """An export defect (tests/fixtures/export_defect.py) found by two
    properties on portable and on xnnpack: one shrunk defect, placed in the
    export layer, with both cells; nothing left queued."""
    monkeypatch.setenv("ETPROP_RECORD_ONLY", "1")
    artifacts = tmp_path / "artifacts"
    from etprop import flows

    # A flow only this process knows (as after another test loaded it) is not
    # one the worker can lower: the defect is placed on the worker's flows.
    flows.load_flow_module(str(ROOT / "tests" / "fixtures" / "broken_flows.py"))
    session = Session(artifacts, flow_modules=[EXPORT_DEFECT])
    try:
        first = session.check(_chain(["relu", "abs", "tanh", "sigmoid"]), [flows.get("portable")], "mixed", SINGLE_FLOW)
        second = session.check(
            _chain(["neg", "tanh", "relu"], shape=(3, 5)), [flows.get("xnnpack")], "computed_weights", SINGLE_FLOW
        )
    finally:
        session.close()
    assert first.new_failures and second.new_failures, "record-only checks return their failures"
    defects, queued = Summary.load(artifacts).defects()
    assert not defects and len(queued) == 2

    assert triage.run_queue(artifacts, None, flow_modules=[EXPORT_DEFECT], log=lambda line: None) == 1
    summary = Summary.load(artifacts)
    defects, queued = summary.defects()
    assert not queued and len(defects) == 1
    (defect,) = defects
    assert defect.layer.startswith("export / EXIR"), defect.layer
    assert defect.hits == 2 and defect.cells == {"mixed × portable": 1, "computed_weights × xnnpack": 1}
    shrunk = repro.read(defect.repro)
    assert [n["op"] for _, n in specmod.all_nodes(shrunk["spec"])] == ["tanh"]
    assert shrunk["shrink"]["one_minimal"] and shrunk["shrink"]["nodes_before"] in (3, 4)
    draft = Path(defect.draft).read_text()
    assert "`portable` (mismatch)" in draft and "`xnnpack` (mismatch)" in draft and "```python" in draft
    assert summary.text().index("export / EXIR") < summary.text().index("property x flow: outcomes")


def test_one_program_drawn_for_two_flow_pairs_keeps_two_histories(tmp_path):
    """Properties draw the same programs for every flow (pair): each failure's
    representative must be the file of its own flows."""
    first = _record("same", ["tanh"], flow="xnnpack")
    second = _record("same", ["tanh"], flow="coreai")
    groups = triage.Triage(tmp_path).groups([first, second])
    paths = {g.flow: g.representative["repro"] for g in groups.values()}
    assert paths["xnnpack"] != paths["coreai"] and "xnnpack" in paths["xnnpack"] and "coreai" in paths["coreai"]


def test_failures_outside_a_merged_defect_stay_with_their_own_flow(tmp_path):
    """Residues of a defect seen on two flows form one group per flow: a
    group is shrunk on its own flow's program."""
    records = [
        _record("a", ["tanh"], flow="xnnpack"),
        _record("b", ["tanh"], flow="portable"),
        _record("c", ["relu"], flow="xnnpack"),
        _record("d", ["relu"], flow="portable"),
    ]
    place = triage.Triage(tmp_path)
    keys = {g.flow: g.key for g in place.groups(records).values()}
    place.save(
        triage.Defect(
            keys["xnnpack"],
            "s",
            "xnnpack",
            "mismatch",
            "mixed",
            "export",
            {},
            ["tanh"],
            1,
            True,
            "m",
            merged=[keys["portable"]],
        )
    )
    groups = place.groups(records)
    assert [m["flow"] for m in groups[keys["xnnpack"]].members] == ["xnnpack", "portable"]
    rest = place.pending(groups)
    assert sorted(g.flow for g in rest) == ["portable", "xnnpack"]
    assert all(m["flow"] == g.flow for g in rest for m in g.members)


class _Result:
    def __init__(self, flow, message):
        from etprop.verdicts.outcomes import Outcome

        self.flow, self.message, self.known, self.outcome = flow, message, None, Outcome.MISMATCH


class _FakeSession:
    """A program holding a tanh fails on the one flow it is run on; the run on
    every flow (placing a defect) finds nothing, so only canonical equality can merge."""

    def available_flows(self):
        return ["portable", "xnnpack"]

    def run(self, spec, flows, prop, oracles, attribute=False):
        failing = len(flows) == 1 and any(n["op"] == "tanh" for _, n in specmod.all_nodes(spec))

        class Example:
            results = (
                [_Result(flows[0].name, "[eager equivalence] FAILED (mismatch): 1 / 4 elements differ")]
                if failing
                else []
            )

        return Example()


def test_a_group_shrinking_to_another_defects_program_merges_into_it(tmp_path):
    """Two groups (two flows) whose programs shrink to one program, names
    aside: one defect, with the hits of both; the second writes no defect."""
    from etprop.verdicts.check import Artifacts

    records = [_record("a", ["relu", "tanh"], flow="xnnpack"), _record("b", ["tanh", "abs"], flow="portable")]
    for record, ops, name in zip(records, (["relu", "tanh"], ["tanh", "abs"]), ("x", "inp")):
        spec = json.loads(json.dumps(_chain(ops)).replace('"x"', f'"{name}"'))
        path = Artifacts(tmp_path).history_path("mixed", [record["flows"][0]["flow"]], record["digest"])
        repro.write(path, spec, [record["flows"][0]["flow"]], "mixed", "mismatch", "m", script=False)
    place = triage.Triage(tmp_path)
    first, second = sorted(place.groups(records).values(), key=lambda g: g.flow != "xnnpack")
    placed = triage.triage_group(place, first, _FakeSession(), None, log=lambda line: None)
    assert placed.ops == ["tanh"] and placed.nodes == 1 and placed.key == first.key
    merged = triage.triage_group(place, second, _FakeSession(), None, log=lambda line: None)
    assert merged.key == first.key and second.key in merged.merged
    assert set(place.defects()) == {first.key}
    groups = place.groups(records)
    assert list(groups) == [first.key] and len(groups[first.key].members) == 2 and not place.pending(groups)


def test_a_claim_left_by_a_stopped_worker_is_taken_over(tmp_path):
    """A campaign stops its triage workers at the end of its budget; their
    groups must be claimable by the next one, not locked for hours."""
    import subprocess
    import sys

    queue = triage.Triage(tmp_path)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert queue.claim("group")
    (queue.directory("group") / "claim").write_text(f"{gone.pid} {__import__('socket').gethostname()}\n")
    assert queue.claim("group"), "a claim whose worker is gone still locks its group"
    assert not queue.claim("group"), "a live worker's claim was taken over"


def test_one_defect_placed_twice_by_two_workers_is_listed_once(tmp_path):
    """Two workers shrink two groups of one defect at once and each places
    it: the defect another lists as seen elsewhere folds into it, and so does
    one whose minimal program equals another's after renaming."""
    place = triage.Triage(tmp_path)
    spec = _chain(["relu", "tanh"])
    renamed = json.loads(json.dumps(spec).replace('"v0"', '"first"'))

    def placed(key, program, merged):
        place.save(
            triage.Defect(
                key,
                f"{key} | lowering error | lowering | E",
                key,
                "lowering error",
                "mixed",
                "export",
                {},
                ["relu", "tanh"],
                2,
                True,
                "E",
                merged=merged,
            )
        )
        repro.write(
            place.directory(key) / "shrunk.json", program, ["portable"], "mixed", "lowering error", "E", script=False
        )

    placed("aaaa", spec, ["bbbb"])
    placed("bbbb", renamed, ["aaaa"])
    placed("cccc", _chain(["sigmoid"]), [])
    defects = place.defects()
    assert set(defects) == {"aaaa", "cccc"} and defects["aaaa"].merged == ["bbbb"]
    placed("dddd", _chain(["exp"]), [])
    placed("eeee", _chain(["neg"]), ["dddd"])
    defects = place.defects()
    assert "dddd" not in defects and "dddd" in defects["eeee"].merged
    assert defects["cccc"].merged == []


def test_a_group_whose_shrunk_program_a_finding_explains_is_a_hit_of_it(tmp_path, monkeypatch):
    """A failure first seen beside many recorded causes is new until shrunk;
    the minimal program is attributed afresh, and when one finding's cause
    explains it the group is that finding's hit, the shrunk program its evidence."""
    from etprop.verdicts.check import Artifacts

    record = _record("a", ["relu", "tanh"])
    path = Artifacts(tmp_path).history_path("mixed", ["xnnpack"], "a")
    repro.write(path, _chain(["relu", "tanh"]), ["xnnpack"], "mixed", "mismatch", "m", script=False)
    minimal = _chain(["tanh"])
    monkeypatch.setattr(shrink, "shrink_to", lambda spec, *args, **kwargs: shrink.Shrunk(minimal, 3, True))

    class Attributing(_FakeSession):
        def run(self, spec, flows, prop, oracles, attribute=False):
            example = super().run(spec, flows, prop, oracles, attribute)
            for result in example.results:
                result.known = "XNN-001" if attribute and spec == minimal else None
            return example

    place = triage.Triage(tmp_path)
    (group,) = place.groups([record]).values()
    defect = triage.triage_group(place, group, Attributing(), None, log=lambda line: None)
    assert defect.known == "XNN-001" and defect.nodes == 1
    assert repro.read(place.directory(group.key) / "shrunk.json")["spec"] == minimal
    summary = Summary([record], tmp_path)
    assert "0 new failing flow results" in summary.headline() and "1 hits on known findings" in summary.headline()
