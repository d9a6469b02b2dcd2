"""Program families: composite strategies that draw whole program specs.

Every node slot draws an index where 0 means "no node": Hypothesis shrinks
integers toward 0, so shrinking deletes whole nodes anywhere in the graph,
and a counterexample for a one-op defect ends as one or two nodes.
"""

from __future__ import annotations

from hypothesis import event
from hypothesis import strategies as st

from etprop.spec import FORMAT
from etprop.strategies.graph import GraphDraft, ProgramDraft, Value
from etprop.strategies.ops import DRAWERS, GEMM_DRAWERS


@st.composite
def input_values(draw, program: ProgramDraft, count: int | None = None, rank: int | None = None):
    """Method inputs: rank 2 (tokens), 3 (sequences, conv1d) or 4 (images)."""
    values = []
    for index in range(count or draw(st.integers(1, 2))):
        r = rank or draw(st.integers(2, 4))
        shape = [draw(st.integers(1, 4))] + [draw(st.integers(1, 12)) for _ in range(r - 1)]
        values.append(Value(program.fresh("x"), tuple(shape)))
    return values


def _inputs_spec(values: list[Value]) -> list[dict]:
    return [{"name": v.name, "shape": list(v.shape), "dtype": "float32"} for v in values]


def draw_body(draw, graph: GraphDraft, slots: int, drawers) -> None:
    """Fill ``graph`` with up to ``slots`` nodes drawn from ``drawers``."""
    for _ in range(slots):
        choice = draw(st.integers(0, len(drawers)))
        if choice == 0:
            continue
        name, drawer = drawers[choice - 1]
        if drawer(draw, graph) is None:
            event(f"slot skipped: {name} did not fit")


def finish_method(graph: GraphDraft) -> dict:
    outputs = graph.leaves()
    if not outputs:
        outputs = [graph.add("relu", [graph.inputs[0]]).name]
    return {"inputs": _inputs_spec(graph.inputs), "nodes": graph.nodes, "outputs": outputs}


@st.composite
def method_body(draw, program: ProgramDraft, min_nodes: int, max_nodes: int, drawers=DRAWERS,
                inputs: list[Value] | None = None):
    graph = GraphDraft(program, inputs or draw(input_values(program)))
    draw_body(draw, graph, draw(st.integers(min_nodes, max_nodes)), drawers)
    return finish_method(graph)


@st.composite
def programs(draw, min_nodes: int = 1, max_nodes: int = 32, computed_weights: bool = False,
             gemm_heavy: bool = False):
    """Single-method programs over the whole op vocabulary.

    ``computed_weights`` makes every GEMM weight computed from parameters;
    ``gemm_heavy`` doubles the GEMMs' share of node slots.
    """
    program = ProgramDraft(computed_weights=computed_weights)
    drawers = DRAWERS + GEMM_DRAWERS if gemm_heavy else DRAWERS
    body = draw(method_body(program, min_nodes, max_nodes, drawers))
    event(f"nodes: {len(body['nodes']) // 8 * 8}-{len(body['nodes']) // 8 * 8 + 7}")
    return {"format": FORMAT, "state": program.state, "methods": {"forward": body}}


def computed_weight_programs(min_nodes: int = 1, max_nodes: int = 16):
    """GEMMs whose weights are computed (weight_norm, spectral_norm, custom)."""
    return programs(min_nodes=min_nodes, max_nodes=max_nodes, computed_weights=True, gemm_heavy=True)
