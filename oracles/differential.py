"""Differential checks: a candidate flow against its baseline on the same program.

Both lowerings come from one export (etprop.verdicts.check lowers every flow of an
example from the same exported programs). The candidate must lower whenever
the baseline does, must not be larger (beyond SIZE_SLACK_BYTES, plus
DELEGATE_OVERHEAD_BYTES for each delegate call it adds, plus the function
bindings a Core AI multifunction manifest carries, plus the bundle metadata
the baseline's Core AI bundles may have shared by the clock), and must not delegate
less; each flow's own eager equivalence is checked by its own oracle.

A candidate that promises shared cache entries across methods (Core AI
multifunction) must also make its one bundle no larger than the stock
bundles with every weight counted once, within MULTIFUNCTION_TOLERANCE: for
methods that share all weights that is "within 1% of the single-method size".
"""

from __future__ import annotations

import json

from etprop.oracles import Verdict
from etprop.verdicts.outcomes import Outcome

NAME = "differential"
# Metadata that legitimately differs between two lowerings of one program
# (delegate names, debug handles, alignment padding of one segment).
SIZE_SLACK_BYTES = 256
# A candidate that delegates more (ops inside control-flow bodies) pays a
# delegate's fixed serialized cost for each extra delegate call: an XNNPACK
# blob holding one tanh is about 470 bytes here. Weights are not part of it:
# a weight moved into a delegate leaves the constant segment.
DELEGATE_OVERHEAD_BYTES = 1024
# How much larger one multifunction bundle may be than the stock bundles of
# all methods with each weight counted once (function tables, metadata).
MULTIFUNCTION_TOLERANCE = 0.01
# coreai-core stamps each bundle's metadata.json with the second it was
# written, and the .pte stores identical named blobs once: whether a
# program's bundles share one metadata file depends on the clock. The same
# program lowered in three processes measured 12,605, 12,606 and 12,905
# bytes. A lowering may therefore be smaller than usual by every metadata
# file but one, each with its table entry, and by one segment's padding
# (findings/coreai-bundle-hash-nondeterminism.md).
NAMED_ENTRY_BYTES = 32
SEGMENT_ALIGNMENT_BYTES = 128


def _binding_bytes(lowering) -> int:
    """Bytes of the per-delegate function bindings in Core AI manifests (the
    multifunction design names each delegate's function and I/O there; a
    stock manifest has none). Everything else must not grow."""
    if lowering.flow.runtime != "coreai":
        return 0
    from etprop.lowering.coreai_runtime import coreai_delegates
    from etprop.oracles.shared_cache import BINDING_FIELDS

    total = 0
    for lowered in coreai_delegates(lowering.executorch).values():
        manifest = json.loads(bytes(lowered.processed_bytes).decode())
        total += sum(len(json.dumps({key: manifest[key]})) for key in BINDING_FIELDS if key in manifest)
    return total


def _clock_dependent_bytes(lowering) -> int:
    """How much smaller this lowering may have come out because its Core AI
    bundles were written within one second (see NAMED_ENTRY_BYTES)."""
    if lowering.flow.runtime != "coreai":
        return 0
    from etprop.lowering.coreai_runtime import bundle_files, coreai_delegates

    manifests = {
        m["hash"]: m
        for m in (json.loads(bytes(d.processed_bytes).decode()) for d in coreai_delegates(lowering.executorch).values())
    }
    stamped = [m for m in manifests.values() if any(f.endswith("metadata.json") for f in m.get("files", []))]
    if len(stamped) < 2:
        # One bundle shares nothing with another: only its padding can move (no named data read).
        return SEGMENT_ALIGNMENT_BYTES if stamped else 0
    bundles = {tuple(sorted(files.items())) for files in bundle_files(lowering.executorch, lowering.pte).values()}
    metadata = sorted(len(data) for files in bundles for name, data in files if name.endswith("metadata.json"))
    if not metadata:
        return 0
    return sum(metadata[:-1]) + NAMED_ENTRY_BYTES * (len(metadata) - 1) + SEGMENT_ALIGNMENT_BYTES


def _bundle_bytes(files: dict[str, bytes]) -> int:
    return sum(len(data) for data in files.values())


def multifunction_excess(base, lowering) -> str | None:
    """Why the candidate's bundles are too large for shared weights, or None."""
    from etprop.lowering.coreai_runtime import bundle_files
    from etprop.oracles.growth import count_occurrences, program_weights

    stock = bundle_files(base.executorch, base.pte)
    if len({key.split("/")[0] for key in stock}) < 2:
        return None
    shared = {tuple(sorted(files.items())): files for files in bundle_files(lowering.executorch, lowering.pte).values()}
    candidate_bytes = sum(_bundle_bytes(files) for files in shared.values())
    stock_bytes = sum(_bundle_bytes(files) for files in stock.values())
    repeated = 0
    for weight in program_weights(base.built):
        holders = sum(
            1 for files in stock.values() if any(count_occurrences(data, weight.tensor) for data in files.values())
        )
        repeated += max(holders - 1, 0) * weight.tensor.numel() * weight.tensor.element_size()
    allowed = (stock_bytes - repeated) * (1 + MULTIFUNCTION_TOLERANCE)
    if candidate_bytes > allowed:
        return (
            f"{lowering.flow.name} stores {len(shared)} bundle(s) of {candidate_bytes} bytes; the "
            f"{len(stock)} stock bundles hold {stock_bytes} bytes of which {repeated} are weights "
            f"repeated across methods, so at most {allowed:.0f} bytes were expected "
            f"(+{MULTIFUNCTION_TOLERANCE:.0%})"
        )
    return None


def facts(lowering) -> dict:
    """What the comparison reads of one lowering, as plain data: a lowering in
    another Python environment sends these (etprop/commands/env_worker.py)."""
    from etprop.oracles import coverage

    return {
        "flow": lowering.flow.name,
        "pte_bytes": len(lowering.pte),
        "delegate_calls": coverage.delegate_calls(lowering),
        "portable_ops": dict(coverage.grouped(coverage.portable_ops(lowering))),
        "binding_bytes": _binding_bytes(lowering),
        "clock_bytes": _clock_dependent_bytes(lowering),
    }


def compare_facts(base: dict, candidate: dict) -> Verdict:
    """The candidate's lowering against the baseline's, from their facts."""
    grown = candidate["pte_bytes"] - base["pte_bytes"]
    extra_delegates = max(candidate["delegate_calls"] - base["delegate_calls"], 0)
    bindings = candidate.get("binding_bytes", 0) - base.get("binding_bytes", 0)
    clock = base.get("clock_bytes", 0)
    allowed = SIZE_SLACK_BYTES + extra_delegates * DELEGATE_OVERHEAD_BYTES + max(bindings, 0) + clock
    if grown > allowed:
        return Verdict.failed(
            NAME,
            f".pte grew: {candidate['flow']} {candidate['pte_bytes']} bytes vs "
            f"{base['flow']} {base['pte_bytes']} bytes (+{grown}; allowed {allowed}: slack "
            f"{SIZE_SLACK_BYTES} + {extra_delegates} more delegates x "
            f"{DELEGATE_OVERHEAD_BYTES} + {max(bindings, 0)} bytes of manifest bindings + "
            f"{clock} bytes of bundle metadata shared by the clock)",
            Outcome.VIOLATION,
            candidate_bytes=candidate["pte_bytes"],
            baseline_bytes=base["pte_bytes"],
        )
    before, after = base["portable_ops"], candidate["portable_ops"]
    worse = {op: f"{before.get(op, 0)} -> {n}" for op, n in after.items() if n > before.get(op, 0)}
    if worse:
        return Verdict.failed(
            NAME,
            f"{candidate['flow']} leaves more ops outside delegates than {base['flow']}: {worse}",
            Outcome.VIOLATION,
        )
    return Verdict.passed(NAME, f"{candidate['pte_bytes']} vs {base['pte_bytes']} bytes; coverage not worse")


def check(lowering, lowerings) -> Verdict:
    """``lowerings`` lists the baseline first; the candidate is any later one."""
    base = next(iter(lowerings.values()))
    if base is lowering:
        return Verdict.passed(NAME, "baseline flow: nothing to compare")
    if not base.ok:
        return Verdict.passed(NAME, f"baseline {base.flow.name} did not lower ({base.outcome.value})")
    if not lowering.ok:
        return Verdict.failed(
            NAME,
            f"{base.flow.name} lowers this program but {lowering.flow.name} fails: {lowering.error.splitlines()[0]}",
            lowering.outcome,
        )
    compared = compare_facts(facts(base), facts(lowering))
    if not compared.ok:
        return compared
    if lowering.flow.promises.shared_cache and lowering.flow.runtime == "coreai":
        excess = multifunction_excess(base, lowering)
        if excess:
            return Verdict.failed(NAME, excess, Outcome.VIOLATION)
    return compared
