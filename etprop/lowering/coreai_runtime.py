"""Running ExecuTorch programs with Core AI delegates on Linux.

The ExecuTorch runtime in executorch 1.5.1 has no Core AI backend, so a .pte
whose delegates are Core AI cannot run there. Apple's coreai-core wheel does
run Core AI bundles on Linux CPU. :class:`CoreAIProgram` bridges the two: it
interprets the lowered method graph on CPU, as ExecuTorch would, and hands
each ``executorch_call_delegate`` to the Core AI runtime.

Isolation: a crash inside the Core AI runtime (native code) takes down the
process that calls it, and a hang cannot be interrupted from Python (coreai-core
1.0.0b2 never finishes loading some bundles while its memory grows; see
findings/coreai-load-hang-repeated-scalar.md). The pipeline's worker process,
with a time and memory limit, is what isolates callers; nothing here guards
against either.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

# The Core AI backend's id on lowered modules, and the single graph each
# delegate's bundle holds (executorch.backends.apple.coreai.compiler.constants).
COREAI_BACKEND_ID = "CoreAIBackend"
_ENTRYPOINT = "main"


def _manifest(lowered) -> dict:
    return json.loads(bytes(lowered.processed_bytes).decode("utf-8"))


def coreai_delegates(et_program) -> dict[str, Any]:
    """``"<method>/<lowered module name>"`` -> LoweredBackendModule, Core AI only."""
    found = {}
    for method in sorted(et_program.methods):
        gm = et_program.exported_program(method).graph_module
        for name, sub in gm.named_children():
            if getattr(sub, "backend_id", None) == COREAI_BACKEND_ID:
                found[f"{method}/{name}"] = sub
    return found


def bundle_hashes(et_program) -> dict[str, str]:
    """``"<method>/<lowered module name>"`` -> the bundle hash in its manifest.

    The hash is coreai's ``main.hash``: the sha256 of the bundle's bytecode
    (``main.mlirb``), and it names the bundle's keys in the named data.
    """
    return {key: _manifest(lm)["hash"] for key, lm in coreai_delegates(et_program).items()}


def _named_data_of(et_program, pte: Optional[bytes]) -> dict[str, bytes]:
    """Every named blob the program carries, key -> bytes.

    The .pte's own named data wins: deserializing the bytes that ship (a few
    ms) means a bundle that does not survive serialization fails here rather
    than passing from the in-memory copy. The in-memory store
    (``ExecutorchProgramManager._named_data`` in 1.5.1) adds external data
    (.ptd) the .pte only refers to.
    """
    from executorch.exir._serialize._program import deserialize_pte_binary

    blobs: dict[str, bytes] = {}
    memory = getattr(et_program, "_named_data", None)
    if memory is not None:
        for entries in memory.external_data.values():
            for key, entry in entries.items():
                blobs[key] = bytes(memory.buffers[entry.buffer_index])
    shipped = deserialize_pte_binary(pte if pte is not None else et_program.buffer).named_data
    if shipped is not None:
        for key, entry in shipped.pte_data.items():
            blobs[key] = bytes(shipped.buffers[entry.buffer_index])
    return blobs


def bundle_files(et_program, pte: Optional[bytes] = None) -> dict[str, dict[str, bytes]]:
    """``"<method>/<lowered module name>"`` -> {bundle-relative path: bytes}, inline bundles."""
    blobs = _named_data_of(et_program, pte)
    files = {}
    for key, lowered in coreai_delegates(et_program).items():
        manifest = _manifest(lowered)
        files[key] = {rel: blobs[f"coreai/{manifest['hash']}/{rel}"] for rel in manifest.get("files", [])}
    return files


@dataclass
class _Bundle:
    """One bundle, loaded once, whatever number of functions are called from it."""

    asset: Any
    model: Any


@dataclass
class _Loaded:
    """One function of a loaded bundle: its callable and the graph's I/O names in order."""

    function: Any
    input_names: list[str]
    output_names: list[str]


def _function_of(manifest: dict) -> str:
    """The bundle function a delegate calls: its manifest's ``function``
    (multifunction bundles shared by several delegates), else the single graph."""
    return manifest.get("function", _ENTRYPOINT)


def _io_names(function) -> tuple[list[str], list[str]]:
    """A loaded function's argument and result names, in graph order.

    The runtime takes and returns dicts keyed by these names; the order is
    what ties them to the delegate's positional inputs and outputs. They come
    from the runtime's function descriptor, not the asset's MLIR graph:
    reading a multifunction bundle's ``arg_attrs`` segfaults intermittently
    (finding COREAI-011).
    """
    inputs, outputs = list(function.desc.input_names), list(function.desc.output_names)
    for names in (inputs, outputs):
        if len(set(names)) != len(names):
            raise RuntimeError(f"Core AI function '{function.desc.name}' repeats an I/O name: {names}")
    return inputs, outputs


def _to_torch(array) -> torch.Tensor:
    """A Core AI output as a torch tensor that owns its memory.

    numpy has no bfloat16; coreai hands those back as ml_dtypes.bfloat16,
    which torch cannot import, so they cross as their bit patterns.
    """
    data = array.numpy()
    if data.dtype.name == "bfloat16":
        return torch.from_numpy(data.view("uint16").copy()).view(torch.bfloat16)
    return torch.from_numpy(data.copy())


def _initial(ep, target: str) -> torch.Tensor:
    """A fresh copy of a parameter or buffer (non-persistent buffers live in constants)."""
    source = ep.state_dict if target in ep.state_dict else ep.constants
    return source[target].clone()


_SCALAR_TYPES = {
    0: torch.uint8,
    1: torch.int8,
    2: torch.int16,
    3: torch.int32,
    4: torch.int64,
    5: torch.float16,
    6: torch.float32,
    7: torch.float64,
    11: torch.bool,
    15: torch.bfloat16,
}


def _shipped_tensor(value, buffers, where: str) -> torch.Tensor:
    """A serialized ExecuTorch tensor (``schema.Tensor``) rebuilt from its
    bytes, honoring its dim order."""
    dtype = _SCALAR_TYPES.get(int(value.scalar_type))
    if dtype is None:
        raise RuntimeError(f"{where}: scalar type {value.scalar_type} is not readable here")
    if not value.data_buffer_idx or buffers is None or value.data_buffer_idx >= len(buffers):
        raise RuntimeError(f"{where}: the .pte holds no data for it (data_buffer_idx {value.data_buffer_idx})")
    order = list(value.dim_order) or list(range(len(value.sizes)))
    physical = [value.sizes[d] for d in order]
    count = 1
    for size in physical:
        count *= size
    raw = bytearray(bytes(buffers[value.data_buffer_idx].storage))
    flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
    if flat.numel() < count:
        raise RuntimeError(f"{where}: {flat.numel()} serialized elements for shape {list(value.sizes)}")
    inverse = sorted(range(len(order)), key=order.__getitem__)
    return flat[:count].reshape(physical).permute(inverse).contiguous()


class _ShippedMethod:
    """One method as the .pte ships it: the processed bytes of its delegates
    (emission order) and the initial value of each graph placeholder that is
    not a user input (the emitter gives the i-th placeholder value index i)."""

    def __init__(self, pte_file, method: str):
        program = pte_file.program
        plans = {plan.name: plan for plan in program.execution_plan}
        if method not in plans:
            raise RuntimeError(f"the .pte has no method '{method}' (it has {sorted(plans)})")
        plan = plans[method]
        self.method = method
        self.plan = plan
        self.delegates = [(d.id, bytes(program.backend_delegate_data[d.processed.index].data)) for d in plan.delegates]
        self._constants = program.constant_buffer
        self._mutable = pte_file.mutable_data

    def placeholder(self, index: int, name: str, expected: torch.Tensor) -> torch.Tensor:
        """The serialized initial value of placeholder ``index``; its shape and
        dtype must be the lowered graph's, or the .pte is not this program."""
        from executorch.exir.schema import Tensor as SerializedTensor

        where = f"method '{self.method}', input '{name}'"
        if index >= len(self.plan.values) or not isinstance(self.plan.values[index].val, SerializedTensor):
            raise RuntimeError(f"{where}: the .pte has no tensor at value {index}")
        value = self.plan.values[index].val
        mutable = value.allocation_info is not None
        tensor = _shipped_tensor(value, self._mutable if mutable else self._constants, where)
        if tensor.shape != expected.shape or tensor.dtype != expected.dtype:
            raise RuntimeError(
                f"{where}: the .pte holds {tuple(tensor.shape)} {tensor.dtype}, the lowered "
                f"program {tuple(expected.shape)} {expected.dtype}"
            )
        return tensor


class CoreAIProgram:
    """Runs every method of an ``ExecutorchProgramManager`` with Core AI delegates.

    Each run starts from the initial buffer values (``keeps_state`` is False),
    so the equivalence oracle compares stateful programs call by call.

    It interprets the ExecuTorch-dialect graph (``et_program.exported_program``)
    rather than the edge graph: that is the graph that gets emitted, after the
    to_executorch passes (out variants, ``memory.alloc``, ``executorch_prim``
    scalar ops), and all of it runs as plain Python/ATen. ``memory.alloc`` makes
    a fresh tensor, so aliasing from memory planning is not reproduced; the
    portable flow's run in the real runtime covers that.

    What ships is what runs: each delegate call's manifest, the bundle files
    and the initial value of every parameter, buffer and constant the graph
    reads come from the serialized .pte (``pte``, else the program's buffer),
    so a serialization defect shows. The graph's structure, and the initial
    value of a buffer a delegate itself mutates, still come from memory.

    Bundles are written once per program into a private temp dir, keyed by
    their manifest hash (delegates with one hash share one bundle), loaded
    once (a manifest's ``function`` picks the function a delegate calls in a
    multifunction bundle; stock manifests call ``main``), and kept loaded on
    an event loop this object owns, across calls and methods. Call
    :meth:`close` (or use ``with``) to release them.

    Mutable buffers start each run from their initial values, as a freshly
    loaded ExecuTorch method does.
    """

    keeps_state = False

    def __init__(self, et_program, pte: Optional[bytes] = None, sidecar_dir: Optional[str] = None):
        """``pte``: .pte bytes to take bundles from instead of ``et_program.buffer``
        (a test hands in a tampered copy). ``sidecar_dir``: where sidecar bundles
        were written at build time."""
        self._program = et_program
        self._pte = pte
        self._sidecar_dir = Path(sidecar_dir) if sidecar_dir else None
        self._blobs: Optional[dict[str, bytes]] = None
        self._dir: Optional[Path] = None
        self._bundles: dict[str, Path] = {}
        self._loaded: dict[str, _Bundle] = {}
        self._functions: dict[tuple[str, str], _Loaded] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stack: Optional[contextlib.AsyncExitStack] = None
        self._pte_file = None
        self._shipped: dict[str, tuple[_ShippedMethod, dict]] = {}

    def __enter__(self) -> "CoreAIProgram":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()

    def close(self) -> None:
        """Unload every bundle and delete the temp dir; safe to call twice."""
        if self._loop is not None:
            if self._stack is not None:
                self._loop.run_until_complete(self._stack.aclose())
            self._loop.close()
        self._loop = self._stack = None
        self._functions.clear()
        self._loaded.clear()
        self._bundles.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    # Bundles ---------------------------------------------------------------

    def bundle_path(self, manifest: dict) -> Path:
        """The on-disk ``.aimodel`` for a manifest, written on first use."""
        model_hash = manifest["hash"]
        if model_hash in self._bundles:
            return self._bundles[model_hash]
        packaging = manifest.get("packaging")
        if packaging == "inline":
            if self._blobs is None:
                self._blobs = _named_data_of(self._program, self._pte)
            if self._dir is None:
                self._dir = Path(tempfile.mkdtemp(prefix="etprop-coreai-"))
            root = self._dir / model_hash
            for rel in manifest["files"]:
                key = f"coreai/{model_hash}/{rel}"
                if key not in self._blobs:
                    raise RuntimeError(f"Core AI bundle file '{key}' is missing from the program's named data")
                target = root / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(self._blobs[key])
            path = self._dir / manifest["path"]
        elif packaging == "sidecar":
            if self._sidecar_dir is None:
                raise RuntimeError("sidecar Core AI bundle: pass sidecar_dir= (the build's COREAI_SIDECAR_DIR)")
            path = self._sidecar_dir / manifest["path"]
        else:
            raise NotImplementedError(f"Core AI packaging '{packaging}' (AOT-compiled .aimodelc) does not run on Linux")
        self._bundles[model_hash] = path
        return path

    def _run_async(self, coro):
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._stack = contextlib.AsyncExitStack()
        return self._loop.run_until_complete(coro)

    def _load(self, manifest: dict) -> _Loaded:
        """The manifest's function, from its bundle loaded once per hash: the
        delegates of a multifunction bundle share one loaded model."""
        model_hash, function = manifest["hash"], _function_of(manifest)
        if (model_hash, function) not in self._functions:
            if model_hash not in self._loaded:
                from coreai.authoring import AIModelAsset

                asset = AIModelAsset.load(self.bundle_path(manifest))

                async def enter():
                    return await self._stack.enter_async_context(asset.executable())

                self._loaded[model_hash] = _Bundle(asset, self._run_async(enter()))
            loaded = self._loaded[model_hash].model.load_function(function)
            self._functions[(model_hash, function)] = _Loaded(loaded, *_io_names(loaded))
        return self._functions[(model_hash, function)]

    # What ships -------------------------------------------------------------

    def shipped(self, method: str) -> tuple[_ShippedMethod, dict]:
        """The serialized method, and for each delegate call node of the lowered
        graph (control-flow bodies included, in emission order) the manifest
        its serialized delegate carries."""
        if method not in self._shipped:
            from executorch.exir._serialize._program import deserialize_pte_binary

            if self._pte_file is None:
                self._pte_file = deserialize_pte_binary(self._pte if self._pte is not None else self._program.buffer)
            shipped = _ShippedMethod(self._pte_file, method)
            calls = _delegate_calls(self._program.exported_program(method).graph_module)
            if len(calls) != len(shipped.delegates):
                raise RuntimeError(
                    f"method '{method}': the lowered graph calls {len(calls)} delegates, "
                    f"the .pte has {len(shipped.delegates)}"
                )
            manifests = {}
            for (node, lowered), (backend_id, processed) in zip(calls, shipped.delegates):
                if backend_id != lowered.backend_id:
                    raise RuntimeError(
                        f"method '{method}': delegate call {node.name} is {lowered.backend_id} "
                        f"in the lowered graph, {backend_id} in the .pte"
                    )
                if backend_id == COREAI_BACKEND_ID:
                    try:
                        manifests[node] = json.loads(processed.decode("utf-8"))
                    except ValueError as exc:
                        raise RuntimeError(
                            f"method '{method}': the .pte's Core AI manifest for {node.name} is not JSON ({exc})"
                        ) from None
            self._shipped[method] = (shipped, manifests)
        return self._shipped[method]

    # Execution -------------------------------------------------------------

    def call_delegate(self, lowered, args: Sequence[Any], state: dict, manifest: dict) -> tuple:
        """Run one Core AI delegate on positional ``args``; returns its outputs.

        The bundle's graph takes the delegate program's user inputs plus the
        buffers it mutates (in input-spec order) and returns every output of
        that program, mutations first. ExecuTorch passes only the user inputs
        and receives only the user outputs; mutated buffers the delegate owns
        live in ``state`` for the rest of the run. ``manifest`` is the one the
        .pte carries for this call (``shipped``), never the in-memory copy.
        """
        from coreai.runtime import NDArray
        from torch.export.graph_signature import InputKind, OutputKind

        if getattr(lowered, "backend_id", None) != COREAI_BACKEND_ID:
            raise NotImplementedError(f"delegate backend '{lowered.backend_id}' cannot run in CoreAIProgram")
        loaded = self._load(manifest)
        sub = lowered.original_module
        signature = sub.graph_signature
        mutated = set(signature.buffers_to_mutate.values())
        pending = iter(args)
        feed = []
        for spec in signature.input_specs:
            if spec.kind == InputKind.USER_INPUT:
                feed.append(next(pending))
            elif spec.kind == InputKind.BUFFER and spec.target in mutated:
                key = (id(lowered), spec.target)
                if key not in state:
                    state[key] = _initial(sub, spec.target)
                feed.append(state[key])
        if len(feed) != len(loaded.input_names):
            raise RuntimeError(f"delegate feeds {len(feed)} inputs; its bundle takes {len(loaded.input_names)}")
        inputs = {name: NDArray(value.detach().contiguous()) for name, value in zip(loaded.input_names, feed)}
        results = self._run_async(loaded.function(inputs))
        produced = [_to_torch(results[name]) for name in loaded.output_names]
        if len(produced) != len(signature.output_specs):
            raise RuntimeError(
                f"bundle returns {len(produced)} outputs; the delegate program has {len(signature.output_specs)}"
            )
        user = []
        for spec, value in zip(signature.output_specs, produced):
            if spec.kind == OutputKind.BUFFER_MUTATION:
                state[(id(lowered), spec.target)] = value
            else:
                user.append(value)
        return tuple(user)

    def run(self, method: str, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Run a whole method: CPU nodes as ExecuTorch would, delegates on Core AI."""
        from torch.export.graph_signature import InputKind, OutputKind

        ep = self._program.exported_program(method)
        signature = ep.graph_signature
        shipped, manifests = self.shipped(method)
        user = iter(inputs)
        values = []
        for index, spec in enumerate(signature.input_specs):
            if spec.kind == InputKind.USER_INPUT:
                values.append(next(user))
            elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                source = ep.state_dict if spec.target in ep.state_dict else ep.constants
                values.append(shipped.placeholder(index, spec.arg.name, source[spec.target]))
            elif spec.kind == InputKind.CUSTOM_OBJ:
                values.append(ep.constants[spec.target])
            else:
                raise NotImplementedError(f"input kind {spec.kind} in method '{method}'")
        outputs = list(_Interpreter(ep.graph_module, self, manifests).run(*values))
        user_specs = [spec.kind == OutputKind.USER_OUTPUT for spec in signature.output_specs]
        if len(outputs) == len(user_specs):
            outputs = [value for value, is_user in zip(outputs, user_specs) if is_user]
        elif len(outputs) != sum(user_specs):
            # to_executorch writes buffer mutations back inside the graph
            # (copy_) and returns only user outputs, yet keeps the mutation
            # specs; anything else is a graph this interpreter does not know.
            raise RuntimeError(
                f"method '{method}' returns {len(outputs)} values; its signature has "
                f"{len(user_specs)} outputs of which {sum(user_specs)} are user outputs"
            )
        # Copies, as the ExecuTorch runtime hands back: an output may be an
        # input passed straight through.
        return [value.clone() if isinstance(value, torch.Tensor) else value for value in outputs]


class _Interpreter(torch.fx.Interpreter):
    """Runs ExecuTorch-dialect nodes eagerly, delegates through the owner."""

    def __init__(self, gm: torch.fx.GraphModule, owner: CoreAIProgram, manifests: dict):
        super().__init__(gm, garbage_collect_values=True)
        self._owner = owner
        self._manifests = manifests
        self._state: dict = {}
        self._node: Optional[torch.fx.Node] = None

    def run_node(self, n: torch.fx.Node):
        self._node = n
        return super().run_node(n)

    def call_function(self, target, args, kwargs):
        if target is torch.ops.higher_order.executorch_call_delegate:
            if self._node not in self._manifests:
                raise RuntimeError(f"delegate call {self._node.name} has no manifest in the .pte")
            return self._owner.call_delegate(args[0], args[1:], self._state, self._manifests[self._node])
        return super().call_function(target, args, kwargs)


def _delegate_calls(gm: torch.fx.GraphModule) -> list[tuple[torch.fx.Node, Any]]:
    """Every ``executorch_call_delegate`` node with its lowered module, in the
    order the emitter serializes them: graph order, control-flow bodies (their
    submodules, in argument order) where they are called."""
    calls = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is torch.ops.higher_order.executorch_call_delegate:
            calls.append((node, getattr(gm, node.args[0].target)))
            continue
        for arg in node.args:
            if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
                sub = getattr(gm, arg.target)
                if isinstance(sub, torch.fx.GraphModule):
                    calls.extend(_delegate_calls(sub))
    return calls
