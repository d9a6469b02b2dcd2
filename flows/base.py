"""What a flow is: a named lowering recipe, plus what it promises the oracles.

A flow says how to lower (partitioners, edge transform passes, compile config,
an optional context that installs a candidate change for the duration of the
lowering) and how to run the result (the ExecuTorch runtime, or the Core AI
interpreter for programs whose delegates the ExecuTorch runtime cannot run).
It also states its promises, so each oracle checks exactly what the flow claims
and nothing more.
"""

from __future__ import annotations

import contextlib
import importlib.util
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Optional

NO_PARTITIONER_RECIPE = """
def partitioners():
    return []


def transform_passes():
    return []


def compile_config():
    return None
"""


@dataclass(frozen=True)
class Promises:
    """What a flow guarantees beyond matching eager."""

    # Every distinct weight appears once in the .pte (delegate payloads and
    # named data included).
    weights_stored_once: bool = True
    # Methods sharing weights share one stored payload / one cache key.
    shared_cache: bool = False
    # Op families this flow must delegate (see oracles.coverage): a GEMM with a
    # parameter weight on XNNPACK, for example.
    delegates: frozenset[str] = frozenset()
    # The dtypes those delegation claims hold for (XNNPACK has no bfloat16
    # kernels, so a bfloat16 GEMM on portable is expected there).
    delegate_dtypes: frozenset[str] = frozenset({"float32", "float16"})


@dataclass(frozen=True)
class Flow:
    name: str
    description: str
    partitioners: Callable[[], list] = list
    transform_passes: Callable[[], list] = list
    compile_config: Optional[Callable[[], Any]] = None
    backend_config: Optional[Callable[[], Any]] = None
    # Entered around to_edge_transform_and_lower/to_executorch; candidates
    # install their patches here and restore them on exit.
    context: Callable[[], ContextManager] = contextlib.nullcontext
    # "executorch": run the .pte with executorch.runtime.
    # "coreai": interpret the lowered graph, Core AI delegates on Apple's runtime.
    runtime: str = "executorch"
    # Optional: build the runner for a lowering yourself (a runtime of your own).
    make_runner: Optional[Callable[[Any], Any]] = None
    # Modules that must import for the flow to be available, and how to get them.
    requires: tuple[str, ...] = ()
    install_hint: str = ""
    baseline: Optional[str] = None
    promises: Promises = field(default_factory=Promises)
    # Families of programs the flow is meant for (None: every family).
    families: Optional[tuple[str, ...]] = None
    # Python source defining partitioners(), transform_passes() and
    # compile_config() (and make_runner(pte, edge) for non-ExecuTorch runtimes)
    # for standalone repro scripts; stock flows need only torch and executorch.
    repro_recipe: str = NO_PARTITIONER_RECIPE

    def unavailable_reason(self) -> Optional[str]:
        """None when usable here, else a one-line reason that names the fix."""
        for module in self.requires:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                hint = f"; install it with: {self.install_hint}" if self.install_hint else ""
                return f"python module '{module}' is not installed{hint}"
        return None

    @property
    def available(self) -> bool:
        return self.unavailable_reason() is None
