"""Specs are data: lossless JSON round trip, clear errors, deterministic builds,
and every strategy family draws programs torch.export accepts."""

import json
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings

from etprop.errors import UsageError
from etprop.lowering import pipeline
from etprop.program import builder
from etprop.program import spec as specmod
from etprop.strategies import sizes
from etprop.strategies.programs import computed_weight_programs, programs


@settings(max_examples=60, deadline=None, database=None, derandomize=True)
@given(spec=programs())
def test_json_round_trip_is_lossless(spec):
    text = specmod.dumps(spec)
    assert specmod.loads(text) == spec
    assert specmod.dumps(specmod.loads(text)) == text


@settings(max_examples=25, deadline=None, database=None, derandomize=True)
@given(spec=programs(max_nodes=12))
def test_builder_is_deterministic(spec):
    first, second = builder.build(spec), builder.build(spec)
    assert first.source == second.source
    for (name, a), (_, b) in zip(first.module.state_dict().items(), second.module.state_dict().items()):
        assert torch.equal(a, b), name
    inputs = first.inputs("forward")
    for a, b in zip(first.eager("forward", inputs), second.eager("forward", inputs)):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize(
    "family", [programs(max_nodes=16), computed_weight_programs(max_nodes=8)], ids=["mixed", "computed_weights"]
)
def test_every_family_draws_exportable_programs(family):
    @settings(max_examples=12, deadline=None, database=None, derandomize=True)
    @given(spec=family)
    def exportable(spec):
        exported = pipeline.export_program(builder.build(spec))
        assert set(exported) == set(spec["methods"])

    exportable()


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda s: s.update(format="other/9"), "spec format"),
        (lambda s: s["methods"]["forward"]["nodes"][0].update(op="frobnicate"), "unknown op 'frobnicate'"),
        (lambda s: s["methods"]["forward"]["nodes"][1].update(args=["nowhere"]), "reads 'nowhere' before"),
        (lambda s: s["methods"]["forward"]["nodes"][0].update(state="missing"), "unknown state 'missing'"),
        (lambda s: s["methods"]["forward"].update(outputs=[]), "outputs: \\[\\] should be non-empty"),
    ],
)
def test_invalid_specs_name_the_problem(tiny_spec, mutate, message):
    mutate(tiny_spec)
    with pytest.raises(UsageError, match=message):
        specmod.validate(tiny_spec)


def test_truncated_json_is_a_clear_error(tiny_spec):
    text = specmod.dumps(tiny_spec)
    with pytest.raises(UsageError, match="truncated"):
        specmod.loads(text[: len(text) // 2])


def test_generated_source_is_standalone(tiny_spec):
    """The source imports nothing of etprop: it is what a repro script embeds."""
    source = builder.render_source(tiny_spec)
    assert "etprop" not in source
    namespace = {}
    exec(compile(source, "<repro>", "exec"), namespace)
    module = namespace["Program"]().eval()
    x = namespace["make_input"]((2, 8), "float32", "normal", 0)
    assert module.forward(x)[0].shape == (2, 4)
    assert json.loads(json.dumps(namespace["INPUTS"])) == {"forward": tiny_spec["methods"]["forward"]["inputs"]}


def _is_dynamic(spec):
    return any(inp.get("dynamic") for inp in spec["methods"]["forward"]["inputs"])


def test_dynamic_batch_programs_export_and_run_at_both_bounds():
    from hypothesis import find

    spec = find(
        programs(min_nodes=3, max_nodes=10, dynamic_batch=True),
        _is_dynamic,
        settings=settings(database=None, derandomize=True, max_examples=500),
    )
    built = builder.build(spec)
    exported = pipeline.export_program(built)["forward"].module()
    ((dim, low, high),) = spec["methods"]["forward"]["inputs"][0]["dynamic"]
    labels = [label for label, _ in built.input_cases("forward")]
    assert labels[-2:] == ["normal at the min dynamic sizes", "normal at the max dynamic sizes"]
    for extent, size in (("min", low), ("max", high)):
        inputs = built.inputs("forward", extent=extent)
        assert inputs[0].shape[dim] == size
        for want, got in zip(built.eager("forward", inputs), exported(*inputs)):
            torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_programs_build_in_their_dtype(dtype):
    @settings(max_examples=8, deadline=None, database=None, derandomize=True)
    @given(spec=programs(max_nodes=10, dtype=dtype))
    def in_dtype(spec):
        assert spec["dtype"] == dtype
        built = builder.build(spec)
        assert all(
            t.dtype == getattr(torch, dtype) for t in built.module.state_dict().values() if t.is_floating_point()
        )
        inputs = built.inputs("forward")
        assert all(x.dtype == getattr(torch, dtype) for x in inputs)
        pipeline.export_program(built)

    in_dtype()


def test_a_method_where_no_node_fits_still_gets_an_output():
    """An input larger than drawn ops accept (4 x 12 x 12 x 12 elements) and
    no node drawn: the method outputs one relu of it, not a generator crash."""
    from hypothesis import strategies as st

    from etprop.program import spec as specmod
    from etprop.strategies.graph import GraphDraft, ProgramDraft, Value
    from etprop.strategies.programs import finish_method

    @settings(max_examples=1, database=None)
    @given(st.just(None))
    def drawn(_):
        program = ProgramDraft()
        body = finish_method(GraphDraft(program, [Value(program.fresh("x"), (4, 12, 12, 12))]))
        assert [node["op"] for node in body["nodes"]] == ["relu"] and body["outputs"] == [body["nodes"][0]["id"]]
        specmod.validate({"format": specmod.FORMAT, "state": program.state, "methods": {"forward": body}})

    drawn()


def test_neutralizations_of_one_layer_compose():
    """Findings nominated together rewrite one layer with all their attributes:
    each applies to the layer type it names (a batch norm by hand, a group
    norm in two passes), none is dropped because another is present."""
    from etprop.program.builder import render_source

    def norm_program(layer_type, kwargs, attrs):
        return {
            "format": specmod.FORMAT,
            "state": {"n": {"kind": "layer", "type": layer_type, "kwargs": kwargs, "seed": 2}},
            "methods": {
                "forward": {
                    "inputs": [{"name": "x", "shape": [2, 4, 3, 3], "dtype": "float32"}],
                    "nodes": [{"id": "v1", "op": "layer", "args": ["x"], "state": "n", "attrs": attrs}],
                    "outputs": ["v1"],
                }
            },
        }

    both = {"two_pass": True, "layer_norm_two_pass": True, "by_hand": True}
    for layer_type, kwargs, alone in (
        ("BatchNorm2d", {"num_features": 4}, {"by_hand": True}),
        ("GroupNorm", {"num_groups": 2, "num_channels": 4}, {"two_pass": True}),
    ):
        combined, single = norm_program(layer_type, kwargs, both), norm_program(layer_type, kwargs, alone)
        assert "batch_norm_by_hand=True" in render_source(combined)
        built, reference = builder.build(combined), builder.build(single)
        inputs = reference.inputs("forward")
        torch.testing.assert_close(built.eager("forward", inputs), reference.eager("forward", inputs), rtol=0, atol=0)
    bn_with_copy = norm_program("BatchNorm2d", {"num_features": 4}, {**both, "input_copy": True})
    assert "x.clone()" in render_source(bn_with_copy)


def test_two_pass_norms_in_half_precision_do_not_overflow():
    """A two-pass norm (an equivalent form neutralizations write) on float16
    values hundreds apart keeps what eager's norm computes: squaring a centered
    half-precision value past 256 overflows, so the form works in float32 as
    eager does and rounds once."""

    def norm_program(layer_type, kwargs, attrs, shape):
        return {
            "format": specmod.FORMAT,
            "dtype": "float16",
            "state": {"n": {"kind": "layer", "type": layer_type, "kwargs": kwargs, "seed": 3}},
            "methods": {
                "forward": {
                    "inputs": [{"name": "x", "shape": shape, "dtype": "float16"}],
                    "nodes": [{"id": "v1", "op": "layer", "args": ["x"], "state": "n", "attrs": attrs}],
                    "outputs": ["v1"],
                }
            },
        }

    for layer_type, kwargs, attrs, shape in (
        ("GroupNorm", {"num_groups": 2, "num_channels": 4}, {"two_pass": True}, [2, 4, 3, 3]),
        ("LayerNorm", {"normalized_shape": [6]}, {"layer_norm_two_pass": True}, [3, 6]),
    ):
        rewritten, plain = (
            builder.build(norm_program(layer_type, kwargs, attrs, shape)),
            builder.build(norm_program(layer_type, kwargs, {}, shape)),
        )
        wide = (torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 400).half()
        [expected] = plain.eager("forward", [wide])
        [got] = rewritten.eager("forward", [wide])
        assert got.dtype == torch.float16 and bool(torch.isfinite(got).all()), layer_type
        torch.testing.assert_close(got, expected, rtol=0, atol=2e-2)


@pytest.fixture
def campaign_sizes():
    sizes.use_campaign_sizes(True)
    yield
    sizes.use_campaign_sizes(False)


@pytest.mark.parametrize("low, high, expected", [(6, 32, (19, 64)), (1, 16, (9, 32)), (0, 5, (8, 16))])
def test_a_campaign_draws_from_the_upper_half_to_twice_the_top(low, high, expected):
    assert sizes.campaign_range(low, high) == expected


def test_campaign_programs_are_bigger_and_ci_draws_are_unchanged(campaign_sizes):
    """The same derandomized draws with and without campaign sizes: the
    campaign's programs are much bigger, and switching back gives CI the same
    programs each time."""

    def drawn(count):
        found = []

        @settings(max_examples=count, deadline=None, database=None, derandomize=True)
        @given(spec=programs(min_nodes=6, max_nodes=32))
        def collect(spec):
            found.append(spec)

        collect()
        return found

    campaign = drawn(30)
    sizes.use_campaign_sizes(False)
    ci, ci_again = drawn(30), drawn(30)
    assert ci == ci_again
    assert mean_ops(campaign) > 1.5 * mean_ops(ci)


def mean_ops(specs):
    return sum(specmod.count_ops(spec) for spec in specs) / len(specs)


def test_the_plugin_gives_fuzz_profiles_campaign_sizes(tmp_path):
    (tmp_path / "test_probe.py").write_text(
        "from etprop.strategies import sizes\ndef test_probe():\n    print('CAMPAIGN', sizes._campaign)\n"
    )
    for profile, chosen, expected in [
        ("fuzz", None, True),
        ("fuzz-noshrink", None, True),
        ("ci", None, False),
        ("dev", None, False),
        ("fuzz", "property", False),
        ("ci", "campaign", True),
    ]:
        extra = ["--etprop-sizes", chosen] if chosen else []
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-s",
                "-p",
                "no:cacheprovider",
                "--etprop-profile",
                profile,
                "--etprop-artifacts",
                str(tmp_path / "artifacts"),
                *extra,
                "test_probe.py",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert f"CAMPAIGN {expected}" in result.stdout, result.stdout + result.stderr
    wrong = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--etprop-sizes", "huge", "test_probe.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert wrong.returncode != 0 and "use 'campaign' or 'property'" in wrong.stderr


def test_a_campaign_draws_quantized_graphs_at_the_property_sizes_and_float_ones_bigger(campaign_sizes, monkeypatch):
    """Quantized lowerings cost two to three times a float one per op, so a
    campaign does not shift their slot ranges up: the same float strategy
    draws past its top alone and stays within it under quantized(). (Slots,
    not nodes: a drawer may add two nodes in one slot.)"""
    from etprop.strategies import programs as programs_module
    from etprop.strategies.programs import quantized

    drawn_slots = []

    def recorded_slot_count(draw, low, high):
        drawn_slots.append(programs_module.sizes.slot_count(draw, low, high))
        return drawn_slots[-1]

    monkeypatch.setattr(programs_module, "slot_count", recorded_slot_count)

    def slots_drawn(strategy, count=25):
        drawn_slots.clear()

        @settings(max_examples=count, deadline=None, database=None, derandomize=True)
        @given(spec=strategy)
        def collect(spec):
            pass

        collect()
        return list(drawn_slots)

    floats = programs(min_nodes=2, max_nodes=6, gemm_heavy=True, dtype="float32")
    assert max(slots_drawn(floats)) > 6
    assert max(slots_drawn(quantized(floats))) <= 6
    assert sizes._shifted, "quantized() left the campaign's ranges unshifted"


def test_the_coverage_pool_is_drawn_at_property_sizes(campaign_sizes):
    from etprop.strategies.coverage_corpus import drawn

    in_campaign = drawn(programs(min_nodes=6, max_nodes=32), 5, seed=3)
    sizes.use_campaign_sizes(False)
    assert in_campaign == drawn(programs(min_nodes=6, max_nodes=32), 5, seed=3)


@pytest.mark.parametrize("shape, dynamic", [([6, -1], False), ([-1, 3, 4], True)])
def test_a_batch_is_made_dynamic_only_where_export_needs_no_guard_on_it(shape, dynamic):
    """(B, 12) -> (6, 2B) makes export guard ``B != 6``, outside what the
    declared range allows (an export error in a campaign's coverage pack);
    a reshape keeping the batch leading needs no guard."""
    from hypothesis import given
    from hypothesis import strategies as st

    from etprop.strategies.programs import ProgramDraft, _make_batch_dynamic

    body = {
        "inputs": [{"name": "x0", "shape": [3, 12], "dtype": "float32"}],
        "nodes": [
            {"id": "v1", "op": "reshape", "args": ["x0"], "attrs": {"shape": shape}},
            {"id": "v2", "op": "sum", "args": ["v1"], "attrs": {"dim": 0}},
        ],
        "outputs": ["v2"],
    }

    @settings(max_examples=1, database=None)
    @given(st.data())
    def made_dynamic(data):
        _make_batch_dynamic(data.draw, ProgramDraft(dtype="float32"), body)

    made_dynamic()
    assert bool(body["inputs"][0].get("dynamic")) == dynamic
    if dynamic:
        spec = {"format": "etprop-spec/1", "methods": {"forward": body}, "state": {}}
        pipeline.export_program(builder.build(spec))


def test_another_batch_past_a_matrix_bias_with_beta_zero_is_rejected():
    """An addmm's (batch, out) bias does not broadcast to another batch, which
    eager refuses even when beta is 0; meta and fake addmm then skip the
    check, so a multi-method program once carried it to PT2E's calibration."""
    from hypothesis import strategies as st

    from etprop.strategies.graph import Value
    from etprop.strategies.programs import ProgramDraft, _reinfer

    program = ProgramDraft(dtype="float32")
    weight = program.add_state("w", {"kind": "weight", "seed": 1, "shape": [10, 3]})
    bias = program.add_state("b", {"kind": "weight", "seed": 2, "shape": [3, 3]})
    body = {
        "inputs": [{"name": "x0", "shape": [3, 10], "dtype": "float32"}],
        "nodes": [
            {"id": "v1", "op": "addmm", "args": ["x0"], "state": weight, "attrs": {"bias_state": bias, "beta": 0.0}}
        ],
        "outputs": ["v1"],
    }
    checked = []

    @settings(max_examples=1, database=None)
    @given(st.just(None))
    def recheck(_):
        checked[:] = [_reinfer(program, body, [Value("x0", (size, 10))]) for size in (3, 6)]

    recheck()
    assert checked == [True, False]


def test_another_batch_reaching_a_convolution_channel_is_rejected():
    """Multi-method programs reuse a graph at another batch size; a view can
    carry the batch into a channel dim (``unsqueeze(0)`` before a
    ConvTranspose1d), where meta kernels infer a shape without checking the
    weight. Such a method would not export: the re-check must refuse it."""
    from hypothesis import strategies as st

    from etprop.strategies.graph import Value
    from etprop.strategies.programs import ProgramDraft, _reinfer

    program = ProgramDraft(dtype="float32")
    layer = program.add_state(
        "l",
        {
            "kind": "layer",
            "type": "ConvTranspose1d",
            "seed": 1,
            "kwargs": {"in_channels": 4, "out_channels": 4, "kernel_size": 1, "groups": 4},
        },
    )
    body = {
        "inputs": [{"name": "x0", "shape": [4, 10], "dtype": "float32"}],
        "nodes": [
            {"id": "v1", "op": "unsqueeze", "args": ["x0"], "attrs": {"dim": 0}},
            {"id": "v2", "op": "layer", "args": ["v1"], "state": layer},
        ],
        "outputs": ["v2"],
    }
    checked = []

    @settings(max_examples=1, database=None)
    @given(st.just(None))
    def recheck(_):  # inference records Hypothesis events: inside a test
        checked[:] = [_reinfer(program, body, [Value("x0", (size, 10))]) for size in (4, 5)]

    recheck()
    assert checked == [True, False]


def test_ci_leaves_a_candidate_flow_only_to_families_whose_differential_property_judges_it():
    """Under the ``ci`` profile a twinned family's single-flow property skips
    candidate flows; that is sound only while the family has a differential
    property, whose oracles contain every single-flow oracle."""
    import inspect

    from etprop import flows
    from etprop.commands import pytest_plugin
    from etprop.oracles.sets import DIFFERENTIAL, SINGLE_FLOW
    from etprop.properties import test_differential, test_quantized

    def family(test) -> str:
        return next(mark.args[0] for mark in getattr(test, "pytestmark", []) if mark.name == "etprop_family")

    assert set(SINGLE_FLOW) <= set(DIFFERENTIAL)
    differential_families = {
        family(test)
        for module in (test_differential, test_quantized)
        for name, test in inspect.getmembers(module, inspect.isfunction)
        if name.startswith("test_") and {"flow_pair", "quantized_flow_group"} & set(inspect.signature(test).parameters)
    }
    assert pytest_plugin.TWINNED_FAMILIES <= differential_families, (
        pytest_plugin.TWINNED_FAMILIES - differential_families
    )
    chosen = [flows.get(name) for name in ("portable", "xnnpack", "xnnpack+fold", "coreai")]
    assert [f.name for f in chosen if pytest_plugin._judged_by_its_twin(f, chosen)] == ["xnnpack+fold"]
    # A candidate whose baseline is not selected has no twin to judge it.
    alone = [flows.get("xnnpack+fold")]
    assert not pytest_plugin._judged_by_its_twin(alone[0], alone)
