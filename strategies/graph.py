"""Draw-time bookkeeping: the values a program has so far and their shapes.

Strategies add nodes through :class:`GraphDraft`, which infers each new value's
shape by evaluating the node's rendered expression on meta tensors. The
expression evaluated is the very one the builder emits, so a shape the
strategies believe in is the shape the program will have.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from hypothesis import event
from hypothesis import strategies as st
from torch import nn

from etprop.program import vocabulary

MAX_NUMEL = 4096

# A value's dtype: "" is the program's float dtype; integer and bool values
# (ids, indices, comparisons) carry theirs (spec format etprop-spec/3).
FLOAT = ""
INTEGER_DTYPES = {"int64": torch.int64, "int32": torch.int32, "bool": torch.bool}


@dataclass
class Value:
    name: str
    shape: tuple[int, ...]
    dtype: str = FLOAT
    # An integer value's exclusive upper bound (its values lie in [0, high)):
    # what may index a dim of that size or a table of that many rows.
    high: int = 0

    @property
    def is_float(self) -> bool:
        return self.dtype == FLOAT

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class _MetaSelf(SimpleNamespace):
    """Stand-in for ``self`` in rendered expressions, with meta-device state."""


def _meta_state(entry: dict):
    kind = entry["kind"]
    if kind == "layer":
        return getattr(nn, entry["type"])(**entry["kwargs"], device="meta")
    if kind == "weight":
        return SimpleNamespace(weight=torch.empty(entry["shape"], device="meta"))
    return torch.empty(entry["shape"], device="meta")


def _meta(value: Value) -> torch.Tensor:
    return torch.empty(value.shape, device="meta", dtype=INTEGER_DTYPES.get(value.dtype, torch.float32))


def dtype_name(dtype: torch.dtype) -> str:
    """A tensor dtype as a Value's: "" for any float dtype."""
    return FLOAT if dtype.is_floating_point else str(dtype).removeprefix("torch.")


@dataclass
class ProgramDraft:
    """State shared by all methods and bodies of one program being drawn."""

    state: dict = field(default_factory=dict)
    counter: itertools.count = field(default_factory=itertools.count)
    meta_self: _MetaSelf = field(default_factory=_MetaSelf)
    seeds: itertools.count = field(default_factory=lambda: itertools.count(1))
    # Draw every GEMM weight as a computed one (the computed-weights family).
    computed_weights: bool = False
    # The program's float dtype (spec "dtype"); drawers avoid what torch's
    # CPU kernels lack for half types.
    dtype: str = "float32"
    # One node in ``twin_odds`` that reads a parameter gets a twin (ops.add_twin);
    # 0: none, and no draw is spent on it.
    twin_odds: int = 0

    def reads_parameters(self, node: dict) -> bool:
        """Whether ``node`` reads state it never writes (a weight, a layer, a
        parameter, buffer or constant operand): what a twin copies."""
        entry = self.state.get(node.get("state"))
        return (
            bool(entry)
            and entry["kind"] in ("weight", "layer", "parameter", "buffer", "constant")
            and not entry.get("mutable")
        )

    def fresh(self, prefix: str) -> str:
        return f"{prefix}{next(self.counter)}"

    def add_state(self, prefix: str, entry: dict) -> str:
        name = self.fresh(prefix)
        entry.setdefault("seed", next(self.seeds))
        self.state[name] = entry
        setattr(self.meta_self, name, _meta_state(entry))
        return name


class GraphDraft:
    """One method body (or control-flow body) being drawn."""

    def __init__(self, program: ProgramDraft, inputs: list[Value], takes_new_inputs: bool = False):
        self.program = program
        self.values: list[Value] = list(inputs)
        self.inputs = list(inputs)
        self.nodes: list[dict] = []
        self.consumed: set[str] = set()
        # A method may gain inputs while drawn (token ids, indices, masks); a
        # control-flow body's parameters are fixed by its node.
        self.takes_new_inputs = takes_new_inputs

    def pick(
        self, draw, accept: Callable[[Value], bool] = lambda v: True, dtypes: tuple[str, ...] = (FLOAT,)
    ) -> Optional[Value]:
        """A value of one of ``dtypes`` (float by default) accepted by
        ``accept``, preferring recent ones (chains); shrinks toward the most
        recent."""
        candidates = [v for v in self.values if v.dtype in dtypes and accept(v)]
        if not candidates:
            return None
        return candidates[-1 - draw(st.integers(0, len(candidates) - 1))]

    def new_input(self, shape: tuple[int, ...], dtype: str, high: int = 0) -> Optional[Value]:
        """A new method input of ``dtype`` (an integer one in [0, high)), or
        None where the graph cannot take one (a control-flow body)."""
        if not self.takes_new_inputs:
            return None
        value = Value(self.program.fresh("x"), tuple(shape), dtype, high if dtype != "bool" else 2)
        self.inputs.append(value)
        self.values.append(value)
        event(f"input: {dtype or 'float'}")
        return value

    def infer(self, node: dict, args: list[Value]) -> Optional[tuple[int, ...]]:
        out = self.evaluate(node, args)
        return None if out is None else tuple(out.shape)

    def evaluate(self, node: dict, args: list[Value]) -> Optional[torch.Tensor]:
        """The node's result on meta tensors (its shape and dtype), or None
        where the expression rejects its operands."""
        env = {"torch": torch, "F": F, "self": self.program.meta_self}
        env.update({v.name: _meta(v) for v in args})
        if node["op"] == "addmm" and "beta" in node.get("attrs", {}):
            # Meta and fake addmm skip the bias's broadcast check when beta is
            # 0, which eager makes: shapes are checked at beta's default.
            node = {**node, "attrs": {k: v for k, v in node["attrs"].items() if k != "beta"}}
        try:
            out = eval(vocabulary.render(node, [v.name for v in args]), env)
        except Exception as exc:  # a strategy drew an invalid combination
            event(f"strategy rejected {node['op']}: {type(exc).__name__}")
            return None
        return out

    def add(
        self,
        op: str,
        args: list[Value],
        attrs: Optional[dict] = None,
        state: Optional[str] = None,
        high: int = 0,
    ) -> Optional[Value]:
        """The node, if its result type-checks and fits; ``high``: the bound
        of an integer result's values."""
        node = {"id": self.program.fresh("v"), "op": op, "args": [v.name for v in args]}
        if attrs:
            node["attrs"] = attrs
        if state:
            node["state"] = state
        out = self.evaluate(node, args)
        if out is None:
            return None
        shape = tuple(out.shape)
        if not all(shape) or _numel(shape) > MAX_NUMEL:
            return None
        dtype = dtype_name(out.dtype)
        return self.add_node(node, args, shape, dtype, high if dtype != "bool" else 2)

    def add_node(
        self, node: dict, args: list[Value], shape: tuple[int, ...], dtype: str = FLOAT, high: int = 0
    ) -> Value:
        self.nodes.append(node)
        self.consumed.update(v.name for v in args)
        value = Value(node["id"], shape, dtype, high)
        self.values.append(value)
        event(f"op: {node['op']}")
        return value

    def leaves(self) -> list[str]:
        """Values nobody consumed: the outputs, so no drawn node is dead code."""
        input_names = {v.name for v in self.inputs}
        return [v.name for v in self.values if v.name not in self.consumed and v.name not in input_names]


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
