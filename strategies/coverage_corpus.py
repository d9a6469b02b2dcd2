"""The coverage corpus: a deterministic set of drawn programs that together
reach every (op, argument value, dtype) combination a seeded pool of drawn
programs reaches (etprop/program/coverage_space.py), most new combinations
first, packed several to a program where they can share one method.

Random drawing reaches a rare combination by luck; a campaign runs this
corpus first (properties/test_coverage.py) and the gate runs it before its
random programs, so every drawable combination is exercised early, whatever
the seed."""

from __future__ import annotations

from etprop.program import coverage_space
from etprop.program.spec import digest

# Drawn programs per pool strategy the corpus chooses from.
POOL_PER_FAMILY = 150
# Programs per packed program; coreai-torch converts a large quantized program
# slowly and in gigabytes (finding COREAI-004), so flows run by the Core AI
# runtime get smaller packs.
PACK_SIZE = 10
PACK_SIZE_BY_RUNTIME = {"coreai": 3}


def families() -> dict:
    """The program families, by name, as the properties draw them."""
    from etprop.strategies.control_flow import control_flow_programs
    from etprop.strategies.programs import computed_weight_programs, multi_method_programs, programs, quantized_programs

    return {
        "mixed": programs(min_nodes=6, max_nodes=32),
        "computed_weights": computed_weight_programs(),
        "control_flow": control_flow_programs(),
        "multi_method": multi_method_programs(),
        "quantized": quantized_programs(),
    }


def pool_strategies(targeted: bool = True) -> list:
    """What the corpus chooses from: every family, and (``targeted``) single-method programs
    with twins (``programs(twins=True)``) drawn in each float dtype. The
    mixed family draws a dtype per program, so a form its half-precision
    programs rarely hold (a transposed convolution in bfloat16) is otherwise
    reached only by a multi-method program, which cannot be packed and runs a
    few times per campaign; and the families draw a twin (the form in which a
    swapped weight shows) only as one drawer among many. The gate's families
    stay as they are."""
    from etprop.strategies.programs import programs

    return list(families().values()) + [
        programs(min_nodes=6, max_nodes=32, dtype=dtype, twins=True)
        for dtype in ("float32", "float16", "bfloat16")
        if targeted
    ]


def family_of(spec: dict) -> str:
    """The property family that judges a program: multi-method programs
    need the multi-method oracles, quantized ones the quantized bound."""
    if len(spec["methods"]) > 1:
        return "multi_method"
    return "quantized" if spec.get("quantization") else "mixed"


def drawn(strategy, count: int, seed: int) -> list[dict]:
    """``count`` specs from ``strategy``, the same ones for the same seed."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as seeded

    from etprop.strategies.reproducible import draws_independent_of_imported_source
    from etprop.strategies.sizes import property_ranges

    specs: list[dict] = []

    @seeded(seed)
    @settings(max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(spec=strategy)
    def collect(spec):
        specs.append(spec)

    with draws_independent_of_imported_source(), property_ranges():
        collect()
    return specs[:count]


def chosen(seed: int, pool_per_family: int = POOL_PER_FAMILY, targeted: bool = True) -> tuple[list[dict], set]:
    """The programs of the corpus in the order they were picked (each adding
    the most combinations not yet reached), and every combination the pool
    (``pool_strategies(targeted)``) reaches."""
    pool: dict = {}
    for strategy in pool_strategies(targeted):
        for spec in drawn(strategy, pool_per_family, seed):
            pool.setdefault(digest(spec), spec)
    specs = list(pool.values())
    picked, wanted = coverage_space.greedy_cover(specs)
    return [specs[index] for index in picked], wanted


def packed(
    specs: list[dict], pack_size: int, alone: list[dict] = (), position: int = 0, peers: int = 1
) -> list[tuple[dict, list[dict]]]:
    """``specs`` as programs to run: (program, the specs it computes). Specs of
    one packing class go ``pack_size`` to a program, in their order; a spec
    that cannot share a method, and every spec of ``alone``, stays alone. The
    classes take turns, float ones first (a float32 pack, a float16 pack, a
    bfloat16 pack, a quantized pack of each scheme, a multi-method program,
    one of ``alone``, then the next of each), so a budget that ends early has
    still reached every class, and every dtype the mutation score reads.
    Flows that run the same packs pass their ``position`` among ``peers``:
    each class then starts that share of the way in, wrapping around, and the
    float turn starts at the ``position``-th dtype, so a budget that ends
    after a pack or two per flow has still run every float dtype, and most of
    every class, on some flow."""
    by_class: dict = {}
    for spec in specs:
        by_class.setdefault(coverage_space.packing_class(spec), []).append(spec)
    order = sorted(by_class, key=_turn_order)
    # Each peer starts its float turn at another dtype: flows that run one
    # pack each have together run every float dtype.
    floats = [packing for packing in order if packing is not None and packing[2] is None]
    turn = position % len(floats) if floats else 0
    order = floats[turn:] + floats[:turn] + [packing for packing in order if packing not in floats]
    queues = []
    for packing in order:
        members = by_class[packing]
        if packing is None:
            queues.append([(spec, [spec]) for spec in members])
        else:
            queues.append(
                [
                    (coverage_space.pack(members[start : start + pack_size]), members[start : start + pack_size])
                    for start in range(0, len(members), pack_size)
                ]
            )
    if alone:
        queues.append([(spec, [spec]) for spec in alone])
    queues = [queue[len(queue) * position // peers :] + queue[: len(queue) * position // peers] for queue in queues]
    return [queue[turn] for turn in range(max(map(len, queues), default=0)) for queue in queues if turn < len(queue)]


_DTYPE_TURNS = ("float32", "float16", "bfloat16")


def _turn_order(packing) -> tuple:
    """Float classes by dtype, then quantized ones by scheme, then programs
    that stay alone."""
    if packing is None:
        return (2,)
    _, dtype, scheme = packing
    rank = _DTYPE_TURNS.index(dtype) if dtype in _DTYPE_TURNS else len(_DTYPE_TURNS)
    return (scheme is not None, rank, dtype, scheme or "")


def for_flow(
    specs: list[dict], pack_size: int, without_known_causes, position: int = 0, peers: int = 1
) -> list[tuple[dict, list[dict]]]:
    """The corpus as one flow, ``position`` of ``peers`` running the same
    packs (packed), runs it. A program holding the cause of a
    finding recorded for the flow fails on it, and in a pack one such part
    hides what the other parts compute: every spec joins its pack as
    ``without_known_causes(spec)`` returns it (the flow's findings'
    neutralizations), so packs pass and their outputs serve mutation analysis.
    A spec whose neutralization removed a combination no other program
    reaches also runs as drawn, alone: every combination is still exercised,
    and a fixed finding still shows. So does a spec whose neutralization no
    longer computes (a pool's ``ceil_mode`` reset shortens what a later op
    needs): in a pack it would fail export for every part."""
    from etprop.program import builder

    pairs, alone = [], []
    for spec in specs:
        neutral = without_known_causes(spec)
        if neutral != spec and not builder.computes(neutral):
            alone.append(spec)
        else:
            pairs.append((spec, neutral))
    clean = [neutral for _, neutral in pairs]
    reached = set().union(*(coverage_space.keys(spec) for spec in clean))
    for spec, neutral in pairs:
        keys = coverage_space.keys(spec) - coverage_space.keys(neutral)
        if keys - reached:
            alone.append(spec)
            reached |= keys
    return packed(clean, pack_size, alone, position, peers)


def for_flow_stored(
    folder, key: str, specs: list[dict], pack_size: int, without_known_causes, position: int = 0, peers: int = 1
) -> list[tuple[dict, list[dict]]]:
    """``for_flow``, kept in ``folder`` under ``key`` (what the packing depends
    on beyond the corpus: the flow, and the findings that neutralize its
    causes): every round of a campaign and every worker reads the packing the
    first one made, which builds each neutralized spec (some 20 s a flow)."""
    import hashlib
    import json
    import os
    from pathlib import Path

    digest = hashlib.sha256(json.dumps([key, pack_size, position, peers, specs], sort_keys=True).encode()).hexdigest()
    path = Path(folder) / f"packs-{digest[:16]}.json"
    try:
        return [(program, group) for program, group in json.loads(path.read_text())]
    except (OSError, ValueError):
        pass
    programs = for_flow(specs, pack_size, without_known_causes, position, peers)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.part")
    partial.write_text(json.dumps(programs))
    partial.replace(path)
    return programs


def pack_size_for(runtime: str) -> int:
    return PACK_SIZE_BY_RUNTIME.get(runtime, PACK_SIZE)


def _fingerprint(pool_per_family: int, seed: int, targeted: bool) -> str:
    """What the corpus depends on: the drawing code, the coverage space and Hypothesis."""
    import hashlib
    from pathlib import Path

    import hypothesis

    from etprop.program import spec as specmod

    digest = hashlib.sha256(f"{hypothesis.__version__}:{pool_per_family}:{seed}:{targeted}".encode())
    sources = sorted(Path(__file__).parent.glob("*.py")) + [Path(coverage_space.__file__)]
    sources += sorted(Path(specmod.__file__).parent.glob("*.py"))
    for source in sources:
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def stored_path(folder, pool_per_family: int = POOL_PER_FAMILY, seed: int = 0, targeted: bool = True):
    from pathlib import Path

    return Path(folder) / f"corpus-{_fingerprint(pool_per_family, seed, targeted)}.json"


def stored(
    folder, pool_per_family: int = POOL_PER_FAMILY, seed: int = 0, targeted: bool = True
) -> tuple[list[dict], set]:
    """The corpus kept in ``folder`` (a campaign's ``coverage/``), made and
    stored there first when it is missing or was made by other drawing code:
    a campaign's rounds and workers all read the one its start made."""
    import json
    import os

    path = stored_path(folder, pool_per_family, seed, targeted)
    try:
        data = json.loads(path.read_text())
        return data["programs"], {tuple(key) for key in data["wanted"]}
    except (OSError, ValueError, KeyError):
        pass
    specs, wanted = chosen(seed, pool_per_family, targeted)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.part")
    partial.write_text(
        json.dumps(
            {
                "seed": seed,
                "pool_per_family": pool_per_family,
                "targeted": targeted,
                "programs": specs,
                "wanted": sorted(wanted),
            }
        )
    )
    partial.replace(path)
    return specs, wanted
