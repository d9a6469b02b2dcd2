"""Each structural oracle accepts a good lowering and rejects a deliberately
broken one with a message that names the offending weight, node or bytes."""

import dataclasses
import json

import pytest
import torch
import torch.fx

from etprop import flows
from etprop.lowering import partition_facts, pipeline
from etprop.oracles import coverage, cycles, differential, growth
from etprop.program import builder
from etprop.verdicts.outcomes import Outcome


@pytest.fixture(scope="module")
def lowerings(make_linear_relu_spec):
    built = builder.build(make_linear_relu_spec(out_features=16))
    exported = pipeline.export_program(built)
    result = {name: pipeline.lower(built, flows.get(name), exported) for name in ("portable", "xnnpack")}
    for lowering in result.values():
        assert lowering.ok, lowering.error
    return result


def _weight(lowering):
    return lowering.built.module.l0.weight.detach()


def test_growth_passes_when_each_weight_is_stored_once(lowerings):
    for lowering in lowerings.values():
        verdict = growth.check(lowering)
        assert verdict.ok, verdict.message
    assert sum(growth.count_occurrences(lowerings["xnnpack"].pte, _weight(lowerings["xnnpack"])).values()) == 1


@pytest.mark.parametrize("layout", ["same", "transposed"])
def test_growth_names_a_weight_stored_twice(lowerings, layout):
    lowering = lowerings["xnnpack"]
    weight = _weight(lowering)
    extra = (weight if layout == "same" else weight.t()).contiguous().numpy().tobytes()
    broken = dataclasses.replace(lowering, pte=lowering.pte + extra)
    verdict = growth.check(broken)
    assert not verdict.ok
    assert "l0.weight (16, 8) (512 bytes) stored 2 times" in verdict.message


def test_cycles_pass_on_real_partitions(lowerings):
    lowering = lowerings["xnnpack"]
    assert lowering.partitions and lowering.partitions[0]["partitions"]
    assert cycles.check(lowering).ok


def _tagged_graph():
    def f(x):
        a = torch.relu(x)
        b = torch.sigmoid(a)
        return torch.tanh(a + b)

    gm = torch.fx.symbolic_trace(f)
    nodes = {n.name: n for n in gm.graph.nodes}
    return gm, nodes


def test_cycles_reject_a_hand_made_cyclic_partition(lowerings):
    gm, nodes = _tagged_graph()
    # relu and add in one partition, sigmoid (between them) outside: contracting
    # the partition gives P -> sigmoid -> P.
    nodes["relu"].meta["delegation_tag"] = "P0"
    nodes["add"].meta["delegation_tag"] = "P0"
    records = partition_facts.snapshot(gm, {"P0": None})
    assert records[0]["not_convex"] == ["P0"]
    broken = dataclasses.replace(lowerings["xnnpack"], partitions=records)
    verdict = cycles.check(broken)
    assert not verdict.ok
    assert "partition P0 in root is not convex" in verdict.message and "cycle" in verdict.message


def test_cycles_reject_two_partitions_that_depend_on_each_other():
    def f(x):
        a = torch.relu(x)  # P0
        b = torch.sigmoid(x)  # P1
        c = torch.tanh(a)  # P1
        d = torch.neg(b)  # P0
        return c + d

    gm = torch.fx.symbolic_trace(f)
    tags = {"relu": "P0", "neg": "P0", "sigmoid": "P1", "tanh": "P1"}
    for node in gm.graph.nodes:
        if node.name in tags:
            node.meta["delegation_tag"] = tags[node.name]
    record = partition_facts.snapshot(gm, {"P0": None, "P1": None})[0]
    assert record["cycle"] == ["P0", "P1"]


def test_coverage_names_a_gemm_left_on_portable(lowerings):
    portable = lowerings["portable"]
    claimed = dataclasses.replace(portable, flow=flows.get("xnnpack"))
    verdict = coverage.check(claimed)
    assert not verdict.ok
    assert "static weight" in verdict.message and "forward/" in verdict.message
    assert coverage.check(lowerings["xnnpack"]).ok
    assert coverage.check(portable).ok  # portable promises nothing


def test_differential_rejects_growth_and_new_lowering_failures(lowerings):
    base, candidate = lowerings["xnnpack"], lowerings["xnnpack"]
    ok = differential.check(
        dataclasses.replace(candidate, flow=flows.get("portable")), {"xnnpack": base, "portable": candidate}
    )
    assert ok.ok, ok.message
    grown = dataclasses.replace(candidate, flow=flows.get("portable"), pte=candidate.pte + bytes(4096))
    verdict = differential.check(grown, {"xnnpack": base, "portable": grown})
    assert not verdict.ok and ".pte grew" in verdict.message
    failed = dataclasses.replace(
        candidate, flow=flows.get("portable"), outcome=Outcome.LOWERING_ERROR, error="RuntimeError: boom"
    )
    verdict = differential.check(failed, {"xnnpack": base, "portable": failed})
    assert not verdict.ok and "xnnpack lowers this program but portable fails: RuntimeError: boom" in verdict.message
    worse = differential.check(
        dataclasses.replace(lowerings["portable"], flow=flows.get("portable")),
        {"xnnpack": base, "portable": lowerings["portable"]},
    )
    assert not worse.ok and "more ops outside delegates" in worse.message


def test_differential_allows_each_extra_delegate_its_fixed_cost_and_no_more(lowerings):
    base, delegated = lowerings["portable"], lowerings["xnnpack"]
    extra = coverage.delegate_calls(delegated) - coverage.delegate_calls(base)
    assert extra >= 1
    budget = len(base.pte) + differential.SIZE_SLACK_BYTES + extra * differential.DELEGATE_OVERHEAD_BYTES
    pad = lambda size: dataclasses.replace(delegated, pte=bytes(size))  # noqa: E731
    assert differential.check(pad(budget), {"portable": base, "xnnpack": pad(budget)}).ok
    verdict = differential.check(pad(budget + 1), {"portable": base, "xnnpack": pad(budget + 1)})
    assert not verdict.ok and f"{extra} more delegates" in verdict.message, verdict.message


def test_growth_reads_bfloat16_weights():
    """numpy has no bfloat16: the oracle must read raw bytes (seen: a crash)."""
    weight = torch.randn(4, 8).to(torch.bfloat16)
    blob = b"header" + growth.tensor_bytes(weight.t()) + b"middle" + growth.tensor_bytes(weight)
    assert growth.count_occurrences(blob, weight) == {(0, 1): 1, (1, 0): 1}


def test_coverage_claims_hold_only_for_the_promised_dtypes(make_linear_relu_spec):
    """XNNPACK has no bfloat16 GEMM: a bfloat16 linear on portable breaks no promise,
    but a flow that claimed bfloat16 would be caught."""
    from etprop.lowering import pipeline
    from etprop.program import builder

    spec = make_linear_relu_spec()
    spec["dtype"] = "bfloat16"
    spec["methods"]["forward"]["inputs"][0]["dtype"] = "bfloat16"
    built = builder.build(spec)
    lowering = pipeline.lower(built, flows.get("xnnpack"), pipeline.export_program(built))
    assert coverage.check(lowering).ok
    claims_bf16 = dataclasses.replace(
        lowering.flow,
        promises=dataclasses.replace(lowering.flow.promises, delegate_dtypes=frozenset({"float32", "bfloat16"})),
    )
    verdict = coverage.check(dataclasses.replace(lowering, flow=claims_bf16))
    assert not verdict.ok and "promises to delegate" in verdict.message


def test_coverage_judges_a_gemm_by_its_least_static_parameter():
    """A conv with a parameter weight and a computed bias is a computed-weight GEMM:
    stock XNNPACK declines it by design (withdrawn lead XNN-006), so a flow that
    claims only static GEMMs is not blamed, and one claiming computed ones is."""
    from etprop.lowering import pipeline
    from etprop.program import builder
    from etprop.program.spec import FORMAT

    spec = {
        "format": FORMAT,
        "state": {
            "b": {"kind": "weight", "shape": [7], "seed": 1, "parametrizations": [{"type": "scale", "factor": 0.5}]},
            "w": {"kind": "weight", "shape": [7, 7, 3, 3], "seed": 2, "scale": 0.126},
        },
        "methods": {
            "forward": {
                "inputs": [{"name": "x", "shape": [3, 7, 4, 9], "dtype": "float32"}],
                "nodes": [
                    {
                        "id": "c",
                        "op": "conv2d",
                        "args": ["x"],
                        "state": "w",
                        "attrs": {"bias_state": "b", "padding": "same"},
                    }
                ],
                "outputs": ["c"],
            }
        },
    }
    built = builder.build(spec)
    lowering = pipeline.lower(built, flows.get("xnnpack"), pipeline.export_program(built))
    assert coverage.undelegated_gemms(lowering)[0][2:] == ("convolution", "computed")
    assert coverage.check(lowering).ok
    claims_computed = dataclasses.replace(
        lowering.flow,
        promises=dataclasses.replace(
            lowering.flow.promises, delegates=frozenset({"gemm_static_weight", "gemm_computed_weight"})
        ),
    )
    assert not coverage.check(dataclasses.replace(lowering, flow=claims_computed)).ok


def test_a_quantized_gemm_with_a_computed_float_bias_is_not_promised():
    """Dynamically quantized, a convolution keeps a float bias; computed from
    a parameter, stock XNNPACK declines the GEMM as it does in float (seen as
    a false coverage failure in the quantized sample), and the summary counts
    its quantized weight as left outside the delegate."""
    spec = {
        "format": "etprop-spec/2",
        "quantization": {"scheme": "dynamic_per_channel", "modules": None, "calibration": 1},
        "state": {
            "b": {"kind": "weight", "shape": [8], "seed": 1, "parametrizations": [{"type": "scale", "factor": 0.5}]},
            "w": {"kind": "weight", "shape": [8, 3, 2, 3], "seed": 2, "scale": 0.2},
        },
        "methods": {
            "forward": {
                "inputs": [{"name": "x", "shape": [2, 12, 5, 9], "dtype": "float32"}],
                "nodes": [
                    {"id": "c", "op": "conv2d", "args": ["x"], "state": "w", "attrs": {"bias_state": "b", "groups": 4}}
                ],
                "outputs": ["c"],
            }
        },
    }
    built = builder.build(spec)
    lowering = pipeline.lower(built, flows.get("xnnpack"), pipeline.export_program(built))
    assert lowering.ok, lowering.error
    assert [g[2:] for g in coverage.undelegated_gemms(lowering)] == [("convolution", "computed")]
    verdict = coverage.check(lowering)
    assert verdict.ok, verdict.message
    assert "quantized weight inside a delegate: conv2d 0 of 1" in verdict.message
    assert verdict.details["quantized_patterns"] == {"conv2d": (0, 1)}


def test_coverage_classifies_an_unrolled_loop_once_per_node(monkeypatch):
    """An unrolled scan reads each step's result twice: walking operands
    without remembering them visits 2**depth paths (seen: one quantized
    program held a campaign worker for ten minutes)."""
    graph = torch.fx.Graph()
    value = graph.placeholder("weight")
    for _ in range(40):
        value = graph.call_function(torch.ops.aten.add.Tensor, (value, value))
    visits = []
    classify = coverage._classify

    def counted(node, *rest):
        visits.append(node)
        assert len(visits) <= 100, "operands walked along every path"
        return classify(node, *rest)

    monkeypatch.setattr(coverage, "_classify", counted)
    assert coverage._source_kind(value, {"weight"}) == "computed"
    assert len(visits) == len(set(visits)) == 41


def test_differential_compares_plain_facts_as_it_compares_lowerings(lowerings):
    """A gate across Python environments receives facts, not lowerings: the
    same verdicts from the same comparison."""
    base, portable = differential.facts(lowerings["xnnpack"]), differential.facts(lowerings["portable"])
    assert differential.compare_facts(base, dict(base)).ok
    grown = differential.compare_facts(base, dict(base, pte_bytes=base["pte_bytes"] + 4096))
    assert not grown.ok and ".pte grew" in grown.message
    worse = differential.compare_facts(base, dict(portable, pte_bytes=base["pte_bytes"]))
    assert not worse.ok and "more ops outside delegates" in worse.message
    assert json.loads(json.dumps(base)) == base


def test_bundle_metadata_shared_by_the_clock_is_allowed_and_nothing_more():
    """Two Core AI bundles written within one second share their metadata
    file and the stock program comes out smaller; a candidate measured
    against such a baseline grew by that much only. Beyond it, growth fails."""
    base = {
        "flow": "coreai",
        "pte_bytes": 12605,
        "delegate_calls": 2,
        "portable_ops": {},
        "binding_bytes": 0,
        "clock_bytes": 105 + differential.NAMED_ENTRY_BYTES + differential.SEGMENT_ALIGNMENT_BYTES,
    }
    candidate = dict(base, flow="coreai+multifunction", clock_bytes=differential.SEGMENT_ALIGNMENT_BYTES)
    assert differential.compare_facts(base, dict(candidate, pte_bytes=12605 + 512)).ok
    unstamped = dict(base, clock_bytes=0)
    assert not differential.compare_facts(unstamped, dict(candidate, pte_bytes=12605 + 512)).ok
    grown = differential.compare_facts(base, dict(candidate, pte_bytes=12605 + 1024))
    assert not grown.ok and "shared by the clock" in grown.message


def test_growth_does_not_count_a_weight_found_inside_a_larger_one():
    """Two buffers drawn from one seed and scale share their first elements:
    the smaller one's bytes inside the larger one's storage are not a second
    copy; a real second copy beside them still is."""
    from etprop.program.spec import FORMAT

    spec = {
        "format": FORMAT,
        "state": {
            "big": {"kind": "buffer", "shape": [1, 11], "seed": 2, "scale": 1.0},
            "small": {"kind": "buffer", "shape": [4, 2], "seed": 2, "scale": 1.0},
        },
        "methods": {
            "forward": {
                "inputs": [
                    {"name": "x", "shape": [4, 2], "dtype": "float32"},
                    {"name": "y", "shape": [3, 11], "dtype": "float32"},
                ],
                "nodes": [
                    {"id": "v1", "op": "mul", "args": ["y"], "state": "big"},
                    {"id": "v2", "op": "minimum", "args": ["x"], "state": "small"},
                ],
                "outputs": ["v1", "v2"],
            }
        },
    }
    built = builder.build(spec)
    buffers = dict(built.module.named_buffers())
    assert growth.tensor_bytes(buffers["small"]) in growth.tensor_bytes(buffers["big"]), "the premise: a shared prefix"
    lowering = pipeline.lower(built, flows.get("portable"))
    assert lowering.ok, lowering.error
    assert sum(growth.count_occurrences(lowering.pte, buffers["small"]).values()) == 2
    verdict = growth.check(lowering)
    assert verdict.ok, verdict.message
    doubled = dataclasses.replace(lowering, pte=lowering.pte + growth.tensor_bytes(buffers["small"]))
    assert "small (4, 2) (32 bytes) stored 2 times" in growth.check(doubled).message


def test_growth_does_not_count_a_weight_found_inside_a_constant_or_a_larger_weight():
    """Bytes shared by seed, not stored twice: a buffer whose bytes begin a
    larger tensor constant drawn from the same seed, and a computed weight
    (0.25 x 2 x 2: the seed's values themselves) found inside a larger
    parameter while its source is stored too. Neither is growth."""
    from etprop.program.spec import FORMAT

    spec = {
        "format": FORMAT,
        "state": {
            "table": {"kind": "constant", "shape": [1, 11], "seed": 2, "scale": 1.0},
            "small": {"kind": "buffer", "shape": [4, 2], "seed": 2, "scale": 1.0},
            "big": {"kind": "parameter", "shape": [4, 9], "seed": 5, "scale": 1.0},
            "w": {
                "kind": "weight",
                "shape": [4, 4],
                "seed": 5,
                "scale": 0.25,
                "parametrizations": [{"type": "scale", "factor": 2.0}, {"type": "scale", "factor": 2.0}],
            },
        },
        "methods": {
            "forward": {
                "inputs": [
                    {"name": "x", "shape": [4, 2], "dtype": "float32"},
                    {"name": "y", "shape": [3, 11], "dtype": "float32"},
                    {"name": "z", "shape": [4, 9], "dtype": "float32"},
                    {"name": "u", "shape": [3, 4], "dtype": "float32"},
                ],
                "nodes": [
                    {"id": "v1", "op": "mul", "args": ["y"], "state": "table"},
                    {"id": "v2", "op": "minimum", "args": ["x"], "state": "small"},
                    {"id": "v3", "op": "add", "args": ["z"], "state": "big"},
                    {"id": "v4", "op": "mm", "args": ["u"], "state": "w"},
                ],
                "outputs": ["v1", "v2", "v3", "v4"],
            }
        },
    }
    built = builder.build(spec)
    buffers, parameters = dict(built.module.named_buffers()), dict(built.module.named_parameters())
    assert growth.tensor_bytes(buffers["small"]) in growth.tensor_bytes(built.constants()["table"]), (
        "the premise: a buffer's bytes begin the constant"
    )
    computed = next(w for w in growth.program_weights(built) if w.computed_from)
    assert growth.tensor_bytes(computed.tensor) in growth.tensor_bytes(parameters["big"]), (
        "the premise: the computed weight's bytes begin a larger parameter"
    )
    lowering = pipeline.lower(built, flows.get("portable"))
    assert lowering.ok, lowering.error
    assert sum(growth.count_occurrences(lowering.pte, buffers["small"]).values()) == 2
    assert growth.count_occurrences(lowering.pte, computed.tensor)
    verdict = growth.check(lowering)
    assert verdict.ok, verdict.message
    folded = dataclasses.replace(lowering, pte=lowering.pte + growth.tensor_bytes(computed.tensor))
    assert "is stored folded and so are all its sources" in growth.check(folded).message


def test_growth_allows_two_state_entries_computing_the_same_weight():
    """XNN-016's neutralization gives an addmm's bias its own copy of the
    weight it shared: two state entries, the same computed values, each
    stored once (a campaign's program, quantized dynamically per channel and
    folded, on XNNPACK). Not growth; a third copy still is."""
    from etprop.program.spec import QUANTIZED_FORMAT

    entry = {
        "kind": "weight",
        "shape": [1, 12],
        "seed": 5,
        "scale": 0.2887,
        "parametrizations": [
            {"type": "spectral_norm", "dim": 1, "n_power_iterations": 3, "vectors_as_parameters": True},
            {"type": "buffer_scale", "seed": 264},
            {"type": "buffer_scale", "seed": 95},
        ],
    }
    spec = {
        "format": QUANTIZED_FORMAT,
        "state": {"w": entry, "w_bias": dict(entry)},
        "quantization": {
            "scheme": "dynamic_per_channel",
            "modules": None,
            "calibration": 1,
            "fold_computed_weights": True,
        },
        "methods": {
            "forward": {
                "inputs": [{"name": "x", "shape": [1, 1], "dtype": "float32"}],
                "nodes": [
                    {
                        "id": "v1",
                        "op": "addmm",
                        "args": ["x"],
                        "state": "w",
                        "attrs": {"bias_state": "w_bias", "separate_bias": True},
                    }
                ],
                "outputs": ["v1"],
            }
        },
    }
    built = builder.build(spec)
    (computed,) = [w for w in growth.program_weights(built) if w.computed_from]
    assert computed.copies == 2
    lowering = pipeline.lower(built, flows.get("xnnpack"), pipeline.export_program(built))
    assert lowering.ok, lowering.error
    assert sum(growth.count_occurrences(lowering.pte, computed.tensor).values()) == 2, "the premise: both stored"
    verdict = growth.check(lowering)
    assert verdict.ok, verdict.message
    tripled = dataclasses.replace(lowering, pte=lowering.pte + growth.tensor_bytes(computed.tensor))
    assert "stored 3 times" in growth.check(tripled).message
