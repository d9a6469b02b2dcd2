"""Mutation analysis of a campaign's corpus: the semantic mutant catalogue is
generated from the whole vocabulary, a campaign keeps the lowered outputs it
needs, and a mutant is killed only through the suite's own oracle."""

import json

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from etprop import flows
from etprop.oracles.sets import SINGLE_FLOW
from etprop.program import semantic_mutants
from etprop.program.semantic_mutants import ARGUMENTS, LAYER_ARGUMENTS, OPERAND_ATTRS, Mutant, catalogue
from etprop.program.spec import FORMAT, all_nodes
from etprop.program.vocabulary import CONTROL_FLOW_OPS, OPS
from etprop.verdicts.check import Artifacts, finish, run_example
from etprop.verdicts.mutation_score import load_corpus, score


def test_every_op_of_the_vocabulary_has_its_arguments_listed():
    assert set(OPS) - {"layer", "buffer_update"} == set(ARGUMENTS)
    ops_in_catalogue = {m.op for m in catalogue()}
    assert set(ARGUMENTS) <= ops_in_catalogue
    assert {f"layer:{t}" for t in LAYER_ARGUMENTS} <= ops_in_catalogue


def test_the_arguments_listed_are_every_argument_the_strategies_draw():
    """Nothing the generator draws is left out of the catalogue by hand."""
    from etprop.strategies.control_flow import control_flow_programs
    from etprop.strategies.programs import computed_weight_programs, multi_method_programs, programs

    drawn_attrs, drawn_kwargs = set(), set()

    @settings(max_examples=150, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        spec=st.one_of(
            programs(min_nodes=6, max_nodes=30),
            control_flow_programs(),
            computed_weight_programs(),
            multi_method_programs(),
        )
    )
    def collect(spec):
        for _, node in all_nodes(spec):
            if node["op"] in CONTROL_FLOW_OPS or node["op"] in ("layer", "buffer_update"):
                continue
            drawn_attrs.update((node["op"], name) for name in node.get("attrs", {}) if name not in OPERAND_ATTRS)
        for entry in spec["state"].values():
            if entry["kind"] == "layer":
                drawn_kwargs.update((entry["type"], name) for name in entry["kwargs"])

    collect()
    assert drawn_attrs and drawn_kwargs
    missing = {(op, name) for op, name in drawn_attrs if name not in ARGUMENTS[op]}
    missing |= {(t, name) for t, name in drawn_kwargs if name not in LAYER_ARGUMENTS[t]}
    assert not missing, f"drawn but not in the mutant catalogue: {sorted(missing)}"


def _corpus_spec():
    """sub(x, y) -> mean over dim 1 -> relu, and add(x, y) beside it."""
    inputs = [{"name": "x", "shape": [3, 4], "dtype": "float32"}, {"name": "y", "shape": [3, 4], "dtype": "float32"}]
    return {
        "format": FORMAT,
        "state": {},
        "methods": {
            "forward": {
                "inputs": inputs,
                "nodes": [
                    {"id": "v0", "op": "sub", "args": ["x", "y"]},
                    {"id": "v1", "op": "mean", "args": ["v0"], "attrs": {"dim": 1, "keepdim": True}},
                    {"id": "v2", "op": "relu", "args": ["v1"]},
                    {"id": "v3", "op": "add", "args": ["x", "y"]},
                ],
                "outputs": ["v2", "v3"],
            }
        },
    }


def test_a_corpus_kills_visible_mutants_and_calls_invisible_ones_equivalent(tmp_path):
    artifacts = Artifacts(tmp_path)
    example = run_example(_corpus_spec(), [flows.get("portable")], "mixed", SINGLE_FLOW, artifacts)
    assert example.results[0].outcome.value == "pass"
    finish(example, ["portable"], artifacts)
    entries, skipped = load_corpus(tmp_path, None)
    assert len(entries) == 1 and entries[0]["flows"]["portable"]["cases"]
    mutants = [
        Mutant("sub", "swap_operands"),
        Mutant("add", "swap_operands"),
        Mutant("sub", "relative", "add"),
        Mutant("mean", "other_axis"),
        Mutant("mean", "ignore_argument", "keepdim"),
        Mutant("relu", "relative", "leaky_relu"),
        Mutant("conv2d", "ignore_argument", "stride"),
    ]
    rows = {row["mutant"].name: row["status"] for row in score(entries, mutants, None)}
    assert rows == {
        "sub swap_operands": "killed",
        "add swap_operands": "equivalent",
        "sub relative add": "killed",
        "mean other_axis": "killed",
        "mean ignore_argument keepdim": "killed",
        "relu relative leaky_relu": "killed",
        "conv2d ignore_argument stride": "never drawn",
    }


def test_a_mutant_that_changes_a_shape_is_judged_in_the_shape_the_graph_declares(tmp_path):
    """A slice whose start a backend ignores is longer, and the parameter
    multiplied into it no longer broadcasts: written into the buffer of the
    declared shape, its values still differ, so the mutant is killed. A
    batched product read as ``mm`` cannot even run: that survivor's reason is
    a shape, not an argument left at its default."""
    spec = {
        "format": FORMAT,
        "state": {
            "p": {"kind": "parameter", "shape": [2], "seed": 1, "scale": 1.0},
            "m": {"kind": "weight", "shape": [4, 5], "seed": 2, "scale": 0.3},
        },
        "methods": {
            "forward": {
                "inputs": [
                    {"name": "x", "shape": [3, 4], "dtype": "float32"},
                    {"name": "z", "shape": [2, 3, 4], "dtype": "float32"},
                ],
                "nodes": [
                    {"id": "v0", "op": "slice", "args": ["x"], "attrs": {"dim": 1, "start": 1, "end": 3, "step": 1}},
                    {"id": "v1", "op": "mul", "args": ["v0"], "state": "p"},
                    {"id": "v2", "op": "matmul", "args": ["z"], "state": "m"},
                ],
                "outputs": ["v1", "v2"],
            }
        },
    }
    artifacts = Artifacts(tmp_path)
    example = run_example(spec, [flows.get("portable")], "mixed", SINGLE_FLOW, artifacts)
    assert example.results[0].outcome.value == "pass"
    finish(example, ["portable"], artifacts)
    entries, _ = load_corpus(tmp_path, None)
    rows = {
        row["mutant"].name: row
        for row in score(
            entries,
            [
                Mutant("slice", "ignore_argument", "start"),
                Mutant("slice", "ignore_argument", "step"),
                Mutant("matmul", "relative", "mm"),
            ],
            None,
        )
    }
    start, step = rows["slice ignore_argument start"], rows["slice ignore_argument step"]
    as_mm = rows["matmul relative mm"]
    assert start["status"] == "killed"
    assert (step["status"], step["held"], step["programs"], step["unbuilt"]) == ("never drawn", 1, 0, 0)
    assert (as_mm["status"], as_mm["held"], as_mm["programs"], as_mm["unbuilt"]) == ("never drawn", 1, 1, 1)


def test_the_limit_counts_only_programs_in_a_form_the_mutant_changes(tmp_path):
    """A corpus whose first programs hold ``mul`` with one parameter, and a
    later one with a same-shaped twin: with a limit of one program per
    mutant, the swapped weight is still tried on the twin and killed."""

    def spec(twins: bool, seed: int) -> dict:
        state = {"p": {"kind": "parameter", "shape": [4], "seed": seed, "scale": 1.0}}
        nodes = [{"id": "v0", "op": "mul", "args": ["x"], "state": "p"}]
        if twins:
            state["q"] = {"kind": "parameter", "shape": [4], "seed": seed + 1, "scale": 1.0}
            nodes.append({"id": "v1", "op": "mul", "args": ["x"], "state": "q"})
        return {
            "format": FORMAT,
            "state": state,
            "methods": {
                "forward": {
                    "inputs": [{"name": "x", "shape": [3, 4], "dtype": "float32"}],
                    "nodes": nodes,
                    "outputs": [node["id"] for node in nodes],
                }
            },
        }

    artifacts = Artifacts(tmp_path)
    for program in (spec(False, 1), spec(False, 2), spec(True, 3)):
        example = run_example(program, [flows.get("portable")], "mixed", SINGLE_FLOW, artifacts)
        assert example.results[0].outcome.value == "pass"
        finish(example, ["portable"], artifacts)
    entries, _ = load_corpus(tmp_path, None)
    assert len(entries) == 3
    (row,) = score(entries, [Mutant("mul", "swap_weight")], 1)
    assert (row["status"], row["held"], row["programs"], row["examples"]) == ("killed", 3, 1, 3)


def test_mutants_whose_plain_reset_pytorch_rejects_are_realised_as_the_backend_would_compute_them(tmp_path):
    """A grouped convolution whose groups a backend ignores (every group
    reading the first group's channels), ``linear`` read as ``matmul`` on a
    non-square weight with a bias, a convolution read as its transposed
    relative, a clamp whose only bound is ignored, a resize whose
    interpolating mode is ignored: each builds and is killed."""
    spec = {
        "format": FORMAT,
        "state": {
            "w": {"kind": "weight", "shape": [4, 2, 3, 3], "seed": 2, "scale": 0.3},
            "l": {"kind": "weight", "shape": [3, 5], "seed": 3, "scale": 0.4},
            "b": {"kind": "weight", "shape": [3], "seed": 4, "scale": 0.4},
            "c": {"kind": "weight", "shape": [6, 4, 2], "seed": 5, "scale": 0.3},
        },
        "methods": {
            "forward": {
                "inputs": [
                    {"name": "y", "shape": [1, 4, 5, 5], "dtype": "float32"},
                    {"name": "x", "shape": [2, 5], "dtype": "float32"},
                    {"name": "s", "shape": [1, 4, 6], "dtype": "float32"},
                ],
                "nodes": [
                    {"id": "v0", "op": "conv2d", "args": ["y"], "state": "w", "attrs": {"groups": 2}},
                    {"id": "v1", "op": "linear", "args": ["x"], "state": "l", "attrs": {"bias_state": "b"}},
                    {"id": "v2", "op": "conv1d", "args": ["s"], "state": "c", "attrs": {"padding": "same"}},
                    {"id": "v3", "op": "clamp", "args": ["v1"], "attrs": {"min": 0.1}},
                    {
                        "id": "v4",
                        "op": "interpolate",
                        "args": ["y"],
                        "attrs": {"mode": "bilinear", "align_corners": True, "size": [3, 4]},
                    },
                ],
                "outputs": ["v0", "v2", "v3", "v4"],
            }
        },
    }
    artifacts = Artifacts(tmp_path)
    example = run_example(spec, [flows.get("portable")], "mixed", SINGLE_FLOW, artifacts)
    assert example.results[0].outcome.value == "pass"
    finish(example, ["portable"], artifacts)
    entries, _ = load_corpus(tmp_path, None)
    mutants = [
        Mutant("conv2d", "ignore_argument", "groups"),
        Mutant("linear", "relative", "matmul"),
        Mutant("conv1d", "relative", "conv_transpose1d"),
        Mutant("clamp", "ignore_argument", "min"),
        Mutant("interpolate", "ignore_argument", "mode"),
    ]
    rows = {row["mutant"].name: row["status"] for row in score(entries, mutants, None)}
    assert rows == {mutant.name: "killed" for mutant in mutants}


def test_an_argument_drawn_only_in_some_dtypes_is_scored_only_in_those():
    antialias = Mutant("interpolate", "ignore_argument", "antialias")
    assert antialias.drawn_in("float32") and not antialias.drawn_in("float16")
    assert not antialias.drawn_in("bfloat16") and Mutant("interpolate", "ignore_argument", "mode").drawn_in("float16")
    entries = [{"spec": {"dtype": "float16", "state": {}, "methods": {}}, "index": 1}]
    assert [
        row["mutant"].name for row in score(entries, [antialias, Mutant("relu", "relative", "leaky_relu")], None)
    ] == ["relu relative leaky_relu"]


def test_a_fitted_form_writes_the_mutated_result_into_the_declared_shape():
    from etprop.program import builder
    from etprop.program.semantic_mutants import node_shapes

    spec = {
        "format": FORMAT,
        "state": {},
        "methods": {
            "forward": {
                "inputs": [{"name": "x", "shape": [2, 3], "dtype": "float32"}],
                "nodes": [
                    {"id": "v0", "op": "sum", "args": ["x"], "attrs": {"dim": 1, "keepdim": True}},
                    {"id": "v1", "op": "add", "args": ["v0", "x"]},
                ],
                "outputs": ["v1"],
            }
        },
    }
    built = builder.build(spec)
    x = built.inputs("forward")
    assert node_shapes(built, {"forward": x}) == {("forward", "v0"): (2, 1), ("forward", "v1"): (2, 3)}
    variants = list(Mutant("sum", "other_axis").variants(spec, node_shapes(built, {"forward": x})))
    fitted = [v for v in variants if "fit_shape" in v["methods"]["forward"]["nodes"][0]["attrs"]]
    assert len(fitted) == len(variants) // 2
    (over_rows,) = [v for v in fitted if v["methods"]["forward"]["nodes"][0]["attrs"]["dim"] in (0, -2)]
    assert over_rows["methods"]["forward"]["nodes"][0]["attrs"]["fit_shape"] == [2, 1]
    (out,) = builder.build(over_rows).eager("forward", x)
    column_sums = x[0].sum(dim=0)
    torch.testing.assert_close(out, column_sums[:2].reshape(2, 1) + x[0])


def test_a_layer_whose_stride_a_backend_ignores_is_killed_in_its_declared_shape(tmp_path):
    """A strided convolution layer computed at stride 1 is bigger than the
    graph declares; its fitted form keeps the declared shape through the
    jittered reference too, so the stored output kills it."""
    spec = {
        "format": FORMAT,
        "state": {
            "c": {
                "kind": "layer",
                "type": "Conv2d",
                "seed": 3,
                "kwargs": {"in_channels": 2, "out_channels": 3, "kernel_size": 3, "stride": 2},
            }
        },
        "methods": {
            "forward": {
                "inputs": [{"name": "x", "shape": [1, 2, 7, 7], "dtype": "float32"}],
                "nodes": [
                    {"id": "v0", "op": "layer", "args": ["x"], "state": "c"},
                    {"id": "v1", "op": "relu", "args": ["v0"]},
                ],
                "outputs": ["v1"],
            }
        },
    }
    artifacts = Artifacts(tmp_path)
    example = run_example(spec, [flows.get("portable")], "mixed", SINGLE_FLOW, artifacts)
    assert example.results[0].outcome.value == "pass"
    finish(example, ["portable"], artifacts)
    entries, _ = load_corpus(tmp_path, None)
    (row,) = score(entries, [Mutant("layer:Conv2d", "ignore_argument", "stride")], None)
    assert row["status"] == "killed"


def test_a_stored_output_that_already_has_the_mutants_fault_does_not_kill_it(tmp_path):
    """The kill is the oracle's verdict on the stored outputs: outputs of a
    lowering that computes the mutated program pass against its reference."""
    mutated = _corpus_spec()
    mutated["methods"]["forward"]["nodes"][0]["args"] = ["y", "x"]
    artifacts = Artifacts(tmp_path)
    example = run_example(mutated, [flows.get("portable")], "mixed", SINGLE_FLOW, artifacts)
    finish(example, ["portable"], artifacts)
    entries, _ = load_corpus(tmp_path, None)
    entries[0]["spec"] = _corpus_spec()  # the corpus claims the unmutated program
    (row,) = score(entries, [Mutant("sub", "swap_operands")], None)
    assert row["status"] == "survived"


def test_mutant_variants_change_only_their_op():
    spec = _corpus_spec()
    (variant,) = list(Mutant("sub", "relative", "add").variants(spec))
    ops = [node["op"] for _, node in all_nodes(variant)]
    assert ops == ["add", "mean", "relu", "add"]
    (misread,) = list(Mutant("mean", "misread_argument", "dim").variants(spec))[:1]
    assert [n.get("attrs") for _, n in all_nodes(misread)][1] == {"dim": 2, "keepdim": True}
    assert ARGUMENTS["mean"]["dim"] is semantic_mutants.REQUIRED


def test_the_scorer_leaves_out_only_programs_that_write_a_buffer_in_place(tmp_path):
    """A neutralized program whose buffer update is out of place is a plain
    function of its inputs and is scored; one that writes in place is not."""
    import torch

    spec = _corpus_spec()
    spec["state"] = {"b": {"kind": "buffer", "shape": [3, 4], "seed": 1, "scale": 1.0, "mutable": True}}
    spec["methods"]["forward"]["nodes"].append({"id": "v4", "op": "buffer_update", "args": ["v3"], "state": "b"})
    out_of_place = json.loads(json.dumps(spec))
    out_of_place["state"]["b"]["mutable"] = False
    out_of_place["methods"]["forward"]["nodes"][-1]["attrs"] = {"in_place": False}
    (tmp_path / "corpus").mkdir()
    for name, program in (("in_place", spec), ("out_of_place", out_of_place)):
        torch.save(
            {
                "spec": program,
                "property": "mixed",
                "recorded": 1.0,
                "seconds": 1.0,
                "flows": {"portable": {"runtime": None, "cases": []}},
            },
            tmp_path / "corpus" / f"{name}.pt",
        )
    entries, skipped = load_corpus(tmp_path, None)
    assert [entry["spec"] for entry in entries] == [out_of_place]
    assert skipped == {"stateful (mutable buffers)": 1}


def test_a_mutant_whose_reference_cannot_run_survives_and_the_score_goes_on(tmp_path, monkeypatch):
    """A variant that builds and runs in float64 but whose jittered reference
    raises (an argument reset out of the layer's range) is not killed, and
    the mutants after it are still scored."""
    from etprop.verdicts import mutation_score

    artifacts = Artifacts(tmp_path)
    example = run_example(_corpus_spec(), [flows.get("portable")], "mixed", SINGLE_FLOW, artifacts)
    finish(example, ["portable"], artifacts)
    entries, _ = load_corpus(tmp_path, None)
    judged = mutation_score.killed_by

    def killed_by(program, built):
        if "leaky_relu" in built.source:
            raise RuntimeError("output padding must be smaller than either stride or dilation")
        return judged(program, built)

    monkeypatch.setattr(mutation_score, "killed_by", killed_by)
    rows = {
        row["mutant"].name: row["status"]
        for row in score(entries, [Mutant("relu", "relative", "leaky_relu"), Mutant("sub", "swap_operands")], None)
    }
    assert rows == {"relu relative leaky_relu": "survived", "sub swap_operands": "killed"}


@st.composite
def _twin_programs(draw):
    from etprop.strategies.graph import ProgramDraft
    from etprop.strategies.ops import draw_parallel_twins
    from etprop.strategies.programs import _spec, method_body

    program = ProgramDraft(dtype="float32")
    body = draw(method_body(program, 1, 1, [("parallel_twins", draw_parallel_twins)]))
    return _spec(program, {"forward": body})


def test_parallel_twins_give_a_gemm_a_twin_whose_swap_shows():
    """Two ops of one configuration, each with its own parameters, combined
    so that a backend reading one weight for the other changes the result."""
    from etprop.program import builder, mutants

    shown = []

    @settings(max_examples=80, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(spec=_twin_programs())
    def check(spec):
        gemms = [node for _, node in all_nodes(spec) if node.get("state")]
        if len(gemms) < 2:  # the first GEMM did not fit the input
            return
        first, second = gemms[:2]
        assert first["state"] != second["state"] and first["op"] == second["op"]
        entries = [{k: v for k, v in spec["state"][node["state"]].items() if k != "seed"} for node in gemms[:2]]
        assert entries[0] == entries[1]
        op = f"layer:{entries[0]['type']}" if first["op"] == "layer" else first["op"]
        (variant,) = list(Mutant(op, "swap_weight").variants(spec))
        original, swapped = builder.build(spec), builder.build(variant)
        held = getattr(original.module, first["state"])
        if isinstance(held, torch.nn.Module) and not [*held.parameters(), *held.buffers()]:
            return  # a norm without affine parameters: twins that cannot differ
        inputs = original.inputs("forward")
        before = [t.double() for t in original._wide("forward", inputs, True)]
        after = [t.double() for t in swapped._wide("forward", inputs, True)]
        visible = any(mutants.visible(a, b, torch.float32) for a, b in zip(before, after))
        if op in ("maximum", "minimum") and not visible:
            return  # the input exceeds (or stays under) both twins' parameters: they cannot differ
        assert visible
        shown.append(op)

    check()
    assert len(shown) >= 8 and len(set(shown)) >= 4, shown


def test_a_drawn_divisor_stays_away_from_zero():
    from etprop.program import builder

    spec = {
        "format": FORMAT,
        "state": {"d": {"kind": "buffer", "shape": [64], "seed": 3, "scale": 1.0, "min_abs": 0.5}},
        "methods": {
            "forward": {
                "inputs": [{"name": "x", "shape": [2, 64], "dtype": "float32"}],
                "nodes": [{"id": "v0", "op": "div", "args": ["x"], "state": "d", "attrs": {"rounding_mode": "floor"}}],
                "outputs": ["v0"],
            }
        },
    }
    divisor = builder.build(spec).module.d
    assert divisor.abs().min() >= 0.5 and (divisor < 0).any() and (divisor > 0).any()
    spec["state"]["d"].pop("min_abs")
    assert builder.build(spec).module.d.abs().min() < 0.5
