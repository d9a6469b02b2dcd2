"""Candidate (c) coreai+multifunction: all methods' Core AI delegates as functions
of one shared bundle.

Each lowering costs seconds, so each program is lowered once per module
(module-scoped fixtures) and asserted on many times. Error cases fail in
preprocess, before any conversion, so they are cheap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

pytest.importorskip("coreai_torch", reason="the coreai extra is not installed: pip install 'etprop[coreai]'")
pytest.importorskip("coreai.runtime", reason="the coreai extra is not installed: pip install 'etprop[coreai]'")

from etprop import flows  # noqa: E402
from etprop.candidates.coreai_multifunction import (  # noqa: E402
    MULTIFUNCTION_KEY,
    CoreAIMultifunctionPartitioner,
    install_multifunction,
    multifunction_installed,
    upstream_has_multifunction,
)
from etprop.lowering.coreai_runtime import CoreAIProgram, bundle_files, coreai_delegates  # noqa: E402
from etprop.lowering.pipeline import Lowering  # noqa: E402
from etprop.oracles import shared_cache  # noqa: E402

FLOW = flows.get("coreai+multifunction")
STOCK = flows.get("coreai")
WIDTH = 512


class SharedLinear(nn.Module):
    """One Linear whose weights both methods use (the forward/prefill pattern)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Broken(nn.Module):
    """elu has no Core AI lowering: delegate -> elu on CPU -> delegate."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 8)

    def forward(self, x):
        return torch.sigmoid(self.b(nn.functional.elu(self.a(x))))


def _methods(module, width):
    return {"forward": (module, (torch.randn(1, width),)), "prefill": (module, (torch.randn(4, width),))}


def lower(methods, partitioner, context):
    from executorch.backends.apple.coreai import get_default_compile_config, get_default_passes
    from executorch.exir import to_edge_transform_and_lower

    with context:
        exported = {name: torch.export.export(module, args) for name, (module, args) in methods.items()}
        edge = to_edge_transform_and_lower(
            exported,
            partitioner=partitioner,
            transform_passes=get_default_passes(),
            compile_config=get_default_compile_config(),
        )
        return edge.to_executorch()


def lower_with(flow, methods):
    return lower(methods, flow.partitioners(), flow.context())


def manifests(program) -> dict[str, dict]:
    return {key: json.loads(bytes(lm.processed_bytes)) for key, lm in coreai_delegates(program).items()}


def coreai_keys(program) -> list[str]:
    store = program._named_data
    return sorted(key for key in store.pte_data if key.startswith("coreai/"))


# (rtol, atol) for these hand-written modules, with Core AI's float16 GEMMs
# accumulating in float16; generated programs are judged by oracles/tolerance.
ROUGH_TOLERANCE = {torch.float32: (1e-3, 1e-3), torch.float16: (1e-2, 2e-2), torch.bfloat16: (2e-2, 1e-2)}


def assert_matches(got, want):
    rtol, atol = ROUGH_TOLERANCE[want.dtype]
    torch.testing.assert_close(got[0], want.detach(), rtol=rtol, atol=atol)


@pytest.fixture(scope="module")
def shared():
    torch.manual_seed(0)
    module = SharedLinear().eval()
    methods = _methods(module, WIDTH)
    multi = lower_with(FLOW, methods)
    stock = lower_with(STOCK, methods)
    single = lower_with(STOCK, {"forward": methods["forward"]})
    runner = CoreAIProgram(multi)
    yield SimpleNamespace(module=module, multi=multi, stock=stock, single=single, runner=runner)
    runner.close()


@pytest.fixture(scope="module")
def broken():
    torch.manual_seed(1)
    module = Broken().eval()
    program = lower_with(FLOW, _methods(module, 16))
    runner = CoreAIProgram(program)
    yield module, program, runner
    runner.close()


@pytest.fixture(scope="module")
def option_off(shared):
    """The add-on installed, the option off: must be the stock lowering."""
    return lower(
        _methods(shared.module, WIDTH), [CoreAIMultifunctionPartitioner(multifunction=False)], install_multifunction()
    )


def test_flow_is_registered():
    assert FLOW.runtime == "coreai" and FLOW.baseline == "coreai"
    assert FLOW.promises.shared_cache
    assert FLOW.available, FLOW.unavailable_reason()
    assert not upstream_has_multifunction()
    (partitioner,) = FLOW.partitioners()
    assert partitioner.multifunction
    assert any(spec.key == MULTIFUNCTION_KEY for spec in partitioner.delegation_spec.compile_specs)


@pytest.mark.parametrize("method,rows", [("forward", 1), ("prefill", 4)])
def test_both_methods_match_eager(shared, method, rows):
    x = torch.randn(rows, WIDTH)
    assert_matches(shared.runner.run(method, [x]), shared.module(x))


def test_one_hash_one_bundle_loaded_once(shared):
    found = manifests(shared.multi)
    assert sorted(found) == ["forward/lowered_module_0", "prefill/lowered_module_0"]
    assert len({m["hash"] for m in found.values()}) == 1
    assert len({key.split("/")[1] for key in coreai_keys(shared.multi)}) == 1
    for method, rows in (("forward", 1), ("prefill", 4)):
        shared.runner.run(method, [torch.randn(rows, WIDTH)])
    assert len(shared.runner._loaded) == 1 and len(shared.runner._functions) == 2


def test_function_names_and_bindings(shared):
    found = manifests(shared.multi)
    assert found["forward/lowered_module_0"]["function"] == "forward_0"
    assert found["prefill/lowered_module_0"]["function"] == "prefill_0"
    for manifest in found.values():
        assert manifest["input_names"] and manifest["output_names"]
        assert manifest["packaging"] == "inline"
        assert manifest["path"] == f"{manifest['hash']}/model.aimodel"
    for lowered in coreai_delegates(shared.multi).values():
        assert lowered.backend_id == "CoreAIBackend"


def test_pte_is_as_small_as_one_method(shared):
    multi, single, stock = (len(p.buffer) for p in (shared.multi, shared.single, shared.stock))
    assert multi <= stock
    assert abs(multi - single) <= 0.01 * single, (multi, single)
    assert stock > 1.9 * single  # stock ships the weights twice


def test_graph_break_gives_one_function_per_partition(broken):
    module, program, runner = broken
    found = manifests(program)
    assert sorted(m["function"] for m in found.values()) == ["forward_0", "forward_1", "prefill_0", "prefill_1"]
    assert len({m["hash"] for m in found.values()}) == 1
    for method, rows in (("forward", 1), ("prefill", 4)):
        x = torch.randn(rows, 16)
        assert_matches(runner.run(method, [x]), module(x))
    assert len(runner._loaded) == 1 and len(runner._functions) == 4


def test_option_off_is_stock(shared, option_off):
    off, stock = manifests(option_off), manifests(shared.stock)
    assert off == stock
    assert coreai_keys(option_off) == coreai_keys(shared.stock)
    files_off, files_stock = bundle_files(option_off), bundle_files(shared.stock)
    for key in files_stock:
        # metadata.json carries a creation timestamp (findings/coreai-bundle-hash-nondeterminism.md).
        assert {k: v for k, v in files_off[key].items() if not k.endswith("metadata.json")} == {
            k: v for k, v in files_stock[key].items() if not k.endswith("metadata.json")
        }
    for key, lowered in coreai_delegates(option_off).items():
        assert lowered.compile_specs == coreai_delegates(shared.stock)[key].compile_specs


def test_shared_cache_oracle_passes_on_multifunction(shared):
    lowering = Lowering(
        flow=FLOW, built=SimpleNamespace(methods=["forward", "prefill"]), exported={}, executorch=shared.multi
    )
    verdict = shared_cache.check(lowering)
    assert verdict.ok, verdict


def test_shared_cache_oracle_fails_on_stock_pretending_to_share(shared):
    lowering = Lowering(
        flow=STOCK, built=SimpleNamespace(methods=["forward", "prefill"]), exported={}, executorch=shared.stock
    )
    # No assertion on stock's own verdict: two bundles converted in the same
    # second hold identical metadata.json bytes under two keys, which the
    # oracle flags for every flow (findings/coreai-bundle-hash-nondeterminism.md).
    verdict = shared_cache.check(dataclasses.replace(lowering, flow=FLOW))
    assert not verdict.ok
    assert "hashes" in verdict.message and "bundles" in verdict.message


def _small_methods():
    torch.manual_seed(2)
    module = Broken().eval()
    return _methods(module, 16)


def test_different_compile_specs_are_refused():
    partitioners = {
        "forward": [CoreAIMultifunctionPartitioner(multifunction=True)],
        "prefill": [CoreAIMultifunctionPartitioner(multifunction=True, min_deployment_version="27")],
    }
    with pytest.raises(ValueError, match="one set of compile specs"):
        lower(_small_methods(), partitioners, install_multifunction())
    assert not multifunction_installed()


def test_option_on_some_methods_only_is_refused():
    from executorch.backends.apple.coreai import CoreAIPartitioner

    partitioners = {"forward": [CoreAIMultifunctionPartitioner(multifunction=True)], "prefill": [CoreAIPartitioner()]}
    with pytest.raises(ValueError, match=r"set for methods \['forward'\] but not for \['prefill'\]"):
        lower(_small_methods(), partitioners, install_multifunction())


def test_input_enumerations_are_refused():
    with pytest.raises(ValueError, match="input_enumerations"):
        CoreAIMultifunctionPartitioner(multifunction=True, input_enumerations=[{0: [1, 4]}])


def test_option_without_the_add_on_is_refused():
    with pytest.raises(RuntimeError, match="install_multifunction"):
        lower(_small_methods(), [CoreAIMultifunctionPartitioner(multifunction=True)], contextlib.nullcontext())


def test_context_restores_and_refuses_double_install():
    from executorch.backends.apple.coreai import CoreAIBackend
    from executorch.exir.backend.backend_details import BackendDetails

    assert "preprocess_multimethod" not in CoreAIBackend.__dict__
    with install_multifunction():
        assert "preprocess_multimethod" in CoreAIBackend.__dict__
        with pytest.raises(RuntimeError, match="already installed"):
            with install_multifunction():
                pass
        assert multifunction_installed()
    assert "preprocess_multimethod" not in CoreAIBackend.__dict__
    assert CoreAIBackend.preprocess_multimethod.__func__ is BackendDetails.preprocess_multimethod.__func__
    with pytest.raises(ZeroDivisionError):
        with install_multifunction():
            raise ZeroDivisionError
    assert not multifunction_installed() and "preprocess_multimethod" not in CoreAIBackend.__dict__


RECIPE_DRIVER = """
import torch
from torch import nn
from executorch.exir import to_edge_transform_and_lower


class Shared(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.tanh(self.fc(x))


module = Shared().eval()
inputs = {"forward": torch.randn(1, 8), "prefill": torch.randn(4, 8)}
edge = to_edge_transform_and_lower({name: torch.export.export(module, (x,)) for name, x in inputs.items()},
                                   partitioner=partitioners(), transform_passes=transform_passes(),
                                   compile_config=compile_config())
manager = edge.to_executorch()
run = make_runner(manager.buffer, manager)
for name, x in inputs.items():
    torch.testing.assert_close(run(name, [x])[0], module(x).detach(), rtol=1e-5, atol=1e-5)
print("RECIPE OK")
"""


@pytest.mark.slow
def test_repro_recipe_lowers_and_runs(tmp_path):
    """Standalone repros of this flow install the add-on and run through CoreAIProgram."""
    import subprocess
    import sys

    script = tmp_path / "recipe.py"
    script.write_text(FLOW.repro_recipe + RECIPE_DRIVER)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "RECIPE OK" in done.stdout, done.stderr[-3000:]


def test_sidecar_delivery_writes_one_bundle(tmp_path):
    from executorch.backends.apple.coreai import coreai_sidecar_dir

    torch.manual_seed(3)
    module = Broken().eval()
    where = tmp_path / "sidecar"
    with coreai_sidecar_dir(str(where)):
        program = lower(
            _methods(module, 16),
            [CoreAIMultifunctionPartitioner(multifunction=True, uses_sidecar=True)],
            install_multifunction(),
        )
    found = manifests(program)
    assert {m["packaging"] for m in found.values()} == {"sidecar"}
    assert len({m["hash"] for m in found.values()}) == 1
    assert [p.name for p in where.iterdir()] == [next(iter(found.values()))["hash"]]
    with CoreAIProgram(program, sidecar_dir=str(where)) as runner:
        for method, rows in (("forward", 1), ("prefill", 4)):
            x = torch.randn(rows, 16)
            assert_matches(runner.run(method, [x]), module(x))


@pytest.fixture(scope="module")
def two_method_lowerings():
    """A spec whose two methods share a Linear, lowered by stock and multifunction."""
    import copy

    from etprop.lowering import pipeline
    from etprop.program import builder
    from etprop.program.spec import FORMAT

    layer = lambda n_in, n_out, seed: {
        "kind": "layer",
        "type": "Linear",
        "seed": seed,  # noqa: E731
        "kwargs": {"in_features": n_in, "out_features": n_out},
    }
    spec = {
        "format": FORMAT,
        "state": {"l1": layer(64, 64, 1), "l2": layer(64, 32, 2)},
        "methods": {
            "forward": {
                "inputs": [{"name": "x", "shape": [1, 64], "dtype": "float32"}],
                "nodes": [
                    {"id": "a", "op": "layer", "args": ["x"], "state": "l1"},
                    {"id": "b", "op": "layer", "args": ["a"], "state": "l2"},
                ],
                "outputs": ["b"],
            },
            "prefill": {
                "inputs": [{"name": "x", "shape": [8, 64], "dtype": "float32"}],
                "nodes": [{"id": "a", "op": "layer", "args": ["x"], "state": "l1"}],
                "outputs": ["a"],
            },
        },
    }
    built = builder.build(spec)
    exported = pipeline.export_program(built)
    return {name: pipeline.lower(built, flows.get(name), copy.deepcopy(exported)) for name in ("coreai", FLOW.name)}


def test_differential_accepts_one_bundle_with_weights_once(two_method_lowerings):
    from etprop.oracles import differential

    verdict = differential.check(two_method_lowerings[FLOW.name], two_method_lowerings)
    assert verdict.ok, verdict


def test_differential_rejects_a_multifunction_flow_that_keeps_one_bundle_per_method(two_method_lowerings):
    """The stock lowering presented as the candidate: the shared Linear is in both bundles."""
    from etprop.oracles import differential

    stock = two_method_lowerings["coreai"]
    unmerged = dataclasses.replace(stock, flow=FLOW)
    verdict = differential.check(unmerged, {"coreai": stock, FLOW.name: unmerged})
    assert not verdict.ok
    assert "stores 2 bundle(s)" in verdict.message and "repeated across methods" in verdict.message, verdict.message
