"""One module of the system under test replaced by a file of ours, in every
process of an environment, without touching the installed package.

Mutation analysis of ExecuTorch's lowering code (etprop/commands/sut_mutants.py)
runs each mutant in a layered environment (etprop/commands/environments.py)
whose ``sitecustomize`` calls ``install_from_environment``: when
``ETPROP_SHADOW`` is ``package.module=/path/to/file.py``, that module is
loaded from the file instead of the package, in the interpreter and in every
process it starts (the isolated workers included); unset, nothing changes.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

ENV = "ETPROP_SHADOW"

# The sitecustomize.py a layered environment for mutants gets (a file etprop writes, not a script it runs).
SITECUSTOMIZE = "from etprop.lowering.shadow import install_from_environment\ninstall_from_environment()\n"


class _Shadow(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, path: str):
        self.name, self.path = name, path

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        return importlib.util.spec_from_file_location(fullname, self.path)


def install(name: str, path: str) -> None:
    """Load module ``name`` from ``path`` from now on in this process."""
    if not any(isinstance(finder, _Shadow) and finder.name == name for finder in sys.meta_path):
        sys.meta_path.insert(0, _Shadow(name, path))


def install_from_environment() -> None:
    value = os.environ.get(ENV, "")
    if "=" in value:
        name, path = value.split("=", 1)
        install(name, path)
