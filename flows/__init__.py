"""The flow registry: every lowering recipe etprop knows, by name.

Every flow registers through an ``etprop.flows`` entry point: etprop's own
(stock flows and candidates, declared in its pyproject.toml) exactly like an
outside package's. A backend engineer can also pass
``etprop --flow-module path/to/my_flow.py`` (a file or a module that calls
:func:`register`).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
from pathlib import Path

from etprop.errors import UsageError
from etprop.flows.base import Flow, Promises

_REGISTRY: dict[str, Flow] = {}
_loaded = False


def register(flow: Flow) -> Flow:
    """Add a flow; a second flow under the same name is a mistake, not an override."""
    existing = _REGISTRY.get(flow.name)
    if existing is not None and existing is not flow:
        raise UsageError(f"flow '{flow.name}' is already registered; pick another name")
    _REGISTRY[flow.name] = flow
    return flow


def _load_entry_points() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    # Name order, whichever order the distributions are found in.
    for entry in sorted(importlib.metadata.entry_points(group="etprop.flows"), key=lambda e: e.name):
        entry.load()


def load_flow_module(target: str) -> None:
    """Import a user's flow definitions from a .py file path or a module name."""
    path = Path(target)
    if target.endswith(".py"):
        if not path.is_file():
            raise UsageError(f"flow module file '{target}' does not exist")
        name = f"etprop_user_flows_{abs(hash(str(path.resolve())))}"
        if name in sys.modules:
            return
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return
    try:
        importlib.import_module(target)
    except ModuleNotFoundError as exc:
        raise UsageError(
            f"cannot import flow module '{target}' ({exc}); pass a .py path or an importable module"
        ) from None


def all_flows() -> list[Flow]:
    _load_entry_points()
    return list(_REGISTRY.values())


def get(name: str) -> Flow:
    _load_entry_points()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "(none)"
        raise UsageError(
            f"unknown flow '{name}'; known flows: {known}. Register your own with --flow-module FILE.py"
        ) from None


def get_available(name: str) -> Flow:
    """The flow, or a UsageError naming what to install."""
    flow = get(name)
    reason = flow.unavailable_reason()
    if reason:
        raise UsageError(f"flow '{name}' is unavailable here: {reason}")
    return flow


def available_flows() -> list[Flow]:
    return [f for f in all_flows() if f.available]


__all__ = ["Flow", "Promises", "register", "get", "get_available", "all_flows", "available_flows", "load_flow_module"]
