"""The one builder: a spec becomes Python source, the source becomes an nn.Module.

Generating source (instead of assembling closures) gives three things from one
mechanism: the module etprop lowers, the standalone repro script (the same
source, plus lowering code), and readable counterexamples.
"""

from __future__ import annotations

import collections
import copy
import linecache
import sys
import types
from dataclasses import dataclass, field
from typing import Optional

import torch

from etprop.program import vocabulary
from etprop.program import spec as specmod

# Helpers every generated program may use. They are part of the generated
# source so that a repro script needs nothing but torch.
PRELUDE = '''\
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils import parametrizations
from torch._higher_order_ops.map import map as hop_map
from torch._higher_order_ops.scan import scan as hop_scan
from torch._higher_order_ops.while_loop import while_loop as hop_while_loop

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _randn(shape, seed, scale=1.0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator) * scale


def _reinit(module, seed):
    """Seeded values for every parameter and buffer, independent of global RNG."""
    generator = torch.Generator().manual_seed(seed)
    is_norm = isinstance(module, (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d))
    with torch.no_grad():
        weight = getattr(module, "weight", None)
        fan_in = weight[0].numel() if weight is not None and weight.dim() > 1 else 1
        for name, tensor in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            if name == "num_batches_tracked":
                continue
            noise = torch.randn(tensor.shape, generator=generator)
            if name == "running_var":
                tensor.copy_(0.5 + noise.abs())
            elif is_norm and name == "weight":
                tensor.copy_(1.0 + 0.1 * noise)
            elif is_norm:
                tensor.copy_(0.1 * noise)
            else:
                tensor.copy_(noise / fan_in ** 0.5)


class _Weight(nn.Module):
    """Holds one parameter, so parametrizations can compute it."""

    def __init__(self, shape, seed, scale):
        super().__init__()
        self.weight = nn.Parameter(_randn(shape, seed, scale))


class _Scale(nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def forward(self, value):
        return value * self.factor


class _AddDelta(nn.Module):
    """Sum of two parameters."""

    def __init__(self, shape, seed):
        super().__init__()
        self.delta = nn.Parameter(_randn(shape, seed, 0.05))

    def forward(self, value):
        return value + self.delta


class _BufferScale(nn.Module):
    """A buffer as one source of the computed weight."""

    def __init__(self, shape, seed):
        super().__init__()
        self.register_buffer("gain", 0.5 + _randn(shape, seed).abs())

    def forward(self, value):
        return value * self.gain


class _LowRank(nn.Module):
    """weight = A @ B, stored as the two factors (a low-rank product)."""

    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def forward(self, left, right):
        return left @ right

    def right_inverse(self, value):
        u, s, vh = torch.linalg.svd(value, full_matrices=False)
        return u[:, : self.rank] * s[: self.rank], vh[: self.rank].contiguous()


class _Transpose(nn.Module):
    def forward(self, value):
        return value.t()

    def right_inverse(self, value):
        return value.t().contiguous()


class _Reshape(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.shape = tuple(shape)

    def forward(self, value):
        return value.reshape(self.shape)

    def right_inverse(self, value):
        return value.reshape(-1)


def _parametrize(module, name, kind, **attrs):
    shape = tuple(getattr(module, name).shape)
    if kind == "weight_norm":
        parametrizations.weight_norm(module, name, dim=attrs.get("dim", 0))
    elif kind == "spectral_norm":
        # spectral_norm draws its power-iteration vectors from the global RNG.
        with torch.random.fork_rng():
            torch.manual_seed(attrs.get("n_power_iterations", 1))
            parametrizations.spectral_norm(module, name, n_power_iterations=attrs.get("n_power_iterations", 1),
                                           dim=attrs.get("dim"))
    elif kind == "scale":
        parametrize.register_parametrization(module, name, _Scale(attrs["factor"]))
    elif kind == "add_delta":
        parametrize.register_parametrization(module, name, _AddDelta(shape, attrs["seed"]))
    elif kind == "buffer_scale":
        parametrize.register_parametrization(module, name, _BufferScale(shape, attrs["seed"]))
    elif kind == "low_rank":
        parametrize.register_parametrization(module, name, _LowRank(attrs["rank"]), unsafe=True)
    elif kind == "transpose":
        parametrize.register_parametrization(module, name, _Transpose(), unsafe=True)
    elif kind == "reshape":
        parametrize.register_parametrization(module, name, _Reshape(shape), unsafe=True)
    else:
        raise ValueError(f"unknown parametrization {kind!r}")




def make_input(shape, dtype, kind, seed):
    """Deterministic test inputs: random normal plus edge values."""
    generator = torch.Generator().manual_seed(seed)
    value = torch.randn(shape, generator=generator)
    if kind == "negative":
        value = -3.0 * value.abs()
    elif kind == "zeros":
        value = torch.zeros(shape)
    elif kind == "large":
        value = 1e3 * value
    elif kind == "small":
        value = 1e-3 * value
    return value.to(DTYPES[dtype])
'''


# Appended to the prelude of the jittered variant only (see ``render_source``):
# eager stand-ins for the control-flow operators, which in eager compile their
# bodies with dynamo (and could not run ``_jitter``'s random draws), and the
# jitter every node's value goes through.
JITTER_PRELUDE = '''

_JITTER = {"mode": None, "generator": None}


def _jitter(value):
    """``value`` times (1 + u*eps) in its own dtype: u is +1 ("up"), -1
    ("down") or drawn from {-1, 0, 1} per element ("random")."""
    mode = _JITTER["mode"]
    if mode is None or not isinstance(value, torch.Tensor) or not value.is_floating_point():
        return value
    if mode == "random":
        u = torch.randint(-1, 2, value.shape, generator=_JITTER["generator"]).double()
    else:
        u = 1.0 if mode == "up" else -1.0
    return (value.double() * (1 + u * torch.finfo(value.dtype).eps)).to(value.dtype)


def _eager_cond(pred, true_fn, false_fn, operands):
    return (true_fn if bool(pred) else false_fn)(*operands)


def hop_map(body, xs, *args):
    results = [body(x, *args) for x in xs.unbind(0)]
    return tuple(torch.stack(parts) for parts in zip(*results))


def hop_scan(combine, init, xs):
    carry, ys = init, []
    for x in xs.unbind(0):
        carry, y = combine(carry, x)
        ys.append(y)
    return carry, torch.stack(ys)


def hop_while_loop(cond, body, carried):
    while cond(*carried):
        carried = body(*carried)
    return carried


# Both directions for every value, then two patterns of random signs.
JITTER_RUNS = (("up", 0), ("down", 0), ("random", 1), ("random", 2))


def _jittered_runs(module, state, method, inputs):
    """The outputs of ``method`` once per jitter run, each starting from
    ``state`` (a state dict) and ``inputs`` jittered too."""
    runs = []
    for mode, seed in JITTER_RUNS:
        _JITTER.update(mode=mode, generator=torch.Generator().manual_seed(seed))
        try:
            with torch.no_grad():
                module.load_state_dict({key: _jitter(value) for key, value in state.items()})
                runs.append([t.clone() for t in getattr(module, method)(*(_jitter(x) for x in inputs))])
        finally:
            _JITTER.update(mode=None, generator=None)
    return runs
'''


# Input kinds make_input understands; the equivalence oracle runs each of these.
INPUT_KINDS_DEFAULT = ("normal", "negative", "zeros", "large", "small")


def _dtype_expr(dtype: str) -> str:
    return f"DTYPES[{dtype!r}]"


def _state_lines(name: str, entry: dict, program_dtype: str = "float32") -> list[str]:
    kind = entry["kind"]
    lines: list[str] = []
    # The program dtype reaches parameters and buffers through one final
    # ``self.to``; a plain tensor attribute (a constant) must be cast here.
    dtype = entry.get("dtype", program_dtype if kind == "constant" else "float32")
    if kind == "layer":
        kwargs = ", ".join(f"{k}={v!r}" for k, v in entry["kwargs"].items())
        lines.append(f"self.{name} = nn.{entry['type']}({kwargs})")
        lines.append(f"_reinit(self.{name}, {entry['seed']!r})")
        if dtype != "float32":
            lines.append(f"self.{name}.to({_dtype_expr(dtype)})")
    elif kind == "weight":
        lines.append(f"self.{name} = _Weight({tuple(entry['shape'])!r}, {entry['seed']!r}, "
                     f"{entry.get('scale', 1.0)!r})")
        if dtype != "float32":
            lines.append(f"self.{name}.to({_dtype_expr(dtype)})")
    else:
        value = f"_randn({tuple(entry['shape'])!r}, {entry['seed']!r}, {entry.get('scale', 1.0)!r})"
        if dtype != "float32":
            value += f".to({_dtype_expr(dtype)})"
        if kind == "parameter":
            lines.append(f"self.{name} = nn.Parameter({value})")
        elif kind == "buffer":
            lines.append(f"self.register_buffer({name!r}, {value})")
        else:
            lines.append(f"self.{name} = {value}")
    for p in entry.get("parametrizations", []):
        attrs = {k: v for k, v in p.items() if k not in ("type", "on")}
        extra = "".join(f", {k}={v!r}" for k, v in attrs.items())
        lines.append(f"_parametrize(self.{name}, {p.get('on', 'weight')!r}, {p['type']!r}{extra})")
    return lines


def _body_lines(nodes: list[dict], indent: str, jitter: bool = False) -> list[str]:
    lines: list[str] = []
    for node in nodes:
        if node["op"] in vocabulary.CONTROL_FLOW_OPS:
            lines += _control_flow_lines(node, indent, jitter)
        else:
            expression = vocabulary.render(node, node.get("args", []))
            if jitter:
                expression = f"_jitter({expression})"
            lines.append(f"{indent}{node['id']} = {expression}")
    return lines


def _function_lines(fn_name: str, params: list[str], body: dict, indent: str,
                    returns: Optional[str] = None, jitter: bool = False) -> list[str]:
    lines = [f"{indent}def {fn_name}({', '.join(params)}):"]
    lines += _body_lines(body["nodes"], indent + "    ", jitter)
    result = returns or ", ".join(body["outputs"]) + ","
    lines.append(f"{indent}    return ({result})")
    return lines


def _control_flow_lines(node: dict, indent: str, jitter: bool = False) -> list[str]:
    op, nid, args, attrs = node["op"], node["id"], node["args"], node.get("attrs", {})
    bodies = node["bodies"]
    lines: list[str] = []
    if op == "cond":
        for index, body in enumerate(bodies):
            lines += _function_lines(f"_{nid}_branch{index}", body["params"], body, indent, jitter=jitter)
        pred = f"{args[0]}.mean() > {attrs.get('threshold', 0.0)!r}"
        operands = ", ".join(args[1:]) + ","
        cond = "_eager_cond" if jitter else "torch.cond"
        lines.append(f"{indent}{nid} = {cond}({pred}, _{nid}_branch0, _{nid}_branch1, ({operands}))[0]")
    elif op == "map":
        lines += _function_lines(f"_{nid}_body", bodies[0]["params"], bodies[0], indent, jitter=jitter)
        lines.append(f"{indent}{nid} = hop_map(_{nid}_body, {', '.join(args)})[0]")
    elif op == "scan":
        body = bodies[0]
        carry, xs = body["params"][:2]
        lines += _function_lines(f"_{nid}_combine", body["params"], body, indent,
                                 returns=f"{body['outputs'][0]}, {body['outputs'][-1]}.clone()", jitter=jitter)
        lines.append(f"{indent}{nid} = hop_scan(_{nid}_combine, {args[0]}, "
                     f"{args[1]})[{attrs.get('select', 1)!r}]")
    elif op == "while_loop":
        body = bodies[0]
        (param,) = body["params"]
        lines.append(f"{indent}def _{nid}_cond(step, {param}):")
        lines.append(f"{indent}    return step < {attrs['iterations']!r}")
        lines.append(f"{indent}def _{nid}_body(step, {param}):")
        lines += _body_lines(body["nodes"], indent + "    ", jitter)
        lines.append(f"{indent}    return (step + 1, {body['outputs'][0]}.clone())")
        lines.append(f"{indent}{nid} = hop_while_loop(_{nid}_cond, "
                     f"_{nid}_body, (torch.zeros((), dtype=torch.int64), {args[0]}))[1]")
    return lines


def render_source(spec: dict, jitter: bool = False) -> str:
    """The program's Python source: prelude, one Program class, its inputs.

    ``jitter`` renders the variant the equivalence oracle measures sensitivity
    with: the same program and weights, every node's value passed through
    ``_jitter`` and control flow run as plain Python. What is exported and
    what a repro shows is always the plain rendering."""
    lines = [PRELUDE + (JITTER_PRELUDE if jitter else ""), "", "class Program(nn.Module):",
             "    def __init__(self):", "        super().__init__()"]
    program_dtype = spec.get("dtype", "float32")
    for name, entry in spec["state"].items():
        lines += ["        " + line for line in _state_lines(name, entry, program_dtype)]
    if program_dtype != "float32":
        # Parametrization helpers hold their own tensors (deltas, scales).
        lines.append(f"        self.to({_dtype_expr(program_dtype)})")
    for method, body in spec["methods"].items():
        params = ["self"] + [inp["name"] for inp in body["inputs"]]
        lines.append("")
        lines += _function_lines(method, params, body, "    ", jitter=jitter)
    lines += ["", "", "INPUTS = " + repr({m: body["inputs"] for m, body in spec["methods"].items()}), ""]
    return "\n".join(lines)


@dataclass
class Reference:
    """What one call of a method gives eagerly: the outputs to compare with
    (``expected``), a float64 run (``wide``) and the outputs of each jittered
    run (``jittered``), in which every input, parameter, buffer and node value
    was moved by about one unit in the last place."""

    expected: list
    wide: list
    jittered: list = field(default_factory=list)


@dataclass
class BuiltProgram:
    spec: dict
    source: str
    module: torch.nn.Module
    namespace: dict = field(repr=False)
    _double: Optional[torch.nn.Module] = field(default=None, repr=False)
    _initial: Optional[dict] = field(default=None, repr=False)
    _initial_double: Optional[dict] = field(default=None, repr=False)
    _jittered: Optional[tuple] = field(default=None, repr=False)

    def __post_init__(self):
        self._initial = {k: v.clone() for k, v in self.module.state_dict().items()}

    @property
    def methods(self) -> list[str]:
        return list(self.spec["methods"])

    def inputs(self, method: str, kind: str = "normal", seed: int = 0, extent: str = "") -> tuple:
        """Inputs of ``kind``; ``extent`` "min"/"max" puts every dynamic dim
        at its bound instead of the spec's example size."""
        make = self.namespace["make_input"]
        return tuple(make(self._shape(inp, extent), inp.get("dtype", "float32"), kind, seed * 7919 + index)
                     for index, inp in enumerate(self.spec["methods"][method]["inputs"]))

    @staticmethod
    def _shape(inp: dict, extent: str) -> tuple:
        shape = list(inp["shape"])
        for dim, low, high in inp.get("dynamic", []) if extent else ():
            shape[dim] = low if extent == "min" else high
        return tuple(shape)

    def input_cases(self, method: str, kinds=None):
        """(label, inputs) for every input kind at the spec's shapes, plus
        normal inputs at the smallest and largest dynamic sizes."""
        for kind in kinds or INPUT_KINDS_DEFAULT:
            yield kind, self.inputs(method, kind)
        if any(inp.get("dynamic") for inp in self.spec["methods"][method]["inputs"]):
            for extent in ("min", "max"):
                yield f"normal at the {extent} dynamic sizes", self.inputs(method, "normal", extent=extent)

    def method_module(self, method: str) -> torch.nn.Module:
        """A module whose forward is ``method``; parameters keep their names, so
        methods exported separately still share weights by name."""
        return _MethodView(self.module, method)

    def dynamic_shapes(self, method: str):
        inputs = self.spec["methods"][method]["inputs"]
        if not any(inp.get("dynamic") for inp in inputs):
            return None
        specs = []
        for inp in inputs:
            dims = {}
            for dim, low, high in inp.get("dynamic", []):
                dims[dim] = torch.export.Dim(f"{inp['name']}_d{dim}", min=low, max=high)
            specs.append(dims or None)
        # method_module's forward takes ``*args``: one parameter holding the tuple.
        return (tuple(specs),)

    @property
    def stateful(self) -> bool:
        """Whether a method mutates a buffer (its outputs depend on earlier calls)."""
        return any(e["kind"] == "buffer" and e.get("mutable") for e in self.spec["state"].values())

    def reset_state(self) -> None:
        """Back to the initial buffer values, in the float32 and float64 copies."""
        for module, saved in ((self.module, self._initial), (self._double, self._initial_double)):
            if module is not None and saved is not None:
                module.load_state_dict(saved)

    def reference(self, method: str, inputs: tuple, restore: bool = True) -> Reference:
        """Eager outputs with what the equivalence oracle bounds them by: a
        float64 run (rounding error) and jittered runs (how far one ulp of
        rounding anywhere moves each output: conditioning, and jumps of
        rounding ops and branches). ``restore`` as for ``eager``; the float64
        copy keeps its own sequence, the jittered runs start each call from
        the state eager started from."""
        state = self.module.state_dict()
        state = {k: v.clone() for k, v in state.items()}
        expected = self.eager(method, inputs, restore)
        if self._jittered is None:
            namespace: dict = {}
            exec(compile(render_source(self.spec, jitter=True), "<etprop jittered program>", "exec"), namespace)
            self._jittered = (namespace["Program"]().eval(), namespace["_jittered_runs"])
        module, runs = self._jittered
        return Reference(expected, self._wide(method, inputs, restore), runs(module, state, method, inputs))

    def _wide(self, method: str, inputs: tuple, restore: bool) -> list:
        if self._double is None:
            self._double = copy.deepcopy(self.module).double()
            self._initial_double = {k: v.clone() for k, v in self._double.state_dict().items()}
        wide = tuple(x.double() if x.is_floating_point() else x for x in inputs)
        try:
            with torch.no_grad():
                return [t.clone() for t in getattr(self._double, method)(*wide)]
        finally:
            if restore:
                self._double.load_state_dict(self._initial_double)

    def eager(self, method: str, inputs: tuple, restore: bool = True) -> list[torch.Tensor]:
        """Eager reference outputs. Mutated buffers go back to their initial
        values afterwards unless ``restore`` is False (a sequence of calls)."""
        try:
            with torch.no_grad():
                return [t.clone() for t in getattr(self.module, method)(*inputs)]
        finally:
            if restore:
                self.module.load_state_dict(self._initial)


class _MethodView(torch.nn.Module):
    def __init__(self, program: torch.nn.Module, method: str):
        super().__init__()
        self.program = program
        self.method = method

    def forward(self, *args):
        return getattr(self.program, self.method)(*args)


_REGISTERED: collections.deque = collections.deque()


def build(spec: dict, validate: bool = True) -> BuiltProgram:
    """Spec → module (in eval mode) with its generated source."""
    if validate:
        specmod.validate(spec)
    source = render_source(spec)
    filename = f"<etprop program {specmod.digest(spec)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    # A real module in sys.modules: dynamo re-imports the module of functions it
    # traces (control-flow bodies). Only the most recent programs stay registered.
    module_name = f"etprop_program_{specmod.digest(spec)}"
    program_module = types.ModuleType(module_name)
    namespace = program_module.__dict__
    sys.modules[module_name] = program_module
    _REGISTERED.append(module_name)
    while len(_REGISTERED) > 32:
        sys.modules.pop(_REGISTERED.popleft(), None)
    exec(compile(source, filename, "exec"), namespace)
    module = namespace["Program"]().eval()
    return BuiltProgram(spec=spec, source=source, module=module, namespace=namespace)
