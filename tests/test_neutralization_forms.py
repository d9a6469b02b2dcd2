"""Every neutralization computes what the program computed: each rewrite of
etprop/program/neutralize.py, and each equivalent form a renderer writes for
it (etprop/program/vocabulary.py), gives the same values as the plain
program, and keeps its form where its finding does not apply."""

from __future__ import annotations

import copy
import json

import pytest
from attribution_helpers import (
    _effective_weights,
    _equivalent_form,
    _fixture_spec,
    _float_repro_spec,
    _program,
    _repro_spec,
    _state_changes,
    _weight,
)

from etprop.program.neutralize import neutralize
from etprop.program.spec import FORMAT
from etprop.verdicts import known_findings


def test_inlined_control_flow_computes_the_same_values():
    """The equivalent form a control-flow neutralization renders matches the original in eager."""
    import torch

    from etprop.program import builder

    spec = _repro_spec("coreai_control_flow_keyerror.json")
    inlined, changed = neutralize(
        spec, [{"rewrite": "inline_control_flow", "ops": ["cond", "map", "scan", "while_loop"]}]
    )
    assert changed
    original, rewritten = builder.build(spec), builder.build(inlined)
    for method in original.methods:
        inputs = original.inputs(method)
        for want, got in zip(original.eager(method, inputs), rewritten.eager(method, inputs)):
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("inline", [False, True], ids=["cond", "inlined"])
def test_a_predicate_kept_at_its_operands_rank_takes_the_same_branch(inline):
    """XNN-020's neutralization: the mean a cond predicate compares is kept as
    a one-element tensor (never 0-dim); the program computes the same values,
    as torch.cond and in the inlined form."""
    spec = _float_repro_spec("xnnpack_quantized_zero_dim_mean.json")
    if inline:
        spec = neutralize(spec, [{"rewrite": "inline_control_flow", "ops": ["cond"]}])[0]
    _equivalent_form(spec, "XNN-020", "keepdim=True) > ")


def test_a_layer_reading_its_input_through_float64_computes_the_same_values():
    """XNN-026's neutralization: the cast to float64 and back is exact."""
    _equivalent_form(
        _float_repro_spec("xnnpack_float_conv_transpose_reads_dequantized.json"), "XNN-026", ".double().to("
    )


def test_a_transposed_convolution_whose_result_goes_through_float64_computes_the_same_values():
    """XNN-029's neutralization, in the padded form its repro has: the cast to float64 and back is exact."""
    _equivalent_form(_repro_spec("xnnpack_float_conv_transpose_quantized_output.json"), "XNN-029", "via_float64=True)")


@pytest.mark.parametrize("op", ["layer", "conv_transpose1d"])
def test_plain_transposed_convolutions_whose_result_goes_through_float64_compute_the_same_values(op):
    """XNN-029's neutralization on a layer and on the functional op, without
    output padding; only statically quantized programs are rewritten."""
    if op == "layer":
        node = {"id": "v0", "op": "layer", "args": ["x"], "state": "t"}
        state = {
            "t": {
                "kind": "layer",
                "type": "ConvTranspose1d",
                "seed": 1,
                "kwargs": {"in_channels": 4, "out_channels": 8, "kernel_size": 3, "stride": 2, "groups": 4},
            }
        }
    else:
        node = {"id": "v0", "op": "conv_transpose1d", "args": ["x"], "state": "w", "attrs": {"stride": 2, "groups": 2}}
        state = {"w": _weight((4, 3, 3), 1)}
    spec = _program([node, {"id": "v1", "op": "add", "args": ["v0", "v0"]}], state, shape=(1, 4, 5))
    rule = list(next(f for f in known_findings.load() if f.id == "XNN-029").neutralize)
    assert neutralize(spec, rule)[1] == 0, "a float program keeps its form"
    dynamic = {**spec, "format": "etprop-spec/2", "quantization": {"scheme": "dynamic_per_tensor", "calibration": 1}}
    assert neutralize(dynamic, rule)[1] == 0, "dynamic quantization leaves outputs in float"
    quantized = {**dynamic, "quantization": {"scheme": "static_per_tensor", "calibration": 1}}
    _equivalent_form(quantized, "XNN-029", "_via_float64(self." if op == "layer" else "_via_float64(F.")


@pytest.mark.parametrize(
    "layer_type, shape, kwargs",
    [
        ("Conv1d", (1, 4, 7), {"kernel_size": 3, "padding": 1}),
        ("Conv1d", (2, 4, 9), {"kernel_size": 4, "padding": 2, "stride": 2, "dilation": 2, "groups": 2}),
        ("Conv2d", (1, 4, 5, 6), {"kernel_size": [3, 2], "padding": [1, 2], "bias": False}),
        ("Conv2d", (1, 4, 6, 6), {"kernel_size": 3, "padding": "same", "dilation": [2, 1]}),
    ],
)
def test_a_circular_padded_convolution_written_out_computes_the_same_values(layer_type, shape, kwargs):
    """COREAI-017's neutralization: the wrapped slices concatenated on, then
    no padding, give exactly the layer's values in bfloat16; a float32
    program keeps its form."""
    state = {
        "c": {
            "kind": "layer",
            "type": layer_type,
            "seed": 3,
            "kwargs": {"in_channels": 4, "out_channels": 4, "padding_mode": "circular", **kwargs},
        }
    }
    spec = _program([{"id": "v0", "op": "layer", "args": ["x"], "state": "c"}], state, shape=shape)
    rule = list(next(f for f in known_findings.load() if f.id == "COREAI-017").neutralize)
    assert neutralize(spec, rule)[1] == 0, "a float32 program keeps its form"
    spec["dtype"] = spec["methods"]["forward"]["inputs"][0]["dtype"] = "bfloat16"
    _equivalent_form(spec, "COREAI-017", "_conv_circular_padded_explicitly(self.")


def test_frozen_state_keeps_every_value_and_only_stops_autograd():
    """TORCH-003's neutralization: in a program holding a while_loop, each
    layer, weight and parameter (a computed weight's own parameters too) stops
    requiring grad, and the program computes exactly what it did; a program
    without a while_loop keeps its form."""
    import torch

    from etprop.program import builder

    spec = _fixture_spec("torch_export_scan_in_while_loop.json")
    rule = list(next(f for f in known_findings.load() if f.id == "TORCH-003").neutralize)
    rewritten_spec, changed = neutralize(spec, rule)
    assert changed == sum(entry["kind"] in ("layer", "weight", "parameter") for entry in spec["state"].values()) > 0
    original, rewritten = builder.build(spec), builder.build(rewritten_spec)
    assert any(p.requires_grad for p in original.module.parameters())
    assert not any(p.requires_grad for p in rewritten.module.parameters())
    frozen_values = rewritten.module.state_dict()
    assert all(torch.equal(value, frozen_values[name]) for name, value in original.module.state_dict().items())
    for kind in ("normal", "large"):
        inputs = original.inputs("forward", kind)
        for want, got in zip(original.eager("forward", inputs), rewritten.eager("forward", inputs)):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    straight = _program([{"id": "v0", "op": "linear", "args": ["x"], "state": "w"}], {"w": _weight((4, 8), 1)})
    assert neutralize(straight, rule)[1] == 0


def test_a_functional_transposed_convolution_reading_its_input_through_float64_computes_the_same_values():
    """XNN-031's neutralization, in the padded form its repro has: the input cast is rendered, the values exact."""
    _equivalent_form(
        _repro_spec("xnnpack_float_conv_transpose1d_reads_dequantized_load.json"), "XNN-031", ".double().to("
    )


def test_a_transposed_convolution_read_and_written_through_float64_keeps_both_casts():
    """XNN-026's and XNN-029's neutralizations on one padded layer: both casts are rendered, the values exact."""
    import torch

    from etprop.program import builder

    spec = _repro_spec("xnnpack_float_conv_transpose_quantized_output.json")
    both = json.loads(json.dumps(spec))
    both["methods"]["forward"]["nodes"][0]["attrs"].update(input_via_float64=True, output_via_float64=True)
    original, rewritten = builder.build(spec), builder.build(both)
    assert ".double().to(" in rewritten.source and "via_float64=True)" in rewritten.source
    inputs = original.inputs("forward", "normal")
    torch.testing.assert_close(rewritten.eager("forward", inputs), original.eager("forward", inputs), rtol=0, atol=0)


@pytest.mark.parametrize("padding, marker", [("explicit same", "via_float64=True"), (1, "p0_x1.double()")])
def test_a_functional_convolution_reading_its_input_through_float64_computes_the_same_values(padding, marker):
    """XNN-030's neutralization on a functional conv2d: padded or not, what it
    convolves goes through float64 and back, the same values."""
    spec = _fixture_spec("xnnpack_dynamic_conv_after_explicit_padding.json")
    spec["methods"]["forward"]["inputs"][0]["shape"] = [1, 3, 5, 5]
    if padding != "explicit same":
        spec["methods"]["forward"]["nodes"][0]["attrs"] = {"padding": padding}
    _equivalent_form(spec, "XNN-030", marker)


@pytest.mark.parametrize(
    "repro", ["xnnpack_dynamic_conv_same_even_kernel.json", "xnnpack_dynamic_conv_layer_same_even_kernel.json"]
)
def test_same_padding_put_on_explicitly_computes_the_same_values(repro):
    """XNN-019's neutralization, functional and layer: the zeros padded on, then no padding, is exact."""
    _equivalent_form(_repro_spec(repro), "XNN-019", "= _conv_same_padded_explicitly")


def test_a_convolution_reading_its_input_through_float64_computes_the_same_values():
    """XNN-030's neutralization: the cast to float64 and back before the convolution is exact."""
    _equivalent_form(_repro_spec("xnnpack_dynamic_linear_then_conv_shapes.json"), "XNN-030", ".double().to(")


@pytest.mark.parametrize(
    "spec",
    [
        _repro_spec("xnnpack_dynamic_conv_then_linear_bias.json"),
        _fixture_spec("xnnpack_dynamic_conv_layer_then_linear_layer.json"),
    ],
    ids=["functional", "layers"],
)
def test_a_linear_reading_a_convolution_through_float64_computes_the_same_values(spec):
    """XNN-032's neutralization: the linear's input cast to float64 and back is exact."""
    _equivalent_form(spec, "XNN-032", ".double().to(")


@pytest.mark.parametrize(
    "finding_id, repro",
    [
        ("COREAI-018", "coreai_dynamic_batch_slice_batch_norm1d.json"),
        ("COREAI-019", "coreai_dynamic_batch_batch_norm1d_then_transpose.json"),
    ],
)
def test_a_batch_norm_with_an_int32_counter_computes_the_same_values(finding_id, repro):
    """COREAI-018's and COREAI-019's neutralization: the eval batch norm never
    reads num_batches_tracked, so with the counter in int32 the values are
    exact, and the module holds no 64-bit tensor left to export."""
    import torch

    from etprop.program import builder

    spec = _repro_spec(repro)
    _equivalent_form(spec, finding_id, "num_batches_tracked.int()")
    rewritten = builder.build(
        neutralize(spec, list(next(f for f in known_findings.load() if f.id == finding_id).neutralize))[0]
    )
    assert not [b for b in rewritten.module.buffers() if b.dtype == torch.int64]
    assert [b for b in builder.build(spec).module.buffers() if b.dtype == torch.int64]


def test_a_static_program_keeps_its_batch_counter():
    """The counter matters only where a dim is dynamic: a static program keeps its form."""
    spec = _repro_spec("coreai_dynamic_batch_slice_batch_norm1d.json")
    del spec["methods"]["forward"]["inputs"][0]["dynamic"]
    rule = list(next(f for f in known_findings.load() if f.id == "COREAI-018").neutralize)
    assert neutralize(spec, rule)[1] == 0


def test_a_batch_norm_reading_its_input_through_float64_computes_the_same_values():
    """XNN-033's neutralization: the BatchNorm1d's input cast to float64 and back is exact."""
    _equivalent_form(_repro_spec("xnnpack_quantized_add_then_batch_norm1d.json"), "XNN-033", ".double().to(")


def test_a_batch_norm_whose_output_goes_through_float64_computes_the_same_values():
    """XNN-034's neutralization: the BatchNorm1d's output cast to float64 and back is exact."""
    _equivalent_form(
        _repro_spec("xnnpack_quantized_batch_norm1d_then_conv1d_load.json"), "XNN-034", "_via_float64(self."
    )


def test_convolutions_reading_copies_of_their_shared_input_compute_the_same_values():
    """XNN-017's neutralization: each convolution of the shared input reads a copy of it."""
    _equivalent_form(_repro_spec("xnnpack_dynamic_conv_shared_input.json"), "XNN-017", "(x.clone()", places=2)
    _equivalent_form(
        _fixture_spec("xnnpack_dynamic_conv2d_functional_shared_input.json"), "XNN-017", "(x.clone()", places=2
    )


def test_a_convolution_reading_an_input_alone_or_in_a_statically_quantized_program_keeps_its_form():
    """XNN-017's neutralization touches only an input that several convolutions
    of a dynamically quantized program read."""
    rule = list(next(f for f in known_findings.load() if f.id == "XNN-017").neutralize)
    shared = _repro_spec("xnnpack_dynamic_conv_shared_input.json")
    alone = json.loads(json.dumps(shared))
    alone["methods"]["forward"]["nodes"][1]["args"] = ["v0"]
    alone["state"]["b"]["kwargs"]["in_channels"] = 4
    static = json.loads(json.dumps(shared))
    static["quantization"]["scheme"] = "static_per_channel"
    assert neutralize(shared, rule)[1] == 2
    assert neutralize(alone, rule)[1] == 0
    assert neutralize(static, rule)[1] == 0


def test_a_convolution_reading_its_shared_input_through_float64_computes_the_same_values():
    """XNN-021's neutralization: the convolution whose input float ops also read reads it cast to float64 and back."""
    _equivalent_form(_repro_spec("xnnpack_quantized_conv_input_channels_last_leak.json"), "XNN-021", ".double().to(")


def test_a_convolution_whose_input_nothing_else_reads_keeps_its_form_under_xnn_021():
    rule = list(next(f for f in known_findings.load() if f.id == "XNN-021").neutralize)
    shared = _repro_spec("xnnpack_quantized_conv_input_channels_last_leak.json")
    alone = json.loads(json.dumps(shared))
    tanh = next(node for node in alone["methods"]["forward"]["nodes"] if node["op"] == "tanh")
    tanh["args"] = [next(node["id"] for node in alone["methods"]["forward"]["nodes"] if node["op"] == "conv2d")]
    assert neutralize(shared, rule)[1] == 1
    assert neutralize(alone, rule)[1] == 0


def test_only_a_gemm_with_a_computed_bias_adds_it_after_the_product():
    """XNN-007's neutralization: the addmm whose bias is computed, not the mm
    beside it, and not once its bias is a stored tensor."""
    rule = list(next(f for f in known_findings.load() if f.id == "XNN-007").neutralize)
    computed = _repro_spec("xnnpack_weight_stored_twice.json")
    stored = json.loads(json.dumps(computed))
    stored["state"]["w10"].pop("parametrizations")
    after, changed = neutralize(computed, rule)
    assert changed == 1
    assert [
        node["op"] for node in after["methods"]["forward"]["nodes"] if node.get("attrs", {}).get("separate_bias")
    ] == ["addmm"]
    assert neutralize(stored, rule)[1] == 0


def test_a_minimum_reading_its_operand_through_float64_computes_the_same_values():
    """XNN-023's neutralization: the minimum's first operand cast to float64 and back is exact."""
    _equivalent_form(_repro_spec("xnnpack_quantized_min_static_operand_init_failure.json"), "XNN-023", ".double().to(")


@pytest.mark.parametrize("producer", ["conv1d", "layer:Conv1d"])
def test_a_batch_norm_after_a_convolution_keeps_its_form(producer):
    """A convolution's batch norm is fused into it when quantizing (XNN-033's
    neutralization leaves it alone): a cast between them would undo that."""
    spec = _repro_spec("xnnpack_quantized_add_then_batch_norm1d.json")
    body = spec["methods"]["forward"]
    if producer == "conv1d":
        spec["state"]["w"] = _weight((2, 2, 1), 4)
        body["nodes"][0] = {"id": "v1", "op": "conv1d", "args": ["x0"], "state": "w"}
    else:
        spec["state"]["c"] = {
            "kind": "layer",
            "type": "Conv1d",
            "seed": 5,
            "kwargs": {"in_channels": 2, "out_channels": 2, "kernel_size": 1},
        }
        body["nodes"][0] = {"id": "v1", "op": "layer", "args": ["x0"], "state": "c"}
    rule = list(next(f for f in known_findings.load() if f.id == "XNN-033").neutralize)
    assert neutralize(spec, rule)[1] == 0


def test_a_shared_single_pixel_value_through_float64_computes_the_same_values():
    """XNN-015's neutralization: the shared (N, C, 1, 1) value cast to float64 and back is exact."""
    _equivalent_form(
        _repro_spec("xnnpack_quantized_single_pixel_shared_pool_averages_channels.json"),
        "XNN-015",
        "v25 = _via_float64(",
    )


@pytest.mark.parametrize("change", ["two by one pixels", "read once", "dynamic quantization"])
def test_the_single_pixel_rewrite_leaves_other_values_alone(change):
    """XNN-015 needs a quantized value of one pixel that several readers take:
    a value of two pixels, one read once, or a dynamically quantized program
    keeps its form."""
    spec = _repro_spec("xnnpack_quantized_single_pixel_shared_run_error.json")
    body = spec["methods"]["forward"]
    if change == "two by one pixels":
        body["inputs"][0]["shape"] = [1, 7, 4, 1]
    elif change == "read once":
        body["outputs"] = body["outputs"][1:]
    else:
        spec["quantization"]["scheme"] = "dynamic_per_tensor"
    rule = list(next(f for f in known_findings.load() if f.id == "XNN-015").neutralize)
    assert neutralize(spec, rule)[1] == 0
    assert neutralize(_repro_spec("xnnpack_quantized_single_pixel_shared_run_error.json"), rule)[1] == 1


def test_spectral_norm_vectors_held_as_parameters_compute_the_same_values():
    """EXIR-007's neutralization: the power-iteration vectors as frozen parameters give the same weight."""
    import torch

    from etprop.program import builder

    spec = _repro_spec("exir_unused_buffer_kept_fold_multi_method.json")
    rule = next(f for f in known_findings.load() if f.id == "EXIR-007").neutralize
    rewritten, changed = neutralize(spec, list(rule))
    assert changed == 1
    original, held = builder.build(spec), builder.build(rewritten)
    assert "vectors_as_parameters=True" in held.source and "vectors_as_parameters=True" not in original.source
    buffers = lambda built: {name for name, _ in built.module.named_buffers()}
    assert any(name.endswith("_v") for name in buffers(original)) and not any(
        name.endswith(("_u", "_v")) for name in buffers(held)
    )
    inputs = original.inputs("decode", "normal")
    torch.testing.assert_close(held.eager("decode", inputs), original.eager("decode", inputs), rtol=0, atol=0)


def test_a_bias_of_its_own_computes_the_same_values():
    """XNN-016's neutralization: the bias read from a copy of the weight's
    state entry has the same values, in a separate tensor."""
    import torch

    from etprop.program import builder

    spec = _repro_spec("xnnpack_addmm_bias_is_its_weight.json")
    separate, changed = neutralize(spec, [{"rewrite": "bias_of_its_own", "ops": ["addmm"]}])
    assert changed == 1 and len(separate["state"]) == len(spec["state"]) + 1
    original, rewritten = builder.build(spec), builder.build(separate)
    inputs = original.inputs("forward")
    for want, got in zip(original.eager("forward", inputs), rewritten.eager("forward", inputs)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_bias_per_use_computes_the_same_values():
    """XNN-018's neutralization: the second GEMM reads a copy of the shared
    bias, and a layer's second call a copy of the layer: the same values."""
    import torch

    from etprop.program import builder

    spec = _repro_spec("xnnpack_quantized_shared_bias.json")
    spec = {**spec, "format": "etprop-spec/1"}
    spec.pop("quantization")
    layer = {"kind": "layer", "type": "Linear", "seed": 9, "kwargs": {"in_features": 10, "out_features": 10}}
    spec["state"]["l9"] = layer
    nodes = spec["methods"]["forward"]["nodes"]
    nodes += [
        {"id": "v8", "op": "layer", "args": ["x0"], "state": "l9"},
        {"id": "v9", "op": "layer", "args": ["v8"], "state": "l9"},
    ]
    spec["methods"]["forward"]["outputs"] = ["v2", "v9"]
    rules = [{"rewrite": "bias_per_use", "ops": ["linear"], "types": ["Linear"]}]
    separate, changed = neutralize(spec, rules)
    assert changed == 2 and len(separate["state"]) == len(spec["state"]) + 2
    original, rewritten = builder.build(spec), builder.build(separate)
    inputs = original.inputs("forward")
    for want, got in zip(original.eager("forward", inputs), rewritten.eager("forward", inputs)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_weight_per_use_computes_the_same_values_and_keeps_what_methods_share():
    """XNN-038's neutralization: the second GEMM of a method reads a copy of
    the weight they shared (the same values); a second method keeps reading
    the first method's weight."""
    import copy

    import torch

    from etprop.program import builder

    spec = _repro_spec("xnnpack_float_shared_weight_partition_cycle.json")
    second = copy.deepcopy(spec["methods"]["prefill"])
    second["nodes"], second["outputs"] = second["nodes"][:1], ["v42"]
    spec["methods"]["forward"] = second
    separate, changed = neutralize(spec, [{"rewrite": "weight_per_use", "ops": ["matmul", "linear"]}])
    assert changed == 1 and len(separate["state"]) == len(spec["state"]) + 1
    assert separate["methods"]["forward"]["nodes"][0]["state"] == "w41"
    assert separate["methods"]["prefill"]["nodes"][1]["state"] != "w41"
    original, rewritten = builder.build(spec), builder.build(separate)
    for method in ("prefill", "forward"):
        inputs = original.inputs(method)
        for want, got in zip(original.eager(method, inputs), rewritten.eager(method, inputs)):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_bias_added_after_the_product_in_an_inlined_loop_computes_the_same_values():
    """XNN-018's neutralization in an inlined loop, whose iterations all read
    one bias: the bias is added after each product instead."""
    import torch

    from etprop.program import builder

    spec = _fixture_spec("xnnpack_quantized_bias_in_inlined_map.json")
    spec = {**spec, "format": "etprop-spec/2"}
    spec.pop("quantization")
    separate, changed = neutralize(spec, [{"rewrite": "bias_per_use", "ops": ["linear"], "types": ["Linear"]}])
    assert changed == 1
    original, rewritten = builder.build(spec), builder.build(separate)
    assert "torch.add(F.linear(" in rewritten.source and "torch.add(F.linear(" not in original.source
    inputs = original.inputs("forward")
    for want, got in zip(original.eager("forward", inputs), rewritten.eager("forward", inputs)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_a_control_flow_body_reading_its_own_copy_computes_the_same_values():
    """EXIR-006's neutralization: the scan body reads a copy of the weight
    the top level reads too (the same values, no longer one parameter); a
    weight only the body reads is left alone."""
    import torch

    from etprop.program import builder

    spec = _repro_spec("xnnpack_weight_shared_with_scan_tagging.json")
    spec["state"]["w_body"] = {"kind": "weight", "scale": 0.5, "seed": 8, "shape": [6, 6]}
    scan = spec["methods"]["forward"]["nodes"][1]
    scan["bodies"][0]["nodes"].append({"args": ["v16"], "id": "v17", "op": "linear", "state": "w_body"})
    scan["bodies"][0]["outputs"] = ["v17"]
    apart, changed = neutralize(spec, [{"rewrite": "state_apart_from_control_flow"}])
    assert changed == 1 and set(apart["state"]) == set(spec["state"]) | {"w6_use"}
    body = apart["methods"]["forward"]["nodes"][1]["bodies"][0]["nodes"]
    assert [n["state"] for n in body] == ["w6_use", "w_body"]
    assert apart["methods"]["forward"]["nodes"][0]["state"] == "w6"
    original, rewritten = builder.build(spec), builder.build(apart)
    inputs = original.inputs("forward")
    for want, got in zip(original.eager("forward", inputs), rewritten.eager("forward", inputs)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert neutralize(apart, [{"rewrite": "state_apart_from_control_flow"}])[1] == 0


def test_loops_over_copies_compute_the_same_values():
    """EXIR-003's equivalent form: loop bodies start from copies of their
    inputs and a reshaped weight is computed from a copy of its parameter;
    the values are the same, and the weight is no longer a view."""
    import torch

    from etprop.program import builder

    spec = _repro_spec("exir_view_in_loop_body.json")
    finding = next(f for f in known_findings.load() if f.id == "EXIR-003")
    copied, changed = neutralize(spec, list(finding.neutralize))
    assert changed == 2
    original, rewritten = builder.build(spec), builder.build(copied)
    assert "a7 = a7.clone()" in rewritten.source and "a7 = a7.clone()" not in original.source
    inputs = original.inputs("forward")
    for want, got in zip(original.eager("forward", inputs), rewritten.eager("forward", inputs)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    weight = rewritten.module.w11
    assert weight.weight.data_ptr() != weight.parametrizations.weight.original.data_ptr()
    assert original.module.w11.weight.data_ptr() == original.module.w11.parametrizations.weight.original.data_ptr()


@pytest.mark.parametrize("size", [[1, 9], [2, 11], [4, 5], [8, 22], [3, 7]])
def test_nearest_by_index_is_nearest_interpolation(size):
    """COREAI-012's equivalent form gives exactly F.interpolate(mode='nearest')."""
    import torch

    from etprop.program import builder

    spec = _program(
        [{"id": "v0", "op": "interpolate", "args": ["x"], "attrs": {"size": size, "mode": "nearest"}}],
        shape=(1, 2, 4, 11),
    )
    gathered, changed = neutralize(
        spec, [{"rewrite": "set_attrs", "ops": ["interpolate"], "attrs": {"by_index": True}}]
    )
    assert changed == 1
    original, rewritten = builder.build(spec), builder.build(gathered)
    assert "_nearest_by_index(x, [" in rewritten.source and "_nearest_by_index(x, [" not in original.source
    inputs = original.inputs("forward")
    torch.testing.assert_close(
        rewritten.eager("forward", inputs)[0], original.eager("forward", inputs)[0], rtol=0, atol=0
    )


def test_nearest_by_index_gives_atens_source_index_at_every_size():
    """The form agrees with ATen's nearest resize (floor(dst * in / out), in
    float32) at every size up to 24, both ways."""
    import torch
    import torch.nn.functional as F

    from etprop.program import builder

    spec = _program(
        [{"id": "v0", "op": "interpolate", "args": ["x"], "attrs": {"size": [3], "by_index": True}}], shape=(1, 1, 2)
    )
    _nearest_by_index = builder.build(spec).namespace["_nearest_by_index"]
    differ = []
    for count in range(1, 25):
        x = torch.arange(count, dtype=torch.float32)[None, None]
        for out in range(1, 25):
            if not torch.equal(_nearest_by_index(x, [out]), F.interpolate(x, size=out, mode="nearest")):
                differ.append((count, out))
    assert not differ, differ


def test_nearest_by_index_lowers_to_the_values_it_computes_in_eager():
    """The form's index arithmetic survives lowering: a float64 scale would be
    lifted as a float32 constant (EXIR-008) and read source 4 for output 6 of
    a 10 -> 12 resize where eager reads 5, on every flow, portable included
    (a campaign met it through COREAI-012's neutralization)."""
    from etprop import flows
    from etprop.lowering import pipeline
    from etprop.oracles import equivalence
    from etprop.program import builder

    spec = _program(
        [{"id": "v0", "op": "interpolate", "args": ["x"], "attrs": {"size": [10, 12], "by_index": True}}],
        shape=(1, 1, 10),
    )
    lowering = pipeline.lower(builder.build(spec), flows.get("portable"))
    assert lowering.ok, lowering.error
    verdict = equivalence.check(lowering)
    assert verdict.ok, verdict.message


@pytest.mark.parametrize("dims", [1, 2])
def test_average_pools_by_sums_are_the_average_pools(dims):
    """COREAI-009's equivalent form gives F.avg_pool1d/2d's values for every
    ceil mode, padding, stride, divisor and count_include_pad drawn."""
    import itertools

    import torch

    from etprop.program import builder

    pool = "avg_pool2d" if dims == 2 else "avg_pool1d"
    shape = (2, 3, 5, 7) if dims == 2 else (2, 3, 7)
    for kernel, stride, padding, ceil_mode, count_include_pad, divisor in itertools.product(
        (1, 2, 3), (None, 1, 2, 3), (0, 1), (False, True), (True, False), (None, 3)
    ):
        if 2 * padding > kernel or (divisor and dims == 1):
            continue
        attrs = {
            "kernel_size": [kernel] * dims,
            "padding": [padding] * dims,
            "ceil_mode": ceil_mode,
            "count_include_pad": count_include_pad,
        }
        attrs.update({"stride": [stride] * dims} if stride else {})
        attrs.update({"divisor_override": divisor} if divisor else {})
        spec = _program([{"id": "v0", "op": pool, "args": ["x"], "attrs": attrs}], shape=shape)
        by_sums, changed = neutralize(spec, [{"rewrite": "set_attrs", "ops": [pool], "attrs": {"by_sums": True}}])
        assert changed == 1
        original, rewritten = builder.build(spec), builder.build(by_sums)
        assert "_avg_pool_by_sums(x" in rewritten.source
        inputs = original.inputs("forward")
        torch.testing.assert_close(
            rewritten.eager("forward", inputs)[0],
            original.eager("forward", inputs)[0],
            rtol=1e-6,
            atol=1e-6,
            msg=str(attrs),
        )


def test_a_method_holding_a_transposed_convolution_is_exported_at_its_example_shapes():
    """COREAI-016's neutralization: only a method that holds a transposed
    convolution loses its dynamic dims; the values are the same."""
    import torch

    from etprop.program import builder

    layer = {
        "kind": "layer",
        "type": "ConvTranspose1d",
        "seed": 2,
        "kwargs": {"in_channels": 4, "out_channels": 2, "kernel_size": 3, "stride": 2, "bias": False},
    }
    dynamic = [[0, 1, 4]]
    spec = {
        "format": FORMAT,
        "state": {"l1": layer},
        "methods": {
            "forward": {
                "inputs": [{"name": "x", "shape": [2, 4, 5], "dtype": "float32", "dynamic": dynamic}],
                "nodes": [
                    {"id": "v0", "op": "relu", "args": ["x"]},
                    {"id": "v1", "op": "layer", "args": ["v0"], "state": "l1"},
                ],
                "outputs": ["v1"],
            },
            "other": {
                "inputs": [{"name": "x", "shape": [2, 4, 5], "dtype": "float32", "dynamic": dynamic}],
                "nodes": [{"id": "v0", "op": "relu", "args": ["x"]}],
                "outputs": ["v0"],
            },
        },
    }
    rules = next(f for f in known_findings.load() if f.id == "COREAI-016").neutralize
    written, changed = neutralize(spec, list(rules))
    assert changed == 1
    assert "dynamic" not in written["methods"]["forward"]["inputs"][0]
    assert written["methods"]["other"]["inputs"][0]["dynamic"] == dynamic
    original, rewritten = builder.build(spec), builder.build(written)
    inputs = original.inputs("forward")
    torch.testing.assert_close(
        rewritten.eager("forward", inputs)[0], original.eager("forward", inputs)[0], rtol=0, atol=0
    )
    functional = copy.deepcopy(spec)
    functional["methods"]["forward"]["nodes"][1] = {
        "id": "v1",
        "op": "conv_transpose1d",
        "args": ["v0"],
        "state": "w1",
        "attrs": {"stride": 2},
    }
    functional["state"] = {"w1": {"kind": "weight", "shape": [4, 2, 3], "seed": 3, "scale": 0.3}}
    assert neutralize(functional, list(rules))[1] == 1
    assert neutralize(_program([{"id": "v0", "op": "relu", "args": ["x"]}]), list(rules))[1] == 0


def test_stride_written_out_is_the_default_stride():
    """COREAI-014's equivalent form: an avg_pool2d's default stride written
    out as its kernel size computes the same pool; an explicit stride is kept."""
    import torch

    from etprop.program import builder

    nodes = [
        {"id": "v0", "op": "avg_pool2d", "args": ["x"], "attrs": {"kernel_size": [3, 2], "padding": [1, 1]}},
        {"id": "v1", "op": "avg_pool2d", "args": ["x"], "attrs": {"kernel_size": 2, "stride": 1}},
    ]
    spec = _program(nodes, shape=(1, 2, 7, 6), outputs=["v0", "v1"])
    rule = {"rewrite": "copy_attrs", "ops": ["avg_pool2d"], "copy": {"stride": "kernel_size"}}
    written, changed = neutralize(spec, [rule])
    assert changed == 1
    assert [n["attrs"].get("stride") for n in written["methods"]["forward"]["nodes"]] == [[3, 2], 1]
    original, rewritten = builder.build(spec), builder.build(written)
    inputs = original.inputs("forward")
    for got, expected in zip(rewritten.eager("forward", inputs), original.eager("forward", inputs)):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "layer_type, kwargs, shape",
    [
        (
            "ConvTranspose2d",
            {
                "in_channels": 6,
                "out_channels": 6,
                "kernel_size": [2, 3],
                "stride": [1, 2],
                "padding": [0, 0],
                "output_padding": [1, 0],
                "dilation": [2, 2],
                "groups": 6,
                "bias": False,
            },
            (1, 6, 1, 1),
        ),
        (
            "ConvTranspose2d",
            {"in_channels": 2, "out_channels": 4, "kernel_size": 3, "stride": 2, "padding": 1, "output_padding": 1},
            (2, 2, 5, 4),
        ),
        (
            "ConvTranspose1d",
            {
                "in_channels": 3,
                "out_channels": 2,
                "kernel_size": 2,
                "stride": 3,
                "padding": 1,
                "output_padding": 2,
                "dilation": 2,
            },
            (1, 3, 6),
        ),
    ],
)
@pytest.mark.parametrize("by_cat", [False, True], ids=["padded", "concatenated"])
def test_conv_transpose_layer_padded_output_is_the_layer(layer_type, kwargs, shape, by_cat):
    """XNN-013's equivalent form for a ConvTranspose layer: its full result
    cropped and extended (zeros padded on, or concatenated: XNN-028's form)
    gives exactly what the layer gives."""
    import torch

    from etprop.program import builder

    state = {"l": {"kind": "layer", "type": layer_type, "kwargs": kwargs, "seed": 4}}
    spec = _program([{"id": "v0", "op": "layer", "args": ["x"], "state": "l"}], state=state, shape=shape)
    rule = {
        "rewrite": "set_attrs",
        "ops": ["layer"],
        "types": ["ConvTranspose1d", "ConvTranspose2d"],
        "attrs": {"pad_output": True, "pad_by_cat": by_cat},
    }
    padded, changed = neutralize(spec, [rule])
    assert changed == 1
    original, rewritten = builder.build(spec), builder.build(padded)
    assert f"_conv_transpose_output_padded(self.l, x{', by_cat=True' if by_cat else ''})" in rewritten.source
    inputs = original.inputs("forward")
    torch.testing.assert_close(
        rewritten.eager("forward", inputs)[0], original.eager("forward", inputs)[0], rtol=1e-6, atol=1e-6
    )


_GROUP_NORM = ("GroupNorm", "two_pass", "_group_norm_two_pass(self.n, x)")
_LAYER_NORM = ("LayerNorm", "layer_norm_two_pass", "_norm_two_pass(self.n, x, ('LayerNorm',))")


@pytest.mark.parametrize(
    "norm, kwargs, shape",
    [
        (_GROUP_NORM, {"num_groups": 5, "num_channels": 5, "eps": 1e-3, "affine": False}, (3, 5, 1)),
        (_GROUP_NORM, {"num_groups": 2, "num_channels": 6, "eps": 1e-5, "affine": True}, (2, 6, 4, 3)),
        (_GROUP_NORM, {"num_groups": 1, "num_channels": 4, "eps": 1e-5, "affine": True}, (2, 4, 7)),
        (_LAYER_NORM, {"normalized_shape": [2], "eps": 1e-3, "elementwise_affine": False}, (1, 1, 10, 2)),
        (_LAYER_NORM, {"normalized_shape": [4, 3], "eps": 1e-5, "elementwise_affine": True}, (2, 5, 4, 3)),
        (_LAYER_NORM, {"normalized_shape": [6], "eps": 1e-5, "elementwise_affine": True, "bias": False}, (3, 6)),
    ],
)
def test_two_pass_norm_is_the_norm(norm, kwargs, shape):
    """KERNELS-003's (GroupNorm) and KERNELS-005's (LayerNorm) equivalent forms
    match the layer; each rule leaves every other layer as it is."""
    import torch

    from etprop.program import builder

    layer_type, attr, rendered = norm
    spec = _program(
        [{"id": "v0", "op": "layer", "args": ["x"], "state": "n"}],
        {"n": {"kind": "layer", "type": layer_type, "seed": 3, "kwargs": kwargs}},
        shape=shape,
    )
    rule = {"rewrite": "set_attrs", "ops": ["layer"], "attrs": {attr: True}}
    rewritten, changed = neutralize(spec, [rule])
    assert changed == 1
    original, twin = builder.build(spec), builder.build(rewritten)
    assert rendered in twin.source
    inputs = original.inputs("forward")
    torch.testing.assert_close(
        twin.eager("forward", inputs)[0], original.eager("forward", inputs)[0], rtol=1e-5, atol=1e-5
    )
    others = [
        ("Linear", {"in_features": 8, "out_features": 3}, (3, 8)),
        ("GroupNorm", {"num_groups": 2, "num_channels": 4}, (2, 4, 3)),
        ("LayerNorm", {"normalized_shape": [3]}, (2, 4, 3)),
    ]
    for other, other_kwargs, other_shape in others:
        if other == layer_type:
            continue
        untouched = builder.build(
            neutralize(
                _program(
                    [{"id": "v0", "op": "layer", "args": ["x"], "state": "n"}],
                    {"n": {"kind": "layer", "type": other, "seed": 3, "kwargs": other_kwargs}},
                    shape=other_shape,
                ),
                [rule],
            )[0]
        )
        x = untouched.inputs("forward")[0]
        torch.testing.assert_close(untouched.eager("forward", (x,))[0], untouched.module.n(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    "op, weight, shape, attrs",
    [
        (
            "conv_transpose2d",
            [10, 2, 3, 1],
            (1, 10, 2, 3),
            {"stride": [1, 3], "dilation": [2, 1], "output_padding": [1, 1]},
        ),
        ("conv_transpose2d", [4, 3, 2, 2], (2, 4, 3, 3), {"stride": 2, "output_padding": 1, "padding": 1}),
        ("conv_transpose1d", [4, 2, 3], (2, 4, 5), {"stride": 1, "dilation": 3, "output_padding": 2}),
        ("conv_transpose2d", [4, 2, 3, 3], (1, 4, 4, 4), {"stride": 3, "padding": [2, 1], "output_padding": [2, 1]}),
    ],
)
@pytest.mark.parametrize("by_cat", [False, True], ids=["padded", "concatenated"])
def test_output_padding_as_appended_zeros_is_the_transposed_convolution(op, weight, shape, attrs, by_cat):
    """XNN-013's equivalent form gives exactly the transposed convolution, bias
    included, with the zeros padded on or (XNN-028's form) concatenated;
    nodes without output_padding are left alone."""
    import torch

    from etprop.program import builder

    rule = {
        "rewrite": "set_attrs",
        "ops": ["conv_transpose1d", "conv_transpose2d"],
        "having": ["output_padding"],
        "attrs": {"pad_output": True, "pad_by_cat": by_cat},
    }
    state = {"w": _weight(weight, 1), "b": _weight([weight[1]], 2)}
    spec = _program(
        [
            {"id": "v0", "op": op, "args": ["x"], "state": "w", "attrs": {**attrs, "bias_state": "b"}},
            {"id": "v1", "op": op, "args": ["x"], "state": "w", "attrs": {"bias_state": "b"}},
        ],
        state,
        shape=shape,
        outputs=["v0", "v1"],
    )
    rewritten, changed = neutralize(spec, [rule])
    assert changed == 1
    original, twin = builder.build(spec), builder.build(rewritten)
    assert twin.source.count("_output_padded(") == 1 + original.source.count("_output_padded(")
    assert ("by_cat=True" in twin.source) == by_cat
    for kind in ("normal", "large"):
        inputs = original.inputs("forward", kind)
        for got, want in zip(twin.eager("forward", inputs), original.eager("forward", inputs)):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6 * float(want.abs().max()))


@pytest.mark.parametrize(
    "repro_name, attrs, rendered, exact, norms",
    [
        ("torchao_pt2e_grouped_conv_transpose_batch_norm.json", {"input_copy": True}, "clone()", True, 1),
        ("xnnpack_fuse_batch_norm_grouped_conv_transpose.json", {"by_hand": True}, "_batch_norm_by_hand(", False, 2),
    ],
)
def test_a_batch_norm_read_through_a_copy_or_written_out_computes_the_same_values(
    repro_name, attrs, rendered, exact, norms
):
    """The neutralizations of TORCHAO-008 and XNN-022: a copy changes no
    value; the batch norm as arithmetic changes values only by rounding."""
    import torch

    from etprop.program import builder
    from etprop.verdicts import repro

    record = repro.read(known_findings.FINDINGS_DIR / "repros" / repro_name)
    spec = {key: value for key, value in record["spec"].items() if key != "quantization"}
    spec["format"] = FORMAT
    rule = {"rewrite": "set_attrs", "ops": ["layer"], "types": ["BatchNorm1d", "BatchNorm2d"], "attrs": attrs}
    copied, changed = neutralize(spec, [rule])
    assert changed == norms and rendered in builder.build(copied).source
    original, rewritten = builder.build(spec), builder.build(copied)
    tolerance = {"rtol": 0, "atol": 0} if exact else {}
    for left, right in zip(
        original.eager("forward", original.inputs("forward")),
        rewritten.eager("forward", rewritten.inputs("forward")),
        strict=True,
    ):
        torch.testing.assert_close(left, right, **tolerance)


@pytest.mark.parametrize(
    "shape, attrs",
    [
        ((1, 2, 2, 1), {"size": [3, 1]}),
        ((1, 2, 6, 1), {"scale_factor": 1.5}),
        ((1, 2, 6, 3), {"size": [4, 3]}),
        ((1, 2, 3, 1), {"size": [5, 4]}),
    ],
)
def test_an_antialiased_resize_widened_gives_the_values_of_a_wider_input(shape, attrs):
    """TORCH-002's neutralization: at widths other than a kept 1 it is the
    plain interpolate; at a kept width of 1 it gives the column ATen computes
    when the input is two identical columns wide."""
    import torch
    import torch.nn.functional as F

    from etprop.program import builder

    attrs = {"mode": "bilinear", "antialias": True, **attrs}
    spec = _program(
        [{"id": "v0", "op": "interpolate", "args": ["x"], "attrs": {**attrs, "antialias_widened": True}}], {}, shape
    )
    built = builder.build(spec)
    x = built.inputs("forward")[0]
    (got,) = built.eager("forward", (x,))
    plain = F.interpolate(x, **{k: v for k, v in attrs.items()})
    if shape[-1] == 1 and plain.shape[-1] == 1:
        wide = {**attrs, **({"size": [attrs["size"][0], 2]} if "size" in attrs else {"scale_factor": (1.5, 1.0)})}
        assert torch.equal(got, F.interpolate(x.expand(*shape[:-1], 2), **wide)[..., :1])
        assert not torch.equal(got, plain), "ATen's width-1 result no longer differs: TORCH-002 may be fixed"
    else:
        assert torch.equal(got, plain)


def test_repeated_scales_merge_into_one_with_the_same_weight_bit_for_bit():
    """COREAI-004's scale merging on the campaign's 20-node memory-limit crash:
    only the weight scaled 2.0, 0.5, 2.0 (now one scale 2.0) and the weight
    scaled 0.5 then by a buffer (now the buffer stored times 0.5) change, and
    every weight keeps its value exactly."""
    from pathlib import Path

    import torch

    spec = json.loads((Path(__file__).parent / "fixtures" / "coreai_repeated_scale_memory_crash.json").read_text())[
        "spec"
    ]
    (finding,) = [f for f in known_findings.load() if f.id == "COREAI-004b"]
    after, changed = neutralize(
        spec, [rule for rule in finding.neutralize if rule["rewrite"] == "merge_repeated_scales"]
    )
    assert changed == 2
    assert _state_changes(spec["state"], after["state"]) == {"w6", "w9"}
    assert after["state"]["w6"]["parametrizations"] == [{"factor": 2.0, "type": "scale"}]
    assert after["state"]["w9"]["parametrizations"] == [{"seed": 771, "type": "buffer_scale", "factor": 0.5}]
    before_values, after_values = _effective_weights(spec), _effective_weights(after)
    assert all(torch.equal(before_values[name], after_values[name]) for name in before_values)


@pytest.mark.parametrize(
    "every_chain, steps, merged",
    [
        (False, [("scale", -1.0), ("buffer_scale", 7), ("scale", -1.0)], [("buffer_scale", 7)]),
        (
            False,
            [("scale", 2.0), ("scale", 2.0), ("add_delta", 3), ("scale", 0.5)],
            [("scale", 4.0), ("add_delta", 3), ("scale", 0.5)],
        ),
        (False, [("scale", 2.0), ("add_delta", 3), ("scale", 2.0)], None),
        (False, [("scale", 2.0), ("scale", 0.5)], None),
        (True, [("scale", 0.5), ("buffer_scale", 7), ("scale", 2.0)], [("buffer_scale", 7)]),
        (
            True,
            [("scale", 2.0), ("scale", -4.0), ("add_delta", 3), ("scale", 0.5)],
            [("scale", -8.0), ("add_delta", 3), ("scale", 0.5)],
        ),
        (
            True,
            [("buffer_scale", 7), ("scale", -2.0), ("add_delta", 3), ("scale", 0.5)],
            [("buffer_scale", (7, -2.0)), ("add_delta", 3), ("scale", 0.5)],
        ),
    ],
    ids=[
        "across a buffer scale, product 1",
        "a run before an added delta",
        "apart by an added delta",
        "distinct factors",
        "every chain: distinct factors, product 1",
        "every chain: a run of distinct factors",
        "every chain: a scale after a buffer goes into the buffer",
    ],
)
def test_only_scales_repeating_a_factor_between_multiplications_are_merged(every_chain, steps, merged):
    """Without ``every_chain`` only a run that repeats a factor merges; with
    it (COREAI-004's rule since its shared-factor form) every run does, into
    the run's buffer where it has one."""
    import torch

    def parametrizations(pairs):
        steps = []
        for kind, value in pairs:
            if kind == "scale":
                steps.append({"type": kind, "factor": value})
            elif isinstance(value, tuple):
                steps.append({"type": kind, "seed": value[0], "factor": value[1]})
            else:
                steps.append({"type": kind, "seed": value})
        return steps

    spec = _program(
        [{"id": "v0", "op": "linear", "args": ["x"], "state": "w"}], {"w": _weight((4, 8), 1, parametrizations(steps))}
    )
    after, changed = neutralize(spec, [{"rewrite": "merge_repeated_scales", "every_chain": every_chain}])
    assert changed == (merged is not None)
    assert after["state"]["w"]["parametrizations"] == parametrizations(merged if merged is not None else steps)
    assert torch.equal(_effective_weights(spec)["w"], _effective_weights(after)["w"])


@pytest.mark.parametrize("alpha, beta", [(2.0, 0.5), (-1.0, None), (None, 2.0), (0.5, -1.0)])
def test_a_gemms_scalars_move_into_its_weights_with_the_same_values_bit_for_bit(alpha, beta):
    """COREAI-004 through a GEMM's scalars: ``beta`` becomes a last scale of
    the bias, ``alpha`` of the weight, each copied first where another node
    reads it, and the program computes the same values bit for bit."""
    import torch

    from etprop.program import builder

    attrs = {
        "bias_state": "b",
        **({"alpha": alpha} if alpha is not None else {}),
        **({"beta": beta} if beta is not None else {}),
    }
    spec = _program(
        [
            {"id": "v0", "op": "addmm", "args": ["x"], "state": "w", "attrs": attrs},
            {"id": "v1", "op": "linear", "args": ["x"], "state": "w2", "attrs": {"bias_state": "b"}},
            {"id": "v2", "op": "add", "args": ["v0", "v1"]},
        ],
        {"w": _weight((8, 6), 1, [{"type": "scale", "factor": -1.0}]), "b": _weight((6,), 2), "w2": _weight((6, 8), 3)},
    )
    rules = next(f for f in known_findings.load() if f.id == "COREAI-004").neutralize
    written, changed = neutralize(spec, list(rules))
    gemm = written["methods"]["forward"]["nodes"][0]
    assert "alpha" not in gemm["attrs"] and "beta" not in gemm["attrs"]
    assert changed == 2 * (alpha is not None) + (beta is not None), "alpha joins the weight's scale: merged"
    assert (gemm["attrs"]["bias_state"] != "b") == (beta is not None), "a shared bias is copied, not scaled"
    assert written["state"]["b"] == spec["state"]["b"]
    original, rewritten = builder.build(spec), builder.build(written)
    inputs = original.inputs("forward")
    assert torch.equal(rewritten.eager("forward", inputs)[0], original.eager("forward", inputs)[0])
    assert (
        neutralize(
            _program(
                [{"id": "v0", "op": "addmm", "args": ["x"], "state": "w", "attrs": {"bias_state": "b", "beta": 0.0}}],
                {"w": _weight((8, 6), 1), "b": _weight((6,), 2)},
            ),
            list(rules),
        )[1]
        == 0
    )


@pytest.mark.parametrize("shape, channels", [([5], 1), ([2, 3], 3), ([2, 3, 4], 1), ([1, 2, 2, 3, 2], 2)])
def test_a_prelu_on_a_4d_view_computes_the_same_values(shape, channels):
    """XNN-036's neutralization: the slope applied to (N, C, rest, 1) and viewed back is exact at every rank."""
    spec = _program(
        [{"id": "v1", "op": "prelu", "args": ["x"], "state": "p1"}],
        state={"p1": {"kind": "parameter", "shape": [channels], "scale": 0.5, "seed": 3}},
        shape=tuple(shape),
    )
    _equivalent_form(spec, "XNN-036", ".reshape((")


@pytest.mark.parametrize("pad", [[-1, 2], [-1, -1, 2, -2], [1, -2, -1, 0, 0, 1]])
def test_a_crop_taken_as_a_slice_computes_the_same_values(pad):
    """KERNELS-006's neutralization: negative amounts sliced off, then the positive ones padded, is exact."""
    spec = _program([{"id": "v1", "op": "pad", "args": ["x"], "attrs": {"pad": pad, "value": 0.5}}], shape=(3, 5, 6))
    _equivalent_form(spec, "KERNELS-006", "x[...")


@pytest.mark.parametrize("op", ["max_dim", "min_dim"])
@pytest.mark.parametrize("dim, keepdim", [(3, False), (1, True), (-1, True)])
def test_a_max_along_a_dim_as_amax_computes_the_same_values(op, dim, keepdim):
    """XNN-037's neutralization: amax (amin) gives the values max (min) along the dim gives."""
    attrs = {"dim": dim, **({"keepdim": True} if keepdim else {})}
    spec = _program([{"id": "v1", "op": op, "args": ["x"], "attrs": attrs}], shape=(1, 2, 3, 4))
    _equivalent_form(spec, "XNN-037", "torch.am")


@pytest.mark.parametrize("indexed_dims, mask", [(1, False), (2, False), (1, True), (2, True)])
def test_accumulated_index_puts_written_as_one_hot_products_compute_the_same_sums(indexed_dims, mask):
    """COREAI-020's form: the same sums in another order (rounding apart);
    an index_put that writes rather than adds keeps its form."""
    import torch

    from etprop.program import builder

    shape = [4, 3, 2]
    count = 6  # more indices than rows: repeats add up
    inputs = [
        {"name": "x", "shape": shape, "dtype": "float32"},
        {"name": "v", "shape": [1 if mask else count, *shape[indexed_dims:]], "dtype": "float32"},
    ]
    if mask:  # x[m] += v: one row of values for every place the mask selects
        inputs.append({"name": "m", "shape": shape[:indexed_dims], "dtype": "bool"})
        indices = ["m"]
    else:
        inputs += [{"name": f"i{d}", "shape": [count], "dtype": "int64", "high": shape[d]} for d in range(indexed_dims)]
        indices = [f"i{d}" for d in range(indexed_dims)]
    nodes = [{"id": "added", "op": "index_put", "args": ["x", "v", *indices], "attrs": {"accumulate": True}}]
    spec = {
        "format": "etprop-spec/3",
        "state": {},
        "methods": {"forward": {"inputs": inputs, "nodes": nodes, "outputs": ["added"]}},
    }
    rule = next(f for f in known_findings.load() if f.id == "COREAI-020").neutralize
    rewritten, changed = neutralize(spec, list(rule))
    assert changed == 1
    original, neutral = builder.build(spec), builder.build(rewritten)
    assert "_index_put_summed(x" in neutral.source and "_index_put_summed(x" not in original.source
    for kind in ("normal", "large", "zeros"):
        values = original.inputs("forward", kind)
        torch.testing.assert_close(neutral.eager("forward", values)[0], original.eager("forward", values)[0])
    written = copy.deepcopy(spec)
    written["methods"]["forward"]["nodes"][0]["attrs"] = {}
    assert neutralize(written, list(rule))[1] == 0, "an index_put that writes is left as it is"


@pytest.mark.parametrize("shape", [[3, 5], [2, 3, 5]], ids=["unbatched", "batched"])
def test_an_adaptive_pool1d_given_a_batch_dim_computes_the_same_values(shape):
    """COREAI-021's form, on the input it is for and on one that has a batch dim already."""
    spec = {
        "format": FORMAT,
        "state": {},
        "methods": {
            "forward": {
                "inputs": [{"name": "x", "shape": shape, "dtype": "float32"}],
                "nodes": [{"id": "y", "op": "adaptive_avg_pool1d", "args": ["x"], "attrs": {"output_size": 4}}],
                "outputs": ["y"],
            }
        },
    }
    _equivalent_form(spec, "COREAI-021", "_pooled_with_batch_dim(x, 4)")
