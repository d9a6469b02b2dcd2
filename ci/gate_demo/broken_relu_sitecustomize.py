"""A deliberately wrong XNNPACK lowering, for the gate's demo and tests: installed
as an environment's sitecustomize, it makes XNNPACK's standalone ``relu`` clamp at
0.5 instead of 0 in every process of that environment. The patch is applied when
ExecuTorch imports its relu visitor, so processes that never lower pay nothing."""

import importlib.abc
import importlib.util
import sys

TARGET = "executorch.backends.xnnpack.operators.op_relu"


def _break(module) -> None:
    from executorch.backends.xnnpack.operators.node_visitor import _node_visitor_dict

    visitor, real = _node_visitor_dict["aten.relu.default"], module.OutputMinMax
    define_node = visitor.define_node

    def clamped_at_half(self, *args, **kwargs):
        module.OutputMinMax = lambda output_min, output_max: real(output_min=0.5, output_max=output_max)
        try:
            return define_node(self, *args, **kwargs)
        finally:
            module.OutputMinMax = real

    visitor.define_node = clamped_at_half


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_break(module):
            exec_module(module)
            _break(module)

        spec.loader.exec_module = exec_and_break
        return spec


sys.meta_path.insert(0, _PatchOnImport())
