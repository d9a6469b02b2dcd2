"""The coverage space and the gate's coverage corpus: keys name what a program
exercises, a greedy cover reaches everything its pool reaches, and a packed
program computes exactly what its parts compute."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from etprop.program import builder, coverage_space
from etprop.program.spec import FORMAT, validate
from etprop.program.spec import digest as specdigest


def _program(nodes, outputs, state=None, dtype="float32", shape=(4, 8)):
    return {
        "format": FORMAT,
        "state": state or {},
        "methods": {
            "forward": {
                "inputs": [{"name": "x", "shape": list(shape), "dtype": dtype}],
                "nodes": nodes,
                "outputs": outputs,
            }
        },
    }


LEAKY = _program(
    [
        {"id": "v1", "op": "leaky_relu", "args": ["x"], "attrs": {"negative_slope": 0.2}},
        {"id": "v2", "op": "softmax", "args": ["v1"], "attrs": {"dim": -1}},
    ],
    ["v2"],
)
LINEAR = _program(
    [
        {"id": "v1", "op": "linear", "args": ["x"], "state": "w"},
        {"id": "v2", "op": "add", "args": ["v1", "x"], "attrs": {"alpha": 0.5}},
    ],
    ["v2"],
    {"w": {"kind": "weight", "shape": [8, 8], "seed": 4, "scale": 0.3}},
    dtype="float16",
)


def test_keys_name_ops_non_default_arguments_and_the_program_dtype():
    keys = coverage_space.keys(LEAKY)
    assert ("leaky_relu", "", "", "float32") in keys
    assert ("leaky_relu", "negative_slope", "positive", "float32") in keys
    assert ("softmax", "dim", "-1", "float32") in keys
    assert not any(key[0] == "leaky_relu" and key[1] == "" and key[3] != "float32" for key in keys)
    quantized = dict(LEAKY, quantization={"scheme": "static_per_tensor", "modules": None, "calibration": 1})
    assert ("softmax", "", "", "quantized static_per_tensor") in coverage_space.keys(quantized)


def test_keys_of_nested_control_flow_and_several_methods():
    inner = {"params": ["a"], "nodes": [{"id": "u1", "op": "tanh", "args": ["a"]}], "outputs": ["u1"]}
    outer = {"params": ["b"], "nodes": [{"id": "u2", "op": "map", "args": ["b"], "bodies": [inner]}], "outputs": ["u2"]}
    spec = _program([{"id": "v1", "op": "map", "args": ["x"], "bodies": [outer]}], ["v1"])
    keys = coverage_space.keys(spec)
    assert ("map>map", "", "", "float32") in keys and ("tanh", "", "", "float32") in keys
    two = dict(LINEAR, methods={"forward": LINEAR["methods"]["forward"], "other": LINEAR["methods"]["forward"]})
    assert ("methods", "2", "shared state", "float16") in coverage_space.keys(two)


def test_keys_name_the_forms_a_mutant_needs_beyond_its_op():
    """A linear with a twin weight of its shape can have its weight swapped;
    an add of two values can have its operands swapped and one dropped."""
    keys = coverage_space.keys(LINEAR)
    assert ("add", "swap_operands", "form", "float16") in keys and ("add", "drop_operand", "form", "float16") in keys
    assert ("linear", "swap_weight", "form", "float16") not in keys
    twins = json.loads(json.dumps(LINEAR))
    twins["state"]["w2"] = dict(twins["state"]["w"], seed=5)
    twins["methods"]["forward"]["nodes"].append({"id": "v3", "op": "linear", "args": ["v2"], "state": "w2"})
    twins["methods"]["forward"]["outputs"] = ["v3"]
    assert ("linear", "swap_weight", "form", "float16") in coverage_space.keys(twins)
    assert coverage_space.key_text(("linear", "swap_weight", "form", "float16")) == "linear swap_weight form [float16]"


def test_the_greedy_cover_reaches_every_key_of_its_pool_with_fewer_programs():
    pool = [
        LEAKY,
        LINEAR,
        _program([{"id": "v1", "op": "leaky_relu", "args": ["x"], "attrs": {"negative_slope": 0.2}}], ["v1"]),
    ]
    chosen, wanted = coverage_space.greedy_cover(pool)
    assert sorted(chosen) == [0, 1]
    assert set().union(*(coverage_space.keys(pool[i]) for i in chosen)) == wanted


def test_a_packed_program_computes_what_its_parts_compute():
    parts = [LEAKY, _program(LINEAR["methods"]["forward"]["nodes"], ["v2"], LINEAR["state"])]
    assert coverage_space.packing_class(parts[0]) == coverage_space.packing_class(parts[1])
    packed = coverage_space.pack(parts)
    validate(packed)
    assert len(packed["methods"]["forward"]["outputs"]) == 2
    built_parts = [builder.build(part) for part in parts]
    inputs = [value for built in built_parts for value in built.inputs("forward")]
    expected = [
        value
        for built, part_inputs in zip(built_parts, [b.inputs("forward") for b in built_parts])
        for value in built.eager("forward", part_inputs)
    ]
    got = builder.build(packed).eager("forward", tuple(inputs))
    for left, right in zip(got, expected, strict=True):
        torch.testing.assert_close(left, right, rtol=0, atol=0)


def test_programs_of_several_methods_or_dtypes_are_not_packed_together():
    two = dict(LINEAR, methods={"forward": LINEAR["methods"]["forward"], "other": LINEAR["methods"]["forward"]})
    assert coverage_space.packing_class(two) is None
    half = dict(LEAKY, dtype="float16")
    assert coverage_space.packing_class(half) != coverage_space.packing_class(LEAKY)


def _relu_chain(length, dtype="float32"):
    nodes = [
        {"id": f"v{i}", "op": "relu" if i % 2 else "neg", "args": [f"v{i - 1}" if i else "x"]} for i in range(length)
    ]
    spec = _program(nodes, [f"v{length - 1}"], dtype=dtype)
    return spec if dtype == "float32" else dict(spec, dtype=dtype)


def test_packed_programs_take_turns_by_class_in_their_order():
    from etprop.strategies import coverage_corpus as coverage

    first = [_relu_chain(n) for n in range(1, 6)]
    half = [_relu_chain(n, "float16") for n in range(1, 3)]
    programs = coverage.packed(first[:3] + half + first[3:], pack_size=2)
    assert [len(group) for _, group in programs] == [2, 2, 2, 1]
    assert [group for _, group in programs] == [first[:2], half, first[2:4], first[4:]]
    for program, group in programs:
        validate(program)
        assert coverage_space.keys(program) == set().union(*map(coverage_space.keys, group))


def test_float_classes_come_first_and_each_class_starts_at_the_flows_own_point():
    """A short campaign runs a few turns per flow: those turns hold a pack of
    every float dtype (what the mutation score reads), and flows running the
    same packs start each class at their own point, and the float turn at
    their own dtype (one pack per flow still reaches every dtype)."""
    from etprop.strategies import coverage_corpus as coverage

    quantized = [
        dict(_relu_chain(n), quantization={"scheme": "static_per_tensor", "modules": None, "calibration": 1})
        for n in range(1, 3)
    ]
    first = [_relu_chain(n) for n in range(1, 5)]
    brain = [_relu_chain(n, "bfloat16") for n in range(1, 5)]
    half = [_relu_chain(n, "float16") for n in range(1, 3)]
    programs = coverage.packed(quantized + brain + half + first, pack_size=2)
    assert [group for _, group in programs][:4] == [first[:2], half, brain[:2], quantized]
    second = coverage.packed(quantized + brain + half + first, pack_size=2, position=1, peers=2)
    assert [group for _, group in second] == [half, brain[2:], first[2:], quantized, brain[:2], first[:2]]
    third = coverage.packed(quantized + brain + half + first, pack_size=2, position=2, peers=3)
    assert [group for _, group in third][0] == brain[2:]


def test_the_pool_draws_single_method_programs_with_twins_in_each_float_dtype():
    """The mixed family draws a dtype per program and no twins: the corpus's
    packable half-precision programs, and its twins, come from draws of their own."""
    from etprop.strategies import coverage_corpus as coverage

    extra = coverage.pool_strategies()[len(coverage.families()) :]
    for strategy, dtype in zip(extra, ("float32", "float16", "bfloat16"), strict=True):
        specs = coverage.drawn(strategy, 6, seed=0)
        assert specs and all(spec.get("dtype", "float32") == dtype and len(spec["methods"]) == 1 for spec in specs), (
            dtype
        )

    from etprop.strategies.programs import programs

    def with_twins(twins: bool) -> int:
        drawn = coverage.drawn(programs(min_nodes=6, max_nodes=12, dtype="float32", twins=twins), 30, seed=0)
        return sum(_twins(spec) for spec in drawn)

    assert with_twins(True) > with_twins(False)


def _twins(spec: dict) -> int:
    """Pairs of nodes of one op on the same operands, reading distinct state of one configuration."""
    nodes = [node for node in spec["methods"]["forward"]["nodes"] if "state" in node]

    def configuration(name):
        return {k: v for k, v in spec["state"][name].items() if k != "seed"}

    return sum(
        a["op"] == b["op"]
        and a["args"] == b["args"]
        and a["state"] != b["state"]
        and configuration(a["state"]) == configuration(b["state"])
        for i, a in enumerate(nodes)
        for b in nodes[i + 1 :]
    )


def test_a_stored_corpus_is_read_back_not_drawn_again(tmp_path, monkeypatch):
    from etprop.strategies import coverage_corpus as coverage

    made = []
    monkeypatch.setattr(
        coverage, "chosen", lambda seed, pool, targeted: made.append(pool) or ([LEAKY], {("relu", "", "", "x")})
    )
    assert coverage.stored(tmp_path, 3) == ([LEAKY], {("relu", "", "", "x")})
    assert coverage.stored(tmp_path, 3) == ([LEAKY], {("relu", "", "", "x")}) and made == [3]
    coverage.stored(tmp_path, 4)
    assert made == [3, 4], "another pool size is another corpus"
    coverage.stored(tmp_path, 4, targeted=False)
    assert made == [3, 4, 4], "a pool without the targeted draws is another corpus"


def test_a_campaign_round_judges_the_next_programs_of_the_corpus_per_flow(tmp_path, monkeypatch):
    """Each round (a new session, as a new pytest process) takes the next
    program it has not judged, in the corpus's order; shard i of N every N-th."""
    from etprop import flows
    from etprop.properties import test_coverage
    from etprop.strategies import coverage_corpus as coverage
    from etprop.verdicts.session import Session

    chain = _relu_chain(2)
    two_methods = dict(chain, methods={"forward": chain["methods"]["forward"], "other": chain["methods"]["forward"]})
    specs = [_relu_chain(n) for n in range(1, 6)] + [two_methods]
    monkeypatch.setattr(coverage, "PACK_SIZE", 2)
    monkeypatch.setattr(coverage, "stored", lambda folder, pool, targeted: (specs, set()))
    monkeypatch.setattr(test_coverage, "per_round", lambda prop: 1)
    monkeypatch.setenv("ETPROP_RECORD_ONLY", "1")

    def rounds(root, count, shard="0/1", flow="portable"):
        monkeypatch.setenv("ETPROP_SHARD", shard)
        for _ in range(count):
            for test in (test_coverage.test_coverage_corpus, test_coverage.test_coverage_corpus_multi_method):
                session = Session(root, isolated=False)
                test(flows.get(flow), session, SimpleNamespace(config=None))
                session.close()
        return [
            json.loads(line)
            for path in sorted((root / "results").glob("*.jsonl"))
            for line in path.read_text().splitlines()
        ]

    packs = [specdigest(program) for program, _ in coverage.packed(specs[:-1], 2)]
    judged = rounds(tmp_path / "one", 4)
    assert [record["digest"] for record in judged] == [packs[0], specdigest(two_methods), *packs[1:]], (
        "a pack and the multi-method program, then a pack per round, then nothing new"
    )
    assert [record["property"] for record in judged[:2]] == ["coverage", "coverage_multi_method"]
    every = [specdigest(program) for program, _ in coverage.packed(specs, 2)]
    assert sorted(record["digest"] for record in rounds(tmp_path / "shard", 2, "1/2")) == sorted(every[1::2])
    monkeypatch.setenv("ETPROP_FLOWS", "portable,xnnpack")
    assert [record["digest"] for record in rounds(tmp_path / "peer", 1, flow="xnnpack")] == [
        packs[1],
        specdigest(two_methods),
    ], "the second of two flows running the same packs starts half-way through the corpus"


VARIANCE = dict(
    _program([{"id": "v1", "op": "var", "args": ["x"], "attrs": {"dim": -1}}], ["v1"], dtype="float16"), dtype="float16"
)
INLINED_COND = {
    "format": FORMAT,
    "state": {},
    "methods": {
        "forward": {
            "inputs": [{"name": "x", "shape": [4, 8], "dtype": "float32"}],
            "nodes": [
                {
                    "id": "v1",
                    "op": "cond",
                    "args": ["x"],
                    "attrs": {"inline": True},
                    "bodies": [
                        {
                            "params": ["a"],
                            "nodes": [
                                {
                                    "id": "u1",
                                    "op": "map",
                                    "args": ["a"],
                                    "bodies": [
                                        {
                                            "params": ["b"],
                                            "nodes": [{"id": "w1", "op": "tanh", "args": ["b"]}],
                                            "outputs": ["w1"],
                                        }
                                    ],
                                }
                            ],
                            "outputs": ["u1"],
                        },
                        {"params": ["a"], "nodes": [{"id": "u2", "op": "neg", "args": ["a"]}], "outputs": ["u2"]},
                    ],
                }
            ],
            "outputs": ["v1"],
        }
    },
}


def test_an_inlined_construct_is_straight_line_code_not_control_flow():
    keys = coverage_space.keys(INLINED_COND)
    assert not any(key[0].startswith("cond") for key in keys), "an inlined cond is not a torch.cond"
    assert ("map", "", "", "float32") in keys and ("tanh", "", "", "float32") in keys
    assert not any(key[0] == "cond>map" for key in keys)


def test_a_flow_runs_its_packs_with_the_causes_of_its_findings_neutralized():
    """KERNELS-001 (add with alpha, portable) removes a drawn argument: its
    spec joins the pack neutralized and also runs as drawn, alone; KERNELS-002
    (float16 var) is neutralized by an equivalent form that keeps every key,
    so nothing runs twice. A program no finding's cause is in runs as drawn."""
    from etprop.strategies import coverage_corpus as coverage
    from etprop.verdicts import known_findings

    adds = _program([{"id": "v1", "op": "add", "args": ["x", "x"], "attrs": {"alpha": 0.5}}], ["v1"])
    assert [f.id for f in known_findings.causes_on("portable", adds)] == ["KERNELS-001"]
    assert "KERNELS-002" in [f.id for f in known_findings.causes_on("portable", VARIANCE)]
    assert known_findings.causes_on("portable", LEAKY) == []

    def on(flow):
        return lambda spec: known_findings.neutralized(spec, known_findings.causes_on(flow, spec))[0]

    programs = coverage.for_flow([LEAKY, adds, VARIANCE], 4, on("portable"))
    groups = [group for _, group in programs]
    assert len(groups) == 3 and groups[-1] == [adds], "the spec as drawn runs alone, after the packs"
    pack, half = groups[0], groups[1]
    assert pack[0] == LEAKY and len(pack) == 2
    assert pack[1]["methods"]["forward"]["nodes"][0] == {"id": "v1", "op": "add", "args": ["x", "x"], "attrs": {}}
    assert half[0]["methods"]["forward"]["nodes"][0]["attrs"] == {"dim": -1, "in_float32": True}
    reached = set().union(*(coverage_space.keys(program) for program, _ in programs))
    assert reached == set().union(*map(coverage_space.keys, [LEAKY, adds, VARIANCE]))
    assert coverage.for_flow([LEAKY], 4, on("xnnpack")) == coverage.packed([LEAKY], 4)


def test_a_spec_whose_neutralization_no_longer_computes_runs_as_drawn_alone():
    """COREAI-002's neutralization resets an average pool's ``ceil_mode``,
    which shortens its output: the max pool after it then has nothing to pool
    and the rewritten spec does not export. It must not join a pack (the
    pack would fail for every part): it runs as drawn, alone."""
    from etprop.strategies import coverage_corpus as coverage
    from etprop.verdicts import known_findings

    pools = _program(
        [
            {
                "id": "v1",
                "op": "avg_pool1d",
                "args": ["x"],
                "attrs": {"kernel_size": 4, "stride": 4, "ceil_mode": True},
            },
            {"id": "v2", "op": "max_pool1d", "args": ["v1"], "attrs": {"kernel_size": 2}},
        ],
        ["v2"],
        shape=(2, 3, 5),
    )

    def on_coreai(spec):
        return known_findings.neutralized(spec, known_findings.causes_on("coreai", spec))[0]

    assert not builder.computes(on_coreai(pools)) and builder.computes(pools), "the premise"
    programs = coverage.for_flow([LEAKY, pools], 3, on_coreai)
    assert [group for _, group in programs] == [[LEAKY], [pools]]
    assert all(builder.computes(program) for program, _ in programs)


def test_a_flow_packing_is_made_once_and_read_back(tmp_path, monkeypatch):
    """Rounds and workers read the stored packing; another key (another flow,
    other findings) makes its own."""
    from etprop.strategies import coverage_corpus as coverage

    specs = [_relu_chain(n) for n in range(1, 5)] + [_relu_chain(n, "float16") for n in range(1, 3)]
    made = coverage.for_flow_stored(tmp_path, "xnnpack:1", specs, 2, lambda spec: spec, 1, 2)
    assert made == coverage.for_flow(specs, 2, lambda spec: spec, 1, 2)

    def not_again(*args):
        raise AssertionError("packed again")

    monkeypatch.setattr(coverage, "for_flow", not_again)
    assert coverage.for_flow_stored(tmp_path, "xnnpack:1", specs, 2, lambda spec: spec, 1, 2) == made
    with pytest.raises(AssertionError, match="packed again"):
        coverage.for_flow_stored(tmp_path, "xnnpack:2", specs, 2, lambda spec: spec, 1, 2)
