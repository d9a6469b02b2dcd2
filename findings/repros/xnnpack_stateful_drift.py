"""Standalone repro made by etprop: flow 'xnnpack'.

Run: python THIS_FILE. Prints the lowered graph and a verdict; exits 1 on mismatch.
"""
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


class Program(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer('m19', _randn((3, 9, 6, 10), 5, 1.0))
        self.n9 = nn.GroupNorm(affine=False, eps=1e-05, num_channels=3, num_groups=1)
        _reinit(self.n9, 3)

    def forward(self, x0):
        v2 = F.hardsigmoid(x0)
        v10 = self.n9(v2)
        v20 = self.m19.mul_(x0)
        return (v10, v20,)


INPUTS = {'forward': [{'dtype': 'float32', 'name': 'x0', 'shape': [3, 9, 6, 10]}]}

import copy

# ---- lowering recipe of flow 'xnnpack' ----

def partitioners():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return [XnnpackPartitioner()]


def transform_passes():
    return []


def compile_config():
    return None

def make_runner(pte, edge):
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(pte)  # keep `pte` referenced: 1.5.1 does not
    return lambda name, args: list(program.load_method(name).execute(list(args)))


# ---- run and compare with eager ----
def _tolerance(expected):
    rtol, atol = {torch.float32: (1e-3, 1e-3), torch.float16: (1e-2, 1e-2),
                   torch.bfloat16: (2e-2, 1e-2)}[expected.dtype]
    finite = expected[torch.isfinite(expected)]
    scale = float(finite.abs().max()) if finite.numel() else 1.0
    return rtol, atol * max(1.0, scale)


class _Method(nn.Module):
    def __init__(self, program, name):
        super().__init__()
        self.program, self.name = program, name

    def forward(self, *args):
        return getattr(self.program, self.name)(*args)


def main():
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    program = Program().eval()
    program64 = copy.deepcopy(program).double()
    exported = {name: torch.export.export(_Method(program, name),
                  tuple(make_input(tuple(i["shape"]), i["dtype"], "normal", k) for k, i in enumerate(inputs)),
                  strict=False) for name, inputs in INPUTS.items()}
    edge = to_edge_transform_and_lower(exported, partitioner=partitioners() or None,
                                       transform_passes=transform_passes() or None,
                                       compile_config=compile_config())
    print(edge.exported_program(next(iter(INPUTS))).graph_module.graph)
    mutable = ['m19']
    config = ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(mutable)] if mutable else [])
    pte = edge.to_executorch(config).buffer
    run = make_runner(pte, edge)
    failed = False
    for name, inputs in INPUTS.items():
        for kind in ("normal", "negative", "zeros", "large", "small"):
            args = tuple(make_input(tuple(i["shape"]), i["dtype"], kind, k)
                         for k, i in enumerate(inputs))
            with torch.no_grad():
                want = list(getattr(program, name)(*args))
                wide = list(getattr(program64, name)(*(a.double() for a in args)))
            got = run(name, args)
            for index, (w, g, r) in enumerate(zip(want, got, wide)):
                rtol, atol = _tolerance(w)
                noise = (w.double() - r).abs().nan_to_num(0.0, 0.0, 0.0)
                allowed = atol + rtol * w.double().abs() + 8.0 * noise
                finite = torch.isfinite(w)
                same_special = torch.equal(w[~finite].double().nan_to_num(7.0), g[~finite].double().nan_to_num(7.0))
                excess = ((g.double() - w.double()).abs() - allowed)[finite]
                if g.shape != w.shape or not same_special or bool((excess > 0).any()):
                    failed = True
                    print(f"MISMATCH {name} {kind} output {index}: max excess "
                          f"{float(excess.max()) if excess.numel() else 0.0:.3g} over the allowed difference")
    print("VERDICT:", "mismatch" if failed else "pass")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
