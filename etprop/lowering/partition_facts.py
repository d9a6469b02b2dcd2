"""Structure facts recorded while a partitioner runs, for the cycles oracle.

Partition tags exist only between partitioning and fusion, so the pipeline
takes this snapshot at partition time; ``oracles/cycles.py`` judges it later.
"""

from __future__ import annotations

from collections import defaultdict

import networkx
from torch.fx.passes.utils.fuser_utils import validate_partition


def graph_modules(graph_module, prefix="root"):
    """(path, graph module) for ``graph_module`` and its control-flow submodules."""
    yield prefix, graph_module
    for name, child in graph_module.named_children():
        if hasattr(child, "graph") and type(child).__name__ in ("GraphModule", "_LazyGraphModule"):
            yield from graph_modules(child, f"{prefix}.{name}")


def contracted_cycle(graph, tag_of) -> list[str]:
    """Tags (or node names) on a cycle of the graph with every partition
    contracted to one vertex; empty when the contraction is a DAG."""
    contracted = networkx.DiGraph()
    vertex = {node: tag_of.get(node, f"node:{node.name}") for node in graph.nodes}
    contracted.add_nodes_from(vertex.values())
    for node in graph.nodes:
        for user in node.users:
            if vertex[node] != vertex[user]:
                contracted.add_edge(vertex[node], vertex[user])
    on_cycles = [c for c in networkx.strongly_connected_components(contracted) if len(c) > 1]
    return sorted(v for component in on_cycles for v in component)


def snapshot(graph_module, tags: dict) -> list[dict]:
    """What the cycles oracle needs from one partitioner result; run at
    partition time, when the tags are still on the nodes."""
    records = []
    for path, gm in graph_modules(graph_module):
        tag_of = {n: n.meta["delegation_tag"] for n in gm.graph.nodes if n.meta.get("delegation_tag") in tags}
        groups = defaultdict(list)
        for node, tag in tag_of.items():
            groups[tag].append(node)
        records.append(
            {
                "graph": path,
                "partitions": {tag: [n.name for n in nodes] for tag, nodes in groups.items()},
                "not_convex": sorted(tag for tag, nodes in groups.items() if not validate_partition(nodes)),
                "cycle": contracted_cycle(gm.graph, tag_of),
            }
        )
    return records
