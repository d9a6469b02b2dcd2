"""What the attribution tests and the neutralization-form tests share: small
programs, the findings' repro specs and fixtures, a spec rewritten into a
finding's equivalent form, and what a rewrite changed."""

from __future__ import annotations

import json

from etprop.program.neutralize import neutralize
from etprop.program.spec import FORMAT, all_nodes
from etprop.verdicts import known_findings


def _program(nodes, state=None, shape=(3, 8), outputs=None):
    return {
        "format": FORMAT,
        "state": state or {},
        "methods": {
            "forward": {
                "inputs": [{"name": "x", "shape": list(shape), "dtype": "float32"}],
                "nodes": nodes,
                "outputs": outputs or [nodes[-1]["id"]],
            }
        },
    }


def _weight(shape, seed, parametrizations=()):
    entry = {"kind": "weight", "shape": list(shape), "seed": seed, "scale": 0.3}
    if parametrizations:
        entry["parametrizations"] = list(parametrizations)
    return entry


def _repro_spec(name: str) -> dict:
    return json.loads((known_findings.FINDINGS_DIR / "repros" / name).read_text())["spec"]


def _fixture_spec(name: str) -> dict:
    from pathlib import Path

    return json.loads((Path(__file__).parent / "fixtures" / name).read_text())["spec"]


def _float_repro_spec(name: str) -> dict:
    """A quantized repro's program without its quantization."""
    spec = _repro_spec(name)
    spec.pop("quantization")
    return {**spec, "format": FORMAT}


def _equivalent_form(spec: dict, finding_id: str, marker: str, places: int = 1):
    """``spec`` and its neutralization by ``finding_id`` (``places`` places
    changed, ``marker`` in the rewritten source only), built; each computes on
    normal and large inputs exactly what the other does."""
    import torch

    from etprop.program import builder

    rule = next(f for f in known_findings.load() if f.id == finding_id).neutralize
    rewritten_spec, changed = neutralize(spec, list(rule))
    assert changed == places
    original, rewritten = builder.build(spec), builder.build(rewritten_spec)
    assert marker in rewritten.source and marker not in original.source
    for kind in ("normal", "large"):
        inputs = original.inputs("forward", kind)
        for want, got in zip(original.eager("forward", inputs), rewritten.eager("forward", inputs)):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def _with_relu_output(spec: dict) -> dict:
    body = spec["methods"]["forward"]
    body["nodes"].append({"id": "extra", "op": "relu", "args": [body["inputs"][0]["name"]]})
    body["outputs"].append("extra")
    return spec


def _state_changes(before: dict, after: dict) -> set[str]:
    """Names of changed state entries; an added entry must be a copy of an
    existing one (a bias given its own tensor), and none may go."""
    assert before.keys() <= after.keys(), "a neutralization removed state"
    for name in after.keys() - before.keys():
        assert after[name] in before.values(), f"added state {name} copies no entry"
    return {name for name in before if before[name] != after[name]}


def _node_changes(before: dict, after: dict) -> dict[str, str]:
    """node id -> op, for every node whose attributes changed; ids, ops, args
    and outputs must be the same in both, and a node's state the same entry
    or a new copy of it (a layer called at two places given one per call)."""
    old = {node["id"]: node for _, node in all_nodes(before)}
    new = {node["id"]: node for _, node in all_nodes(after)}
    assert old.keys() == new.keys(), "a neutralization added or removed a node"
    for node_id, node in old.items():
        assert (node["op"], node.get("args")) == (new[node_id]["op"], new[node_id].get("args")), node_id
        state, now = node.get("state"), new[node_id].get("state")
        assert now == state or (now not in before["state"] and after["state"][now] == before["state"][state]), node_id
    for method in before["methods"]:
        assert before["methods"][method]["outputs"] == after["methods"][method]["outputs"]
    return {node_id: node["op"] for node_id, node in old.items() if node.get("attrs") != new[node_id].get("attrs")}


def _effective_weights(spec: dict) -> dict:
    """Every weight-kind state entry's value as the built module computes it."""
    from etprop.program import builder

    module = builder.build(spec).module
    return {
        name: getattr(module, name).weight.detach().clone()
        for name, entry in spec["state"].items()
        if entry["kind"] == "weight"
    }
