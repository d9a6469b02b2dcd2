"""Candidate (b), xnnpack+cf: GEMMs inside cond/map/scan bodies land on XNNPACK
with their weights embedded once.

Each program is lowered once per flow in a module-scoped fixture (a lowering
costs seconds); the tests only inspect the results.
"""

from __future__ import annotations

import dataclasses
import operator
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.scan import scan as hop_scan

import etprop.flows as flows
from etprop.candidates import xnnpack_cf
from etprop.lowering import pipeline
from etprop.oracles import coverage, cycles, growth
from etprop.oracles.cycles import graph_modules
from etprop.program import builder
from etprop.program.spec import FORMAT
from etprop.verdicts.outcomes import Outcome

CF = flows.get("xnnpack+cf")
STOCK = flows.get("xnnpack")
GEMMS = {"linear", "addmm", "mm", "convolution"}


class CondOneBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(8, 8)

    def forward(self, x):
        return torch.cond(x.mean() > 0, lambda x: self.l(x).relu(), lambda x: x.tanh(), (x,))


class CondBothBranches(nn.Module):
    def __init__(self):
        super().__init__()
        self.l, self.k = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return torch.cond(x.mean() > 0, lambda x: self.l(x).relu(), lambda x: self.k(x).tanh(), (x,))


class CondAndTopLevel(nn.Module):
    """One parameter used in a branch and at top level: stored once."""

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(8, 8)

    def forward(self, x):
        y = torch.cond(x.mean() > 0, lambda x: self.l(x).relu(), lambda x: x.sigmoid(), (x,))
        return y + self.l(x)


class MapLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(8, 8)

    def forward(self, x):
        return hop_map(lambda row: self.l(row).relu(), x)


class ScanLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(8, 8)

    def forward(self, x):
        def combine(carry, item):
            nxt = self.l(carry + item).tanh()
            return nxt, nxt.clone()

        return hop_scan(combine, torch.zeros(8), x)[1]


class CondInMap(nn.Module):
    """Nested: the cond's operands are the map body's placeholders."""

    def __init__(self):
        super().__init__()
        self.l, self.k = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        def body(row):
            return torch.cond(row.mean() > 0, lambda r: self.l(r), lambda r: self.k(r).relu(), (row,))

        return hop_map(body, x)


class MappedParameter(nn.Module):
    """``w`` is mapped over (a different slice each iteration): it stays an operand."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 8))
        self.l = nn.Linear(8, 8)

    def forward(self, x):
        return hop_map(lambda row, y: self.l(row * y), self.w, x)


class NoControlFlow(nn.Module):
    def __init__(self):
        super().__init__()
        self.l, self.k = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.k(self.l(x).relu())


CASES = {
    "cond_one_branch": CondOneBranch,
    "cond_both_branches": CondBothBranches,
    "cond_and_top_level": CondAndTopLevel,
    "map": MapLinear,
    "scan": ScanLinear,
    "cond_in_map": CondInMap,
    "mapped_parameter": MappedParameter,
}
# Inputs that take every branch: all rows positive, all negative, mixed rows.
_BASE = torch.rand(4, 8) + 0.1
INPUTS = {"positive": _BASE, "negative": -_BASE, "mixed": _BASE * torch.tensor([1.0, -1.0, 1.0, -1.0]).unsqueeze(1)}


def _built(module) -> SimpleNamespace:
    """The parts of a BuiltProgram that pipeline.lower and the oracles read."""
    return SimpleNamespace(
        module=module, methods=["forward"], spec={"format": FORMAT, "state": {}, "methods": {"forward": {"nodes": []}}}
    )


def _lower(flow, module):
    exported = {"forward": torch.export.export(module, (INPUTS["positive"],), strict=False)}
    lowering = pipeline.lower(_built(module), flow, exported)
    assert lowering.ok, lowering.error
    return lowering


@pytest.fixture(scope="module")
def lowered() -> dict:
    torch.manual_seed(0)
    out = {}
    for name, cls in CASES.items():
        module = cls().eval()
        out[name] = (module, _lower(CF, module))
    return out


def _run(pte: bytes, x):
    from executorch.runtime import Runtime

    keep = pte  # the runtime reads the bytes in place: hold them while it runs
    program = Runtime.get().load_program(keep)
    out = program.load_method("forward").execute([x])[0].clone()
    del program
    return out


def _outside(lowering) -> list[str]:
    """Ops every graph of the lowered program (bodies included) runs itself."""
    return [
        coverage.op_name(n)
        for _, gm in graph_modules(lowering.edge.exported_program().graph_module)
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target is not operator.getitem
    ]


@pytest.mark.parametrize("case", list(CASES))
def test_matches_eager_for_every_branch(lowered, case):
    module, lowering = lowered[case]
    for label, x in INPUTS.items():
        with torch.no_grad():
            expected = module(x)
        torch.testing.assert_close(
            _run(lowering.pte, x), expected, rtol=1e-4, atol=1e-5, msg=lambda m: f"{case}/{label}: {m}"
        )


@pytest.mark.parametrize("case", list(CASES))
def test_body_gemms_are_delegated(lowered, case):
    _, lowering = lowered[case]
    assert not GEMMS & set(_outside(lowering)), _outside(lowering)
    assert coverage.check(lowering).ok


@pytest.mark.parametrize("case", list(CASES))
def test_weights_stored_once_and_no_cycles(lowered, case):
    _, lowering = lowered[case]
    for oracle in (growth.check, cycles.check):
        verdict = oracle(lowering, {CF.name: lowering})
        assert verdict.ok, verdict.message


@pytest.mark.parametrize("case", [c for c in CASES if c != "mapped_parameter"])
def test_consumed_weights_leave_operands_placeholders_and_signature(lowered, case):
    _, lowering = lowered[case]
    program = lowering.edge.exported_program()
    assert [s.arg.name for s in program.graph_signature.input_specs] == ["x"]
    originals = {name for name, _ in lowered[case][0].named_parameters()}
    assert not originals & (set(program.state_dict) | set(program.constants))
    for _, gm in graph_modules(program.graph_module):
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                assert node.users, f"{node.name} left unused in {gm}"
            assert not {xnnpack_cf.ALIAS_KEY, xnnpack_cf.EDGES_KEY, xnnpack_cf.SOURCE_KEY} & set(node.meta)


def test_cond_branches_lose_the_same_placeholder(lowered):
    program = lowered["cond_one_branch"][1].edge.exported_program()
    (cond,) = [n for n in program.graph.nodes if n.target is torch.ops.higher_order.cond]
    true_gm, false_gm = (getattr(program.graph_module, b.target) for b in cond.args[1:3])
    arity = {len([n for n in gm.graph.nodes if n.op == "placeholder"]) for gm in (true_gm, false_gm)}
    assert arity == {len(cond.args[3])} == {1}


def test_mapped_parameter_stays_an_operand(lowered):
    program = lowered["mapped_parameter"][1].edge.exported_program()
    sig = program.graph_signature
    assert list(sig.inputs_to_parameters.values()) == ["w"]
    (mapped,) = [n for n in program.graph.nodes if n.target is torch.ops.higher_order.map_impl]
    assert [a.name for a in mapped.args[1]] == ["p_w"]
    assert [a.name for a in mapped.args[2]] == ["x"]


def test_without_control_flow_lowers_byte_identically_to_stock():
    torch.manual_seed(1)
    module = NoControlFlow().eval()
    assert _lower(CF, module).pte == _lower(STOCK, module).pte


def test_stock_is_not_blamed_for_bodies_but_a_claim_is_checked():
    """The body-GEMM claim is judged only for flows that make it."""
    torch.manual_seed(2)
    stock = _lower(STOCK, ScanLinear().eval())
    assert coverage.check(stock).ok
    claiming = dataclasses.replace(STOCK, name="claims-bodies", promises=CF.promises)
    verdict = coverage.check(dataclasses.replace(stock, flow=claiming))
    assert not verdict.ok and "scan[0]" in verdict.message


def test_while_loop_is_unsupported_not_a_crash(while_loop_spec):
    lowering = pipeline.lower(builder.build(while_loop_spec), CF)
    assert lowering.outcome is Outcome.UNSUPPORTED, lowering.error


def test_context_restores_patches_and_refuses_double_install():
    from executorch.exir.backend import backend_api
    from executorch.exir.program._program import EdgeProgramManager

    create = backend_api.create_exported_program_from_submodule
    to_backend = EdgeProgramManager.__dict__["to_backend"]
    with xnnpack_cf.install_control_flow_weights():
        assert backend_api.create_exported_program_from_submodule is not create
        with pytest.raises(RuntimeError, match="already installed"):
            with xnnpack_cf.install_control_flow_weights():
                pass
        assert backend_api.create_exported_program_from_submodule is not create
    assert backend_api.create_exported_program_from_submodule is create
    assert EdgeProgramManager.__dict__["to_backend"] is to_backend
    with pytest.raises(ValueError):
        with xnnpack_cf.install_control_flow_weights():
            raise ValueError("boom")
    assert backend_api.create_exported_program_from_submodule is create
    assert EdgeProgramManager.__dict__["to_backend"] is to_backend
