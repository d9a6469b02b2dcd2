"""The real-model family: a window of an exported graph, written as a spec,
computes what the graph computes (with the window's weights copied into the
original module), keeps tied weights tied, and is classified honestly."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from torch import nn

from etprop.program.builder import build
from etprop.program.spec import validate
from etprop.strategies import model_windows, model_zoo


class _Blocks(nn.Module):
    """Many of the translation rules in one small module: grouped strided
    convolution, batch norm, relu6, chunk + cat, select, unbind, attention,
    layer norm, a tied linear, permute, pooling, resampling, split, a
    parameter operand, mean, softmax, t + mm."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=2)
        self.bn = nn.BatchNorm2d(8, eps=1e-3)
        self.norm = nn.LayerNorm(8)
        self.proj = nn.Linear(8, 8)
        self.gain = nn.Parameter(torch.randn(8))
        self.mat = nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        y = F.relu6(self.bn(self.conv(x)))  # (1, 8, 4, 4)
        a, b = y.chunk(2, dim=1)
        y = torch.cat([b, a], dim=1)
        y = F.max_pool2d(y, 2, ceil_mode=True)  # (1, 8, 2, 2)
        y = F.interpolate(y, scale_factor=2.0, mode="nearest")  # (1, 8, 4, 4)
        tokens = y.flatten(2).permute(0, 2, 1)  # (1, 16, 8)
        tokens = self.norm(tokens) * self.gain
        q, k, v = torch.cat([tokens, self.proj(tokens), self.proj(tokens).square()]).unbind(0)
        attended = F.scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0))
        first, rest = attended.split([1, 15], dim=1)
        pooled = rest.mean(dim=1, keepdim=True) + first.select(1, 0).unsqueeze(1)
        scores = torch.softmax(pooled.squeeze(1).pow(2), dim=-1)
        return torch.mm(scores, self.mat) + torch.mm(scores.t(), scores).sum(0, keepdim=True) + scores.pow(3)


def _copy_into(module: nn.Module, program: torch.export.ExportedProgram, graph, spec: dict, built) -> None:
    """Load the built window's state into the original module, entry by
    entry, through the placeholders the translation recorded."""
    signature = program.graph_signature
    targets = {**signature.inputs_to_parameters, **signature.inputs_to_buffers}
    state = module.state_dict()
    for key, entry in spec["state"].items():
        target = targets[graph.sources[key]]
        held = getattr(built.module, key)
        if entry["kind"] == "weight":
            state[target].copy_(held.weight)
        elif entry["kind"] == "parameter":
            state[target].copy_(held)
        else:
            prefix = target.rsplit(".", 1)[0]
            for name, tensor in held.state_dict().items():
                if f"{prefix}.{name}" in state:
                    state[f"{prefix}.{name}"].copy_(tensor)
    module.load_state_dict(state)


def _check_whole(module: nn.Module, inputs: tuple, name: str):
    module = module.eval()
    program = torch.export.export(module, inputs)
    graph = model_windows.translate(name, program)
    spec = model_windows.window(graph, 0, 10_000, seed=0)
    validate(spec)
    built = build(spec)
    _copy_into(module, program, graph, spec, built)
    with torch.no_grad():
        expected = module(*inputs)
        got = built.module(*inputs)
    torch.testing.assert_close(got if isinstance(got, tuple) else (got,), (expected,), rtol=1e-4, atol=1e-4)
    return graph, spec


def test_a_whole_graph_window_computes_what_the_module_computes():
    graph, spec = _check_whole(_Blocks(), (torch.randn(1, 4, 8, 8),), "blocks")
    assert set(graph.classes) == {"expressed"}
    ops = {node["op"] for node in spec["methods"]["forward"]["nodes"]}
    assert {"conv2d", "layer", "hardtanh", "slice", "cat", "matmul", "softmax", "squeeze", "interpolate"} <= ops


def test_the_faithfulness_check_fails_on_a_wrong_translation(monkeypatch):
    """The check above can fail: a ``cat`` rule that reverses its operands
    (same shapes, other values) is caught."""
    rule = model_windows._RULES[torch.ops.aten.cat.default]

    def reversed_cat(t, piece, node, a):
        return rule(t, piece, node, {**a, "tensors": list(a["tensors"])[::-1]})

    monkeypatch.setitem(model_windows._RULES, torch.ops.aten.cat.default, reversed_cat)
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        _check_whole(_Blocks(), (torch.randn(1, 4, 8, 8),), "blocks")


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Parameter(torch.randn(10, 6))
        self.shared = nn.Linear(6, 6)

    def forward(self, x):
        return F.linear(self.shared(self.shared(x)), self.embed)


def test_tied_weights_and_reused_modules_stay_one_state_entry():
    graph, spec = _check_whole(_Tied(), (torch.randn(2, 6),), "tied")
    linears = [node for node in spec["methods"]["forward"]["nodes"] if node["op"] == "linear"]
    assert len(linears) == 3
    assert linears[0]["state"] == linears[1]["state"] != linears[2]["state"]
    assert len(spec["state"]) == 3  # shared weight, shared bias, embedding


class _Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, ids, x):
        folded = self.scale.exp() * 2  # from parameters only
        y = self.embed(ids) + x  # integer indices
        return torch.erf(y) * folded  # erf: not in the vocabulary


def test_nodes_are_classified_and_windows_read_what_they_cannot_compute_as_inputs():
    program = torch.export.export(_Mixed().eval(), (torch.tensor([[1, 2]]), torch.randn(1, 2, 4)))
    graph = model_windows.translate("mixed", program)
    assert graph.classes == {"parameters only": 2, "integer and indexing": 1, "expressed": 2, "not expressed: erf": 1}
    # The add reads the embedding's output and x; the mul reads erf's output
    # and, for the value computed from parameters, a seeded parameter.
    added = model_windows.window(graph, 0, 30, seed=0)
    assert [node["op"] for node in added["methods"]["forward"]["nodes"]] == ["add"]
    assert len(added["methods"]["forward"]["inputs"]) == 2 and added["state"] == {}
    scaled = model_windows.window(graph, 1, 30, seed=0)
    (mul,) = scaled["methods"]["forward"]["nodes"]
    assert mul["op"] == "mul" and len(scaled["methods"]["forward"]["inputs"]) == 1
    assert scaled["state"][mul["state"]]["kind"] == "parameter" and scaled["state"][mul["state"]]["shape"] == [4]
    for spec in (added, scaled):
        built = build(spec)
        built.module(*built.inputs("forward"))


real_models = pytest.mark.skipif(not model_zoo.available(), reason=f"no model library: {model_zoo.INSTALL_HINT}")


@real_models
@pytest.mark.parametrize("name", ["mobilenet_v3_small", "shufflenet_v2_x0_5", "convnext_tiny", "squeezenet1_1"])
def test_real_architectures_translate_whole_and_compute_the_same(name):
    if name not in model_zoo.available():
        pytest.skip(model_zoo.INSTALL_HINT)
    torch.manual_seed(0)
    module, inputs = model_zoo.BY_NAME[name].make(model_zoo._library(model_zoo.BY_NAME[name].library))
    graph, _ = _check_whole(module, inputs, name)
    assert set(graph.classes) == {"expressed"}


@real_models
@settings(max_examples=15, deadline=None)
@given(spec=model_windows.real_model_windows())
def test_drawn_windows_are_valid_connected_programs_of_3_to_30_nodes(spec):
    validate(spec)
    body = spec["methods"]["forward"]
    assert 1 <= len(body["nodes"]) <= 30 + 4  # the last piece may add up to 5 nodes (attention)
    built = build(spec)
    outputs = built.module(*built.inputs("forward"))
    for output in outputs if isinstance(outputs, tuple) else (outputs,):
        assert torch.isfinite(output.float()).all()


def test_a_missing_model_library_is_one_line_naming_the_fix(monkeypatch):
    monkeypatch.setattr(model_zoo, "_has", lambda library: False)
    model_zoo.exported.cache_clear()
    with pytest.raises(
        ImportError, match=r"^the real-model recipe 'bert' needs transformers: pip install 'etprop\[models\]'"
    ):
        model_zoo.exported("bert")


def test_the_coverage_benchmark_prints_each_model_and_kind(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent.parent / "benchmarks" / "real_model_coverage.py"
    spec = importlib.util.spec_from_file_location("real_model_coverage", path)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    monkeypatch_graph = model_windows.translate(
        "mixed", torch.export.export(_Mixed().eval(), (torch.tensor([[1, 2]]), torch.randn(1, 2, 4)))
    )
    model_windows._GRAPHS["bert"] = monkeypatch_graph
    try:
        assert benchmark.main(["bert"]) == 0
    finally:
        del model_windows._GRAPHS["bert"]
    printed = capsys.readouterr().out
    assert "| bert | text | 6 | 33.3% | 2 | 1 | erf 1 |" in printed
    assert "| text | 6 | 33.3% | 40.0% | 16.7% |" in printed
