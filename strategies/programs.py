"""Program families: composite strategies that draw whole program specs.

Every node slot draws an index where 0 means "no node": Hypothesis shrinks
integers toward 0, so shrinking deletes whole nodes anywhere in the graph,
and a counterexample for a one-op defect ends as one or two nodes.
"""

from __future__ import annotations

from hypothesis import event
from hypothesis import strategies as st

from etprop.program.quantize import SCHEMES
from etprop.program.spec import FLOAT_DTYPES, all_nodes, format_for
from etprop.strategies import sizes
from etprop.strategies.graph import FLOAT, GraphDraft, ProgramDraft, Value, dtype_name
from etprop.strategies.ops import CAMPAIGN_ONLY, DRAWERS, GEMM_DRAWERS, add_twin
from etprop.strategies.sizes import slot_count


@st.composite
def input_values(draw, program: ProgramDraft, count: int | None = None, rank: int | None = None):
    """Method inputs: rank 2 (tokens), 3 (sequences, conv1d), 4 (images) or 5 (volumes)."""
    values = []
    for index in range(count or draw(st.integers(1, 2))):
        r = rank or draw(st.integers(2, 5 if sizes.exploring() else 4))
        # Rank 5 (volumes, 3-D convolutions and pools) with smaller dims.
        top = 12 if r < 5 else 5
        shape = [draw(st.integers(1, 4))] + [draw(st.integers(1, top)) for _ in range(r - 1)]
        values.append(Value(program.fresh("x"), tuple(shape)))
    return values


def _inputs_spec(values: list[Value], dtype: str = "float32") -> list[dict]:
    """Float inputs in the program's dtype; integer ones in theirs, with their bound."""
    specs = []
    for v in values:
        entry = {"name": v.name, "shape": list(v.shape), "dtype": v.dtype or dtype}
        if not v.is_float and v.dtype != "bool":
            entry["high"] = v.high
        specs.append(entry)
    return specs


# float32 first (Hypothesis shrinks toward it); the half types where ops allow.
PROGRAM_DTYPES = ("float32", "float32", "float32", "float16", "bfloat16")


def _spec(program: ProgramDraft, methods: dict) -> dict:
    spec = {"state": program.state, "methods": methods}
    spec["format"] = format_for(spec)
    if program.dtype != "float32":
        spec["dtype"] = program.dtype
        event(f"dtype: {program.dtype}")
    return spec


TWIN_ODDS = 5


def draw_body(draw, graph: GraphDraft, slots: int, drawers) -> None:
    """Fill ``graph`` with up to ``slots`` nodes drawn from ``drawers`` (in a
    campaign, from a random subset of them: swarm testing, so an op's rare
    neighbours are not drowned by the common ones; outside one, not from the
    drawers whose failures are not triaged yet)."""
    if not sizes.exploring():
        drawers = [entry for entry in drawers if entry[0] not in CAMPAIGN_ONLY]
    if sizes.swarming():
        drawers = swarm(draw, drawers)
    for _ in range(slots):
        choice = draw(st.integers(0, len(drawers)))
        if choice == 0:
            continue
        name, drawer = drawers[choice - 1]
        value = drawer(draw, graph)
        if value is None:
            event(f"slot skipped: {name} did not fit")
        elif (
            graph.program.twin_odds
            and graph.nodes[-1]["id"] == value.name
            and graph.program.reads_parameters(graph.nodes[-1])
            and draw(st.integers(0, graph.program.twin_odds - 1)) == 0
            and add_twin(graph, value)
        ):
            event("twin: the same op on the same operands with its own parameters")


def swarm(draw, drawers: list) -> list:
    """A random subset of ``drawers``: each op left out with odds one in two.
    Hypothesis shrinks each choice toward keeping the op, so a shrunk program
    draws from the whole vocabulary again."""
    names = sorted({name for name, _ in drawers})
    left_out = {name for name in names if draw(st.booleans())}
    kept = [entry for entry in drawers if entry[0] not in left_out]
    if not kept:
        return drawers
    event(f"swarm: {len(names) - len(left_out)} of {len(names)} ops")
    return kept


def finish_method(graph: GraphDraft) -> dict:
    outputs = graph.leaves()
    if not outputs:
        # Nothing was drawn: one relu of the first input, whose shape it keeps
        # (added without ``add``'s size checks, which the input itself may fail).
        source = graph.inputs[0]
        node = {"id": graph.program.fresh("v"), "op": "relu", "args": [source.name]}
        outputs = [graph.add_node(node, [source], source.shape).name]
    return {"inputs": _inputs_spec(graph.inputs, graph.program.dtype), "nodes": graph.nodes, "outputs": outputs}


@st.composite
def method_body(
    draw, program: ProgramDraft, min_nodes: int, max_nodes: int, drawers=DRAWERS, inputs: list[Value] | None = None
):
    graph = GraphDraft(program, inputs or draw(input_values(program)), takes_new_inputs=True)
    draw_body(draw, graph, slot_count(draw, min_nodes, max_nodes), drawers)
    return finish_method(graph)


@st.composite
def programs(
    draw,
    min_nodes: int = 1,
    max_nodes: int = 32,
    computed_weights: bool = False,
    gemm_heavy: bool = False,
    dtype: str | None = None,
    dynamic_batch: bool | None = None,
    twins: bool = False,
):
    """Single-method programs over the whole op vocabulary.

    ``computed_weights`` makes every GEMM weight computed from parameters;
    ``gemm_heavy`` doubles the GEMMs' share of node slots. ``dtype`` and
    ``dynamic_batch`` fix what is otherwise drawn (a dynamic batch dim is
    only made where the graph allows one). ``twins``: one node in TWIN_ODDS
    that reads a parameter is drawn again beside itself with parameters of
    its own (where a swapped weight shows).
    """
    program = ProgramDraft(
        computed_weights=computed_weights,
        dtype=dtype or draw(st.sampled_from(PROGRAM_DTYPES)),
        twin_odds=TWIN_ODDS if twins else 0,
    )
    drawers = DRAWERS + GEMM_DRAWERS if gemm_heavy else DRAWERS
    body = draw(method_body(program, min_nodes, max_nodes, drawers))
    event(f"nodes: {len(body['nodes']) // 8 * 8}-{len(body['nodes']) // 8 * 8 + 7}")
    wants_dynamic = dynamic_batch if dynamic_batch is not None else draw(st.integers(0, 1)) == 1
    if wants_dynamic:
        _make_batch_dynamic(draw, program, body)
    return _spec(program, {"forward": body})


# The smallest dynamic size: torch.export specializes sizes 0 and 1.
MIN_DYNAMIC = 2


def _make_batch_dynamic(draw, program: ProgramDraft, body: dict) -> None:
    """Export the leading dim of a one-input method as dynamic, when every
    node's shape, re-inferred at three batch sizes, stays fixed or a multiple
    of the batch (no op pins or slices the batch size)."""
    if len(body["inputs"]) != 1 or body["inputs"][0]["shape"][0] < MIN_DYNAMIC:
        return
    inp = body["inputs"][0]
    high = max(inp["shape"][0], MIN_DYNAMIC + 1) + draw(st.integers(0, 6))
    rest = tuple(inp["shape"][1:])
    sizes = (MIN_DYNAMIC, high, 2 * high + 1)
    shapes = [_shapes(program, body, [Value(inp["name"], (size,) + rest)]) for size in sizes]
    if (
        all(shapes)
        and all(_batch_linear(sizes, [found[name] for found in shapes]) for name in shapes[0])
        and not _reshapes_batch_away(body, shapes)
        and not _indexes_the_batch(body, shapes)
    ):
        inp["dynamic"] = [[0, MIN_DYNAMIC, high]]
        event("dynamic batch dim")


def _reshapes_batch_away(body: dict, shapes: list[dict]) -> bool:
    """Whether a reshape of a batch-sized value leads with a fixed dim, as
    (B, 12) -> (6, 2B): export then guards on the batch size (``B != 6``),
    which a declared range cannot satisfy."""

    def varies(name, dim=None):
        return len({found[name] if dim is None else found[name][dim] for found in shapes}) > 1

    return any(
        node["op"] == "reshape" and varies(node["args"][0]) and not varies(node["id"], 0) for node in body["nodes"]
    )


def _indexes_the_batch(body: dict, shapes: list[dict]) -> bool:
    """Whether a slice, select or split cuts the batch dim of a batch-sized
    value: its result may keep a fixed size at the three sizes tried (a
    slice 1:4:3 has one row from 2 rows on), yet export specializes the
    batch size it indexes."""
    for node in body["nodes"]:
        if node["op"] not in ("slice", "select", "split") or not node.get("args"):
            continue
        source = node["args"][0]
        if source not in shapes[0] or len({found[source][0] for found in shapes}) == 1:
            continue
        dim = node.get("attrs", {}).get("dim", 0)
        if dim % len(shapes[0][source]) == 0:
            return True
    return False


def _batch_linear(sizes: tuple, shapes: list[tuple]) -> bool:
    """Each dim is fixed or a multiple of the batch size at every size: what
    export can express without guards (a slice of the batch dim is neither)."""
    if len({len(shape) for shape in shapes}) != 1:
        return False
    for dims in zip(*shapes):
        fixed = len(set(dims)) == 1
        multiple = all(d % s == 0 for d, s in zip(dims, sizes)) and len({d // s for d, s in zip(dims, sizes)}) == 1
        if not (fixed or multiple):
            return False
    return True


def computed_weight_programs(min_nodes: int = 1, max_nodes: int = 16):
    """GEMMs whose weights are computed (weight_norm, spectral_norm, custom)."""
    return programs(min_nodes=min_nodes, max_nodes=max_nodes, computed_weights=True, gemm_heavy=True)


def _shapes(program: ProgramDraft, body: dict, inputs: list[Value]) -> dict | None:
    """Every node's shape with other input shapes, or None if one no longer
    type-checks. Inferred under fake tensors, which check what meta kernels
    do not (a convolution's input channels against its weight): another batch
    size can reach a channel dim through a view (``unsqueeze(0)``)."""
    import logging

    from torch._subclasses.fake_tensor import FakeTensorMode

    graph = GraphDraft(program, inputs)
    known = {v.name: v for v in inputs}
    for entry in body["inputs"]:
        if entry["name"] not in known:
            known[entry["name"]] = Value(entry["name"], tuple(entry["shape"]), _value_dtype(entry))
    # Fake tensors log every kernel that rejects its inputs; here a rejection is an answer.
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    was_disabled, fake_log.disabled = fake_log.disabled, True
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            for node in body["nodes"]:
                if node["op"] in ("cond", "map", "scan", "while_loop"):
                    return None
                args = [known[a] for a in node["args"]]
                out = graph.evaluate(node, args)
                if out is None or not all(out.shape):
                    return None
                known[node["id"]] = Value(node["id"], tuple(out.shape), dtype_name(out.dtype))
    finally:
        fake_log.disabled = was_disabled
    return {name: value.shape for name, value in known.items()}


def _value_dtype(entry: dict) -> str:
    return FLOAT if entry.get("dtype", "float32") in FLOAT_DTYPES else entry["dtype"]


def _reinfer(program: ProgramDraft, body: dict, inputs: list[Value]) -> bool:
    """Whether ``body``'s nodes still type-check with other input shapes."""
    return _shapes(program, body, inputs) is not None


@st.composite
def multi_method_programs(draw, min_methods: int = 2, max_methods: int = 4, max_nodes: int = 16):
    """Several methods over shared weights: the same graph at another batch
    size (decode/prefill style), or a different graph over the same state."""
    program = ProgramDraft(dtype=draw(st.sampled_from(PROGRAM_DTYPES)))
    first = draw(method_body(program, 2, max_nodes, DRAWERS + GEMM_DRAWERS))
    methods = {"forward": first}
    for index in range(1, draw(st.integers(min_methods, max_methods))):
        name = (
            draw(st.sampled_from(["prefill", "decode", "encode", "score"]).filter(lambda n: n not in methods))
            if index < 4
            else f"method{index}"
        )
        style = draw(st.sampled_from(["same_graph_other_shape", "other_graph"]))
        # Integer inputs index dims of the first method's sizes: that graph keeps them.
        if style == "same_graph_other_shape" and all(i["dtype"] in FLOAT_DTYPES for i in first["inputs"]):
            inputs = [Value(i["name"], (draw(st.integers(1, 8)),) + tuple(i["shape"][1:])) for i in first["inputs"]]
            if _reinfer(program, first, inputs):
                methods[name] = {
                    "inputs": _inputs_spec(inputs, program.dtype),
                    "nodes": first["nodes"],
                    "outputs": first["outputs"],
                }
                event("multi-method: same graph, other batch")
                continue
        methods[name] = draw(method_body(program, 2, max_nodes, GEMM_DRAWERS + DRAWERS))
        event("multi-method: other graph, shared state")
    return _spec(program, methods)


# Layers whose modules the quantizer can be limited to (set_module_name).
_QUANTIZABLE_LAYERS = ("Linear", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d")


@st.composite
def quantization_configs(draw, spec: dict, schemes: tuple = SCHEMES) -> dict:
    """A PT2E quantization of ``spec`` (etprop/program/quantize.py): one of
    ``schemes``, the whole program or some of its GEMM layers, and the
    calibration batches."""
    scheme = draw(st.sampled_from(schemes))
    layers = sorted(
        {
            node["state"]
            for _, node in all_nodes(spec)
            if node["op"] == "layer" and spec["state"][node["state"]].get("type") in _QUANTIZABLE_LAYERS
        }
    )
    modules = None
    if layers and draw(st.integers(0, 3)) == 3:
        modules = sorted(draw(st.sets(st.sampled_from(layers), min_size=1, max_size=len(layers))))
        event("quantization: some layers")
    event(f"quantization: {scheme}")
    return {"scheme": scheme, "modules": modules, "calibration": draw(st.integers(1, 3))}


def _stateful(spec: dict) -> bool:
    return any(entry["kind"] == "buffer" and entry.get("mutable") for entry in spec["state"].values())


@st.composite
def quantized(draw, float_programs, schemes: tuple = SCHEMES):
    """A float32 program from ``float_programs``, quantized with one of
    ``schemes``: the same graph after prepare_pt2e, calibration and
    convert_pt2e (programs that mutate a buffer stay out: a converted program
    is judged call by call). In a campaign, at the properties' own sizes
    (sizes.unshifted)."""
    with sizes.unshifted():
        spec = draw(float_programs.filter(lambda s: s.get("dtype", "float32") == "float32" and not _stateful(s)))
    quantized_spec = {**spec, "quantization": draw(quantization_configs(spec, schemes))}
    return {**quantized_spec, "format": format_for(quantized_spec)}


def quantized_programs(min_nodes: int = 4, max_nodes: int = 24, schemes: tuple = SCHEMES):
    """GEMM-heavy programs (where quantized operators matter), quantized."""
    return quantized(programs(min_nodes=min_nodes, max_nodes=max_nodes, gemm_heavy=True, dtype="float32"), schemes)
