"""No cycles: contracting each partition to one node leaves a DAG.

The pipeline records every partitioner result at partition time, before the
partitions are fused (``etprop.lowering.partition_facts``): node → tag in every graph, control-flow submodules
included. Here each partition is checked with torch.fx's
``validate_partition`` (a path may not leave a partition and come back), and
all partitions of a graph are contracted together and the contracted graph is
checked for a cycle (two partitions that are each fine alone can still depend
on each other). Every lowered graph must also pass ``Graph.lint()``
(topological order, well-formed nodes).
"""

from __future__ import annotations

from etprop.lowering.partition_facts import graph_modules
from etprop.oracles import Verdict

NAME = "no cycles"


def check(lowering, lowerings=None) -> Verdict:
    problems = []
    for record in lowering.partitions:
        for tag in record["not_convex"]:
            nodes = record["partitions"][tag]
            problems.append(
                f"partition {tag} in {record['graph']} is not convex (a path leaves it and comes back): {nodes[:8]}"
            )
        if record["cycle"]:
            problems.append(
                f"contracting the partitions of {record['graph']} leaves a cycle through {record['cycle'][:8]}"
            )
    if lowering.edge is not None:
        for method in lowering.built.methods:
            for path, gm in graph_modules(lowering.edge.exported_program(method).graph_module):
                try:
                    gm.graph.lint()
                except Exception as exc:
                    problems.append(f"lowered graph {method}/{path} is not valid: {exc}")
    if problems:
        return Verdict.failed(NAME, "; ".join(problems), problems=problems)
    count = sum(len(r["partitions"]) for r in lowering.partitions)
    return Verdict.passed(NAME, f"{count} partitions in {len(lowering.partitions)} graphs; contraction is a DAG")
