"""Shared cache entries: methods that share weights share one stored payload.

Parameterized by what the flow promises (``Promises.shared_cache``):

- every flow: no two named-data keys hold identical bytes under different
  keys (a payload stored twice defeats dedup and any cache keyed on it); the
  growth oracle separately checks that every weight is stored once;
- a flow that promises sharing across methods for Core AI (multifunction):
  all Core AI delegates of all methods carry one content hash (one cache key),
  their manifests differ only in the function binding and I/O names, and the
  named data holds exactly one bundle.

Flows that promise no sharing (stock ``coreai``) get a report, not a verdict.
"""

from __future__ import annotations

import json
from collections import defaultdict

from etprop.oracles import Verdict

NAME = "shared cache entries"
# Payloads smaller than this are not compared: two bundles' metadata.json files
# written in the same second are byte-identical under two keys, legitimately
# (findings/shared-cache-oracle-clock-dependent.md).
MIN_PAYLOAD_BYTES = 1024
# Manifest fields that may differ between methods sharing one bundle.
BINDING_FIELDS = ("function", "input_names", "output_names", "inputs", "outputs")


def _named_data(lowering) -> dict[str, bytes]:
    store = getattr(lowering.executorch, "_named_data", None)
    if store is None:
        return {}
    return {key: bytes(store.buffers[entry.buffer_index]) for key, entry in store.pte_data.items()}


def _coreai_manifests(lowering) -> dict[str, dict]:
    if lowering.flow.runtime != "coreai":
        return {}
    from etprop.lowering.coreai_runtime import coreai_delegates

    return {
        key: json.loads(bytes(lm.processed_bytes).decode()) for key, lm in coreai_delegates(lowering.executorch).items()
    }


def check(lowering, lowerings=None) -> Verdict:
    problems = []
    by_content = defaultdict(list)
    for key, data in _named_data(lowering).items():
        if len(data) >= MIN_PAYLOAD_BYTES:
            by_content[data].append(key)
    for data, keys in by_content.items():
        if len(keys) > 1:
            problems.append(f"named data holds the same {len(data)} bytes under {len(keys)} keys: {sorted(keys)[:4]}")
    manifests = _coreai_manifests(lowering)
    hashes = sorted({m.get("hash") for m in manifests.values()})
    bundles = sorted({key.split("/")[1] for key in _named_data(lowering) if key.startswith("coreai/")})
    methods = {key.split("/")[0] for key in manifests}
    if lowering.flow.promises.shared_cache and len(methods) > 1:
        if len(hashes) != 1:
            problems.append(
                f"Core AI delegates of methods {sorted(methods)} carry {len(hashes)} hashes "
                f"(cache keys) {hashes}, expected one"
            )
        if len(bundles) != 1:
            problems.append(f"named data holds {len(bundles)} Core AI bundles {bundles}, expected one")
        stripped = {key: {k: v for k, v in m.items() if k not in BINDING_FIELDS} for key, m in manifests.items()}
        reference_key = next(iter(stripped))
        for key, manifest in stripped.items():
            if manifest != stripped[reference_key]:
                extra = sorted(
                    k
                    for k in set(manifest) | set(stripped[reference_key])
                    if manifest.get(k) != stripped[reference_key].get(k)
                )
                problems.append(f"manifest {key} differs from {reference_key} beyond the binding: {extra}")
    if problems:
        return Verdict.failed(NAME, "; ".join(problems), problems=problems)
    return Verdict.passed(
        NAME,
        f"{len(lowering.built.methods)} methods, {len(by_content)} named payloads, "
        f"{len(manifests)} Core AI delegates, {len(hashes)} hashes, {len(bundles)} bundles",
        hashes=hashes,
        bundles=bundles,
    )
