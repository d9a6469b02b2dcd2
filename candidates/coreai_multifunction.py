"""Candidate (c): one multifunction Core AI bundle for all methods of a program.

executorch 1.5.1's Core AI backend converts every delegate on its own, so a
program whose methods share weights (``forward`` and ``prefill``) ships, loads
and caches those weights once per method. Here, with
``CoreAIMultifunctionPartitioner(multifunction=True)``:

* every Core AI partition of every method becomes one function,
  ``<method>_<partition index>``, of a single ``coreai_torch.TorchConverter``
  program, converted once, saved once and embedded once in the named data
  under one content hash (MLIR uniques identical constants, so shared weights
  are stored once in the bytecode);
* each delegate keeps its own manifest, the stock one plus its binding
  (``function``, ``input_names``, ``output_names``), all pointing at the same
  bundle, so all delegates share one cache key; the backend id stays
  ``CoreAIBackend``.

ExecuTorch hands all partitions of all methods to
``BackendDetails.preprocess_multimethod``, and finds the backend class by name,
so the add-on replaces ``CoreAIBackend.preprocess_multimethod`` (``@final``
forbids a subclass) only inside :func:`install_multifunction`. With the option
off the original runs untouched.

executorch and coreai are imported only inside functions, so the registry loads
without them.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Iterator

from etprop.flows import register
from etprop.flows.base import Flow, Promises
from etprop.flows.coreai import COREAI_RECIPE_TAIL

# Compile spec that marks a multifunction delegate; it reaches preprocess with
# the partition (ExecuTorch carries nothing else from partitioner to backend).
MULTIFUNCTION_KEY = "coreai_multifunction"

_install_lock = threading.Lock()
_installed: dict = {}


def function_name(method: str, index: int) -> str:
    """The bundle function of a method's ``index``-th Core AI partition."""
    return f"{method}_{index}"


def _partitioner_class():
    """Built on first use: the base class lives in executorch."""
    from executorch.backends.apple.coreai import CoreAIPartitioner
    from executorch.exir.backend.compile_spec_schema import CompileSpec
    from executorch.exir.backend.partitioner import DelegationSpec

    class CoreAIMultifunctionPartitioner(CoreAIPartitioner):
        """``CoreAIPartitioner`` plus ``multifunction``: all methods' delegates in one bundle.

        The option travels as a compile spec, so each partition says whether it
        belongs in the shared bundle. Enumerated shapes attach one shape
        configuration per converted graph, which a shared bundle cannot yet do
        per function, so the combination is refused here rather than producing
        a bundle whose functions silently ignore the enumeration.
        """

        def __init__(self, *, multifunction: bool = False, **kwargs) -> None:
            if multifunction and kwargs.get("input_enumerations"):
                raise ValueError(
                    "CoreAIPartitioner(multifunction=True) cannot be combined with "
                    "input_enumerations: a multifunction bundle has no per-function "
                    "shape configuration; lower without multifunction instead"
                )
            super().__init__(**kwargs)
            self.multifunction = multifunction
            if multifunction:
                self._base_compile_specs = list(self._base_compile_specs) + [CompileSpec(MULTIFUNCTION_KEY, b"1")]
                self.delegation_spec = DelegationSpec(
                    backend_id=self.delegation_spec.backend_id, compile_specs=self._base_compile_specs
                )

        def partition(self, exported_program):
            # Without the add-on, stock preprocess would ignore the flag and
            # quietly emit one bundle per delegate.
            if self.multifunction and not multifunction_installed():
                raise RuntimeError(
                    "CoreAIPartitioner(multifunction=True) needs the multifunction "
                    "preprocess: lower inside `with install_multifunction():`"
                )
            return super().partition(exported_program)

    return CoreAIMultifunctionPartitioner


_CLASS: list = []


def CoreAIMultifunctionPartitioner(**kwargs):
    """Construct the partitioner (class created lazily; see :func:`_partitioner_class`)."""
    if not _CLASS:
        _CLASS.append(_partitioner_class())
    return _CLASS[0](**kwargs)


def _is_flagged(specs) -> bool:
    return any(spec.key == MULTIFUNCTION_KEY for spec in specs)


def _spec_items(specs) -> list[tuple[str, bytes]]:
    return sorted((spec.key, bytes(spec.value)) for spec in specs)


class _OneFunction:
    """A view of a multifunction program whose ``main`` is one of its functions,
    so upstream checks written for single-graph bundles apply per function."""

    def __init__(self, program, function: str):
        self._program = program
        self._function = function

    def get_graph(self, name: str):
        from executorch.backends.apple.coreai.compiler.constants import MAIN_ENTRYPOINT

        graph = self._program.get_graph(self._function if name == MAIN_ENTRYPOINT else name)
        if graph is None:
            raise RuntimeError(f"multifunction bundle has no function '{self._function}'")
        return graph


def _io_names(program, function: str) -> tuple[list[str], list[str]]:
    graph = program.get_graph(function)
    return (
        [attr["coreai.name"].value for attr in graph.arg_attrs],
        [attr["coreai.name"].value for attr in graph.res_attrs],
    )


def _check_uniform(compile_specs: dict) -> list:
    """All partitions flagged, with one compile spec set; returns that set."""
    flagged = {
        (method, i): _is_flagged(specs)
        for method, per_method in compile_specs.items()
        for i, specs in enumerate(per_method)
    }
    if not all(flagged.values()):
        plain = sorted({method for (method, _), on in flagged.items() if not on})
        multi = sorted({method for (method, _), on in flagged.items() if on})
        raise ValueError(
            f"Core AI multifunction is set for methods {multi} but not for {plain}: "
            "one bundle serves all methods, so give every method the same "
            "CoreAIPartitioner(multifunction=True)"
        )
    (first_key, reference), *_ = [((m, i), specs) for m, per in compile_specs.items() for i, specs in enumerate(per)]
    for method, per_method in compile_specs.items():
        for i, specs in enumerate(per_method):
            if _spec_items(specs) != _spec_items(reference):
                raise ValueError(
                    f"Core AI multifunction: partition {function_name(method, i)} has compile specs "
                    f"{_spec_items(specs)}, partition {function_name(*first_key)} has "
                    f"{_spec_items(reference)}; one bundle takes one set of compile specs"
                )
    from executorch.backends.apple.coreai.compiler.preprocess import COMPILE_SPEC_KEYS

    if any(spec.key == COMPILE_SPEC_KEYS.INPUT_ENUMERATIONS.value for spec in reference):
        raise ValueError("Core AI multifunction cannot be combined with input enumerations")
    return [spec for spec in reference if spec.key != MULTIFUNCTION_KEY]


def preprocess_multifunction(edge_programs: dict, compile_specs: dict) -> dict:
    """Convert every partition of every method into one bundle; one manifest per delegate."""
    from coreai_torch import TorchConverter
    from executorch.backends.apple.coreai.compiler import preprocess as stock
    from executorch.backends.apple.coreai.compiler.io_compat import assert_io_compatible
    from executorch.exir.backend.backend_details import PreprocessResult

    specs = _check_uniform(compile_specs)
    aot = stock._get_compile_spec(specs, stock.COMPILE_SPEC_KEYS.AOT_COMPILE_CONFIG) is not None
    sidecar_dir = None
    if stock._get_compile_spec(specs, stock.COMPILE_SPEC_KEYS.USES_SIDECAR) is not None:
        sidecar_dir = os.environ.get(stock.SIDECAR_DIR_ENV)
        if not sidecar_dir:
            raise ValueError(f"sidecar asset delivery requires {stock.SIDECAR_DIR_ENV} (set it via coreai_sidecar_dir)")

    converter = TorchConverter()
    functions = {}
    for method, programs in edge_programs.items():
        for index, edge_program in enumerate(programs):
            name = function_name(method, index)
            converter.add_exported_program(stock._prepare_program_for_conversion(edge_program), entrypoint_name=name)
            functions[(method, index)] = name
    program = converter.to_coreai()
    for (method, index), name in functions.items():
        assert_io_compatible(_OneFunction(program, name), edge_programs[method][index])

    with TemporaryDirectory() as tmp:
        if aot:
            opts = stock._aot_compile_options(specs)
            model_hash, staging = stock._compile_aot(program, opts, Path(tmp))
            packaging = (
                stock.AssetPackaging.AOT_COMPILED_SIDECAR if sidecar_dir else stock.AssetPackaging.AOT_COMPILED_INLINE
            )
            extra = {
                "platform": opts["platform"],
                "min_deployment_version": opts["min_deployment_version"],
                "archs": {
                    arch: f"{model_hash}/{bundle.name}" for arch, bundle in stock._compiled_arch_bundles(staging)
                },
            }
        else:
            min_os = stock._min_os_version(specs)
            staging = Path(tmp)
            model_hash = stock._save_and_hash(program, staging / "model.aimodel", min_os)
            packaging = stock.AssetPackaging.SIDECAR if sidecar_dir else stock.AssetPackaging.INLINE
            extra = {"path": f"{model_hash}/model.aimodel", "min_deployment_version": stock._os_version_text(min_os)}
        shipped = stock._deliver(staging, model_hash, packaging, extra, sidecar_dir)

    manifest = json.loads(shipped.processed_bytes.decode("utf-8"))
    results = {}
    for method, programs in edge_programs.items():
        results[method] = []
        for index in range(len(programs)):
            name = functions[(method, index)]
            inputs, outputs = _io_names(program, name)
            binding = {**manifest, "function": name, "input_names": inputs, "output_names": outputs}
            # Every delegate carries the same store output: identical keys and
            # bytes merge into one entry, and each delegate stays self-contained.
            results[method].append(
                PreprocessResult(
                    processed_bytes=json.dumps(binding).encode("utf-8"), data_store_output=shipped.data_store_output
                )
            )
    return results


def multifunction_installed() -> bool:
    return "original" in _installed


@contextlib.contextmanager
def install_multifunction() -> Iterator[None]:
    """Route ``CoreAIBackend.preprocess_multimethod`` through the multifunction
    path for flagged partitions; restores the class exactly on exit."""
    from executorch.backends.apple.coreai import CoreAIBackend

    with _install_lock:
        if multifunction_installed():
            raise RuntimeError(
                "Core AI multifunction is already installed; nested or concurrent "
                "install_multifunction() would restore the wrong method"
            )
        own = CoreAIBackend.__dict__.get("preprocess_multimethod")
        original = CoreAIBackend.preprocess_multimethod

        def preprocess_multimethod(cls, edge_programs, compile_specs):
            if any(_is_flagged(specs) for per_method in compile_specs.values() for specs in per_method):
                return preprocess_multifunction(edge_programs, compile_specs)
            return original(edge_programs, compile_specs)

        CoreAIBackend.preprocess_multimethod = classmethod(preprocess_multimethod)
        _installed["original"] = own
    try:
        yield
    finally:
        with _install_lock:
            own = _installed.pop("original")
            if own is None:
                del CoreAIBackend.preprocess_multimethod
            else:
                CoreAIBackend.preprocess_multimethod = own


def upstream_has_multifunction() -> bool:
    """Whether the installed ExecuTorch's CoreAIPartitioner takes ``multifunction`` itself."""
    import inspect

    try:
        from executorch.backends.apple.coreai import CoreAIPartitioner
    except ImportError:
        return False
    return "multifunction" in inspect.signature(CoreAIPartitioner.__init__).parameters


def _partitioners() -> list:
    if upstream_has_multifunction():
        from executorch.backends.apple.coreai import CoreAIPartitioner

        return [CoreAIPartitioner(multifunction=True)]
    return [CoreAIMultifunctionPartitioner(multifunction=True)]


def _context():
    return contextlib.nullcontext() if upstream_has_multifunction() else install_multifunction()


def _transform_passes() -> list:
    from executorch.backends.apple.coreai import get_default_passes

    return get_default_passes()


def _compile_config():
    from executorch.backends.apple.coreai import get_default_compile_config

    return get_default_compile_config()


# Standalone repro scripts have no context hook: partitioners() installs the
# add-on for the rest of the (short-lived) script.
MULTIFUNCTION_RECIPE = (
    """
_hook = []


def partitioners():
    from etprop.candidates.coreai_multifunction import (
        CoreAIMultifunctionPartitioner, install_multifunction, upstream_has_multifunction)

    if upstream_has_multifunction():
        from executorch.backends.apple.coreai import CoreAIPartitioner

        return [CoreAIPartitioner(multifunction=True)]
    if not _hook:
        _hook.append(install_multifunction())
        _hook[0].__enter__()
    return [CoreAIMultifunctionPartitioner(multifunction=True)]

"""
    + COREAI_RECIPE_TAIL
)


COREAI_MULTIFUNCTION = register(
    Flow(
        name="coreai+multifunction",
        description="Core AI with all methods' delegates as functions of one shared bundle "
        "(CoreAIPartitioner(multifunction=True))",
        partitioners=_partitioners,
        transform_passes=_transform_passes,
        compile_config=_compile_config,
        context=_context,
        runtime="coreai",
        repro_recipe=MULTIFUNCTION_RECIPE,
        requires=("coreai_torch", "coreai.runtime"),
        install_hint="pip install 'etprop[coreai]'",
        baseline="coreai",
        # One bundle, one hash; within it MLIR uniques shared constants, but a
        # weight a delegate copies or casts may still appear twice.
        promises=Promises(shared_cache=True, weights_stored_once=False),
    )
)
