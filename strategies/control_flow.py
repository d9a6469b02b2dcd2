"""Control-flow programs: torch.cond, map, scan and while_loop, nested, with
parameters (plain and computed) used inside their bodies.

Bodies are drawn from shape-preserving ops, so both branches of a cond (and
every iteration of a loop) produce the shapes the higher-order op requires.
Predicates are computed from data (``value.mean() > threshold``), so every
predicate is its own tensor and different inputs take different branches.
"""

from __future__ import annotations

from hypothesis import event
from hypothesis import strategies as st

from etprop.program.spec import FORMAT
from etprop.strategies.graph import GraphDraft, ProgramDraft, Value
from etprop.strategies.ops import DRAWERS, _unary, _weight
from etprop.strategies.programs import draw_body, finish_method, input_values
from etprop.strategies.sizes import slot_count

KINDS = ("cond", "map", "scan", "while_loop")


def draw_square_gemm(draw, g: GraphDraft):
    """A GEMM whose output has its input's shape: linear d→d with a parameter
    or computed weight, used at top level or inside a body."""
    x = g.pick(draw, lambda v: v.rank >= 1)
    if x is None:
        return None
    d = x.shape[-1]
    attrs = {"bias_state": _weight(draw, g, (d,))} if draw(st.booleans()) else {}
    return g.add("linear", [x], attrs, state=_weight(draw, g, (d, d)))


def draw_binary_same_shape(draw, g: GraphDraft):
    x = g.pick(draw)
    other = g.pick(draw, lambda v: v.shape == x.shape)
    op = draw(st.sampled_from(["add", "mul", "sub", "maximum"]))
    return g.add(op, [x, other])


SHAPE_PRESERVING = [
    ("relu", _unary("relu")),
    ("tanh", _unary("tanh")),
    ("sigmoid", _unary("sigmoid")),
    ("neg", _unary("neg")),
    ("square_gemm", draw_square_gemm),
    ("binary", draw_binary_same_shape),
    ("square_gemm", draw_square_gemm),
]


def _body(draw, program: ProgramDraft, params: list[Value], result_shape, depth: int) -> dict:
    """Nodes over ``params`` ending in a value of ``result_shape``."""
    graph = GraphDraft(program, params)
    draw_square_gemm(draw, graph) if draw(st.booleans()) else _unary("tanh")(draw, graph)
    drawers = SHAPE_PRESERVING + ([("nested", _nested(depth + 1))] if depth < 2 else [])
    draw_body(draw, graph, draw(st.integers(0, 4)), drawers)
    last = [v for v in graph.values[len(params) :] if v.shape == tuple(result_shape)]
    return {"params": [p.name for p in params], "nodes": graph.nodes, "outputs": [last[-1].name]}


def _nested(depth: int):
    def draw_nested(draw, g: GraphDraft):
        return add_control_flow(draw, g, depth)

    return draw_nested


def add_control_flow(draw, g: GraphDraft, depth: int = 0):
    kind = draw(st.sampled_from(KINDS))
    program = g.program
    x = g.pick(draw, lambda v: v.rank >= (2 if kind in ("map", "scan") else 1) and v.shape[-1] <= 16)
    if x is None:
        return None
    node = {"id": program.fresh("v"), "op": kind}
    if kind == "cond":
        pred_source = g.pick(draw)
        operands = [x] + (
            [o]
            if (o := g.pick(draw, lambda v: v.shape == x.shape and v.name != x.name)) and draw(st.booleans())
            else []
        )
        params = [Value(program.fresh("a"), v.shape) for v in operands]
        node.update(
            args=[pred_source.name] + [v.name for v in operands],
            attrs={"threshold": draw(st.sampled_from([0.0, 0.25, -0.25]))},
            bodies=[_body(draw, program, params, x.shape, depth) for _ in range(2)],
        )
        args, shape = [pred_source] + operands, x.shape
    elif kind == "map":
        params = [Value(program.fresh("a"), x.shape[1:])]
        node.update(args=[x.name], bodies=[_body(draw, program, params, x.shape[1:], depth)])
        args, shape = [x], x.shape
    elif kind == "scan":
        first = g.add("slice", [x], {"dim": 0, "start": 0, "end": 1, "step": 1})
        init = g.add("squeeze", [first], {"dim": 0})
        carry, item = Value(program.fresh("a"), x.shape[1:]), Value(program.fresh("a"), x.shape[1:])
        body_graph = GraphDraft(program, [carry, item])
        mixed = body_graph.add(draw(st.sampled_from(["add", "mul"])), [carry, item])
        draw_body(draw, body_graph, draw(st.integers(0, 3)), SHAPE_PRESERVING)
        draw_square_gemm(draw, body_graph)
        last = [v for v in body_graph.values if v.shape == carry.shape][-1]
        node.update(
            args=[init.name, x.name],
            attrs={"select": draw(st.sampled_from([0, 1]))},
            bodies=[
                {"params": [carry.name, item.name], "nodes": body_graph.nodes, "outputs": [last.name or mixed.name]}
            ],
        )
        args = [init, x]
        shape = x.shape[1:] if node["attrs"]["select"] == 0 else x.shape
    else:
        params = [Value(program.fresh("a"), x.shape)]
        node.update(
            args=[x.name],
            attrs={"iterations": draw(st.integers(1, 3))},
            bodies=[_body(draw, program, params, x.shape, depth)],
        )
        args, shape = [x], x.shape
    event(f"control flow: {kind}" + (" (nested)" if depth else ""))
    return g.add_node(node, args, tuple(shape))


@st.composite
def control_flow_programs(draw, max_nodes: int = 10, kinds: tuple = KINDS):
    """A top-level graph with at least one control-flow node, parameters used
    inside bodies, at top level, or both."""
    program = ProgramDraft()
    graph = GraphDraft(program, draw(input_values(program, count=draw(st.integers(1, 2)), rank=2)))
    drawers = [d for d in DRAWERS if d[0] in ("relu", "tanh", "linear", "add", "mul", "sum", "softmax")]
    draw_body(draw, graph, slot_count(draw, 0, max_nodes // 2), drawers + [("square_gemm", draw_square_gemm)])
    for _ in range(draw(st.integers(1, 2))):
        add_control_flow(draw, graph)
    draw_body(draw, graph, slot_count(draw, 0, max_nodes // 2), drawers)
    return {"format": FORMAT, "state": program.state, "methods": {"forward": finish_method(graph)}}
