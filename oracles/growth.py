"""No program growth: every distinct weight is stored once in the .pte.

The serialized program is searched for each weight's bytes: the module's
parameters and buffers, and each weight computed from them (the value a
fold would store). Backends repack weights (XNNPACK stores convolution
weights channels-last, linear weights transposed), so every permutation of a
tensor's dimensions counts as the same weight. A weight found more than once,
in any layouts, in the .pte (constant segment, delegate payloads and named
data alike) is stored twice. A computed weight stored beside all of the
parameters it was computed from is growth too: the fold should have replaced
them. The size comparison with a baseline flow lives in oracles/differential.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from etprop.oracles import Verdict
from etprop.program.builder import tensor_constants

NAME = "no program growth"
# Tensors smaller than this are not searched: a few bytes can match by chance.
MIN_BYTES = 32


@dataclass
class Weight:
    name: str
    tensor: torch.Tensor
    computed_from: tuple[str, ...] = ()
    # Distinct state tensors that happen to hold these very bytes (two
    # parameters drawn from one seed): each may be stored once.
    copies: int = 1


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """The raw bytes of a tensor, any dtype (numpy has no bfloat16)."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def _layouts(tensor: torch.Tensor):
    """The bytes of every dimension permutation of ``tensor`` (distinct ones)."""
    seen = set()
    dims = range(tensor.dim())
    for order in itertools.permutations(dims) if tensor.dim() <= 4 else [tuple(dims)]:
        data = tensor_bytes(tensor.detach().permute(order))
        if data not in seen:
            seen.add(data)
            yield order, data


def count_occurrences(blob: bytes, tensor: torch.Tensor) -> dict[tuple, int]:
    """{dimension order: occurrences} for every layout found in ``blob``."""
    found = {}
    for order, data in _layouts(tensor):
        count, start = 0, blob.find(data)
        while start != -1:
            count += 1
            start = blob.find(data, start + 1)
        if count:
            found[order] = count
    return found


def _positions(blob: bytes, data: bytes) -> list[int]:
    found, start = [], blob.find(data)
    while start != -1:
        found.append(start)
        start = blob.find(data, start + 1)
    return found


def inside_other_weights(blob: bytes, weight: Weight, weights: list[Weight]) -> set[int]:
    """Offsets in ``blob`` where ``weight``'s bytes (any layout) are part of a
    larger weight's stored bytes. Seeded values make this common: two tensors
    drawn from one seed and scale share their first elements, so the smaller
    one's bytes are found inside the larger one's storage, which is not a
    second copy of it."""
    offsets = set()
    inner = [data for _, data in _layouts(weight.tensor)]
    for other in weights:
        if other is weight or other.tensor.numel() <= weight.tensor.numel():
            continue
        for _, outer in _layouts(other.tensor):
            within = [index for data in inner for index in _positions(outer, data)]
            if within:
                offsets.update(start + index for start in _positions(blob, outer) for index in within)
    return offsets


def program_weights(built) -> list[Weight]:
    """Parameters and buffers (deduplicated by content), plus computed weights."""
    module = built.module
    # Mutable buffers are state, not weights: ExecuTorch gives each method its
    # own copy (and its initial value), by design.
    mutable = {name for name, e in built.spec["state"].items() if e["kind"] == "buffer" and e.get("mutable")}
    weights, seen = [], {}
    for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
        if name in mutable or not tensor.dtype.is_floating_point or tensor.numel() * tensor.element_size() < MIN_BYTES:
            continue
        key = tensor_bytes(tensor)
        if key in seen:
            seen[key].copies += 1
        else:
            seen[key] = Weight(name, tensor.detach())
            weights.append(seen[key])
    for state_name, entry in built.spec["state"].items():
        owner = getattr(module, state_name, None)
        for attribute in sorted({p.get("on", "weight") for p in entry.get("parametrizations", [])}):
            with torch.no_grad():
                value = getattr(owner, attribute).detach()
            # A computed weight that is only a re-layout of its source (stored
            # transposed or flat) is that source: count it once, as the source.
            # One equal to another state entry's computed weight (a bias given
            # its own copy of a weight) is a distinct tensor: each may be stored once.
            same = next((seen[data] for _, data in _layouts(value) if data in seen), None)
            if same is not None:
                if same.name.endswith("(computed)") and not same.name.startswith(f"{state_name}."):
                    same.copies += 1
                continue
            key = tensor_bytes(value)
            if value.numel() * value.element_size() >= MIN_BYTES:
                prefix = f"{state_name}.parametrizations.{attribute}."
                sources = tuple(w.name for w in weights if w.name.startswith(prefix))
                seen[key] = Weight(f"{state_name}.{attribute} (computed)", value, sources)
                weights.append(seen[key])
    return weights


def stored_constants(built) -> list[Weight]:
    """The program's plain tensor constants: stored by value like weights, so
    a weight's bytes found inside one (drawn from the same seed) are that
    constant's storage, not a copy of the weight."""
    return [
        Weight(name, tensor.detach())
        for name, tensor in tensor_constants(built.spec, built.module).items()
        if tensor.dtype.is_floating_point and tensor.numel() * tensor.element_size() >= MIN_BYTES
    ]


def _outside_others(blob: bytes, weight: Weight, found: dict, others: list[Weight]) -> dict:
    """``found`` without the occurrences that lie inside another tensor's stored bytes."""
    inside = inside_other_weights(blob, weight, others)
    found = {
        order: len([at for at in _positions(blob, data) if at not in inside])
        for order, data in _layouts(weight.tensor)
        if order in found
    }
    return {order: count for order, count in found.items() if count}


def check(lowering, lowerings=None) -> Verdict:
    if not lowering.flow.promises.weights_stored_once:
        return Verdict.passed(NAME, f"flow {lowering.flow.name} does not promise single storage")
    blob = lowering.pte
    duplicates, placement = [], {}
    weights = program_weights(lowering.built)
    others = weights + stored_constants(lowering.built)
    for weight in weights:
        found = count_occurrences(blob, weight.tensor)
        placement[weight.name] = found
        total = sum(found.values())
        if total > weight.copies:
            # Only a suspected duplicate pays for the search among the others.
            found = _outside_others(blob, weight, found, others)
            total = sum(found.values())
        if total > weight.copies:
            layouts = ", ".join(f"{n}x as dims {order}" for order, n in found.items())
            duplicates.append(
                f"{weight.name} {tuple(weight.tensor.shape)} "
                f"({weight.tensor.numel() * weight.tensor.element_size()} bytes) stored "
                f"{total} times: {layouts}"
            )
    for weight in weights:
        if (
            weight.computed_from
            and placement[weight.name]
            and all(placement.get(source) for source in weight.computed_from)
            and _outside_others(blob, weight, placement[weight.name], others)
        ):
            duplicates.append(f"{weight.name} is stored folded and so are all its sources {list(weight.computed_from)}")
    if duplicates:
        return Verdict.failed(NAME, "; ".join(duplicates), duplicates=duplicates)
    located = sum(1 for found in placement.values() if found)
    return Verdict.passed(NAME, f"{len(weights)} weights, {located} located once, none twice ({len(blob)} bytes)")
