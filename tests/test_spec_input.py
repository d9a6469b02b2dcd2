"""Specs and repro files from anywhere are untrusted input.

Every file etprop reads is checked against the published schema, the checks a
schema cannot express and the size limits, before anything is built; what
fails is one line of etprop's own error, never a traceback, a hang, an
allocation past the limits or code run from the file. The malformed files are
drawn the way etprop draws programs, by mutating valid ones, and loaded in a
child process limited to 2 GB of address space.
"""

from __future__ import annotations

import copy
import json
import random
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from etprop.errors import UsageError
from etprop.program import limits
from etprop.program import spec as specmod
from etprop.verdicts import repro
from etprop.verdicts.known_findings import FINDINGS_DIR

ADDRESS_SPACE = 2 << 30
# Code a file may try to smuggle in: it would create this file in the working directory.
MARKER = "ETPROP_INJECTED"
INJECTION = f"__import__('os').system('touch {MARKER}')"


def _limited():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _record(spec: dict) -> dict:
    return {
        "format": repro.FORMAT,
        "property": "mixed",
        "flows": ["portable"],
        "outcome": None,
        "message": "",
        "spec": spec,
    }


def _relu_spec() -> dict:
    return {
        "format": specmod.FORMAT,
        "state": {},
        "methods": {
            "forward": {
                "inputs": [{"name": "x0", "shape": [2, 3], "dtype": "float32"}],
                "nodes": [{"id": "v1", "op": "relu", "args": ["x0"]}],
                "outputs": ["v1"],
            }
        },
    }


def _base_records() -> list[dict]:
    """Valid repro files: the findings' (GEMMs, layers, state, control flow) and a one-node one."""
    records = [json.loads(path.read_text()) for path in sorted((FINDINGS_DIR / "repros").glob("*.json"))]
    return records + [_record(_relu_spec())]


BASES = _base_records()


def _cli(path: Path, *extra: str) -> subprocess.CompletedProcess:
    completed = subprocess.run(
        [sys.executable, "-m", "etprop.commands.cli", "repro", "--check", str(path), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limited,
        cwd=path.parent,
    )
    assert not (path.parent / MARKER).exists(), "code from a spec ran"
    return completed


def _assert_one_line_error(completed: subprocess.CompletedProcess, expected: str) -> None:
    assert completed.returncode == 2, completed.stderr[-2000:]
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("etprop: error: "), completed.stderr[-2000:]
    assert expected in lines[0], lines[0]


def test_every_base_record_is_valid():
    for record in BASES:
        specmod.check_schema(record, repro.SCHEMA)
        specmod.validate(record["spec"])


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing_state", "'state' is a required property"),
        ("huge_shape", "over the limit of"),
        ("shapes_do_not_fit", "does not fit together at 'v2'"),
        ("unknown_op", "unknown op 'frobnicate'"),
        ("code_in_an_attribute", "does not match"),
        ("not_json", "not valid JSON"),
        ("future_format", "etprop-repro/1"),
        ("deep_nesting", "nests its JSON too deeply"),
        ("random_bytes", "not UTF-8 text"),
        ("unknown_flow", "unknown flow 'nope'"),
        ("node_without_its_state", "node v2 does not render as Python"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_fix(case, expected, tmp_path):
    spec = _relu_spec()
    if case == "missing_state":
        del spec["state"]
    elif case == "huge_shape":
        spec["methods"]["forward"]["inputs"][0]["shape"] = [200000, 200000]
    elif case == "shapes_do_not_fit":
        spec["state"]["w"] = {"kind": "weight", "shape": [5, 4], "seed": 1}
        spec["methods"]["forward"]["nodes"].append({"id": "v2", "op": "linear", "args": ["v1"], "state": "w"})
        spec["methods"]["forward"]["outputs"] = ["v2"]
    elif case == "unknown_op":
        spec["methods"]["forward"]["nodes"][0]["op"] = "frobnicate"
    elif case == "code_in_an_attribute":
        spec["methods"]["forward"]["nodes"][0]["attrs"] = {"how": INJECTION}
    elif case == "node_without_its_state":  # a buffer update that names no buffer
        spec["methods"]["forward"]["nodes"].append(
            {"id": "v2", "op": "buffer_update", "args": ["v1"], "attrs": {"how": "copy"}}
        )
        spec["methods"]["forward"]["outputs"] = ["v2"]
    record = _record(spec)
    if case == "future_format":
        record["format"] = "etprop-repro/9"
    if case == "unknown_flow":
        record["flows"] = ["nope"]
    path = tmp_path / f"{case}.json"
    text = json.dumps(record)
    path.write_text(text[:-40] if case == "not_json" else text)
    if case == "deep_nesting":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif case == "random_bytes":
        path.write_bytes(b"\x92" + random.Random(0).randbytes(2047))
    completed = _cli(path)
    _assert_one_line_error(completed, expected)


def test_a_limit_can_be_raised_and_the_repro_command_refuses_before_building(tmp_path):
    spec = _relu_spec()
    spec["methods"]["forward"]["inputs"][0]["shape"] = [3000, 3000]
    path = tmp_path / "big.json"
    path.write_text(json.dumps(_record(spec)))
    _assert_one_line_error(_cli(path), "--limit tensor_elements=N")
    assert _cli(path, "--limit", "tensor_elements=1e7").returncode == 0
    replayed = subprocess.run(
        [sys.executable, "-m", "etprop.commands.cli", "repro", str(path), "--artifacts", str(tmp_path / "artifacts")],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limited,
    )
    _assert_one_line_error(replayed, "tensor_elements")


def test_the_defaults_cover_what_the_strategies_draw():
    """Drawn programs pass with every limit a quarter of its default: the
    defaults never refuse what etprop itself generates."""
    from etprop.strategies.control_flow import control_flow_programs
    from etprop.strategies.programs import computed_weight_programs, multi_method_programs, programs

    tight = {name: value // 4 for name, value in limits.DEFAULTS.items()}
    tight["depth"] = limits.DEFAULTS["depth"]

    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(
        st.one_of(
            programs(min_nodes=6, max_nodes=40),
            computed_weight_programs(),
            control_flow_programs(),
            multi_method_programs(),
        )
    )
    def drawn_specs_pass(spec):
        specmod.validate(spec, tight)

    drawn_specs_pass()


# ---- malformed files, drawn -------------------------------------------------


def _containers(value, path=()):
    """Every dict and list inside ``value``, with its path."""
    if isinstance(value, (dict, list)):
        yield path, value
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, child in items:
            yield from _containers(child, path + (key,))


JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.lists(st.integers(-5, 5), max_size=3),
    st.just({"kind": "layer"}),
    st.just(INJECTION),
    st.sampled_from(["class", "lambda", "self", "torch", "a b", "x0", "v1", "w"]),
)


# Files no JSON record lies in: bytes that are not UTF-8, brackets nested
# past the parser's recursion, a record cut short.
RAW = st.one_of(
    st.binary(min_size=1, max_size=2048).filter(lambda b: not b.isascii()),
    st.integers(1_000, 200_000).map(lambda depth: ("[" * depth + "]" * depth).encode()),
    st.integers(1_000, 200_000).map(lambda depth: ('{"a":' * depth + "1" + "}" * depth).encode()),
    st.sampled_from(BASES).map(lambda record: json.dumps(record)[:-7].encode()),
)


@st.composite
def malformed_files(draw) -> bytes:
    """A malformed repro file's bytes: a record with parts broken, or raw junk."""
    if draw(st.integers(0, 5)) == 0:
        return draw(RAW)
    return json.dumps(draw(malformed_records())).encode()


@st.composite
def malformed_records(draw):
    record = copy.deepcopy(draw(st.sampled_from(BASES)))
    spec = record["spec"]
    for _ in range(draw(st.integers(1, 3))):
        mutation = draw(st.sampled_from(["drop", "junk", "dangling", "huge", "nest", "format", "ints", "flows"]))
        places = list(_containers(record))
        path, container = draw(st.sampled_from(places))
        if mutation == "drop" and container:
            key = draw(
                st.sampled_from(sorted(container) if isinstance(container, dict) else list(range(len(container))))
            )
            del container[key]
        elif mutation == "junk" and container:
            key = draw(
                st.sampled_from(sorted(container) if isinstance(container, dict) else list(range(len(container))))
            )
            container[key] = draw(JUNK)
        elif mutation == "dangling":
            method = spec.get("methods", {}).get(next(iter(spec.get("methods", {}) or {"": 0})))
            if isinstance(method, dict) and method.get("nodes"):
                node = method["nodes"][-1]
                if isinstance(node, dict):
                    node[draw(st.sampled_from(["args", "state"]))] = draw(st.sampled_from([["ghost"], "ghost"]))
        elif mutation == "huge":
            for _, found in _containers(spec):
                if isinstance(found, dict) and isinstance(found.get("shape"), list):
                    found["shape"] = draw(st.sampled_from([[200000, 200000], [0, 3], [-1, 4], [2] * 40]))
                    break
        elif mutation == "nest":
            for method in (spec.get("methods") or {}).values():
                if isinstance(method, dict) and isinstance(method.get("nodes"), list) and method.get("inputs"):
                    first = method["inputs"][0]["name"] if isinstance(method["inputs"][0], dict) else "x0"
                    body = {"params": ["p0"], "nodes": [{"id": "n0", "op": "relu", "args": ["p0"]}], "outputs": ["n0"]}
                    for depth in range(draw(st.integers(2, 12))):
                        body = {
                            "params": ["p0"],
                            "nodes": [{"id": f"m{depth}", "op": "map", "args": ["p0"], "bodies": [body]}],
                            "outputs": [f"m{depth}"],
                        }
                    method["nodes"].append({"id": "deep", "op": "map", "args": [first], "bodies": [body]})
                    break
        elif mutation == "flows":
            record["flows"] = draw(st.sampled_from([["nope"], ["xnnpack", "nope"], [""], ["portable "]]))
        elif mutation == "format":
            target = draw(st.sampled_from([record, spec]))
            target["format"] = draw(st.sampled_from(["etprop-spec/2", "etprop-repro/0", None, 7, ""]))
        elif mutation == "ints":
            for _, found in _containers(spec):
                if isinstance(found, dict) and isinstance(found.get("attrs"), dict):
                    found["attrs"][draw(st.sampled_from(["dim", "iterations", "start", "output_size"]))] = draw(
                        st.sampled_from([10**9, -(10**9), [10**6, 10**6], 2**63])
                    )
                    break
    return record


LOADER = textwrap.dedent("""
    import json, sys, traceback
    from etprop.errors import UsageError
    from etprop.verdicts import repro
    for path in sys.argv[1:]:
        try:
            repro.check_flows(repro.read(path), path)
            print(json.dumps([path, "ok", ""]), flush=True)
        except UsageError as exc:
            print(json.dumps([path, "usage", str(exc)]), flush=True)
        except BaseException as exc:
            print(json.dumps([path, "other", traceback.format_exc()]), flush=True)
""")


@settings(max_examples=1, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(malformed_files(), min_size=150, max_size=150))
def test_malformed_files_end_in_one_line_errors_within_2gb(tmp_path_factory, files):
    """150 drawn malformed repro files, loaded in one child process limited to
    2 GB: each is valid or refused with one line of etprop's UsageError."""
    folder = tmp_path_factory.mktemp("malformed")
    paths = []
    for index, payload in enumerate(files):
        path = folder / f"{index}.json"
        path.write_bytes(payload)
        paths.append(str(path))
    completed = subprocess.run(
        [sys.executable, "-c", LOADER, *paths],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=_limited,
        cwd=folder,
    )
    assert not (folder / MARKER).exists(), "code from a spec ran"
    assert completed.returncode == 0, completed.stderr[-3000:]
    outcomes = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("[")]
    assert len(outcomes) == len(paths), completed.stderr[-3000:]
    for path, kind, text in outcomes:
        assert kind in ("ok", "usage"), f"{path}: {Path(path).read_bytes()[:500]!r}\n{text}"
        if kind == "usage":
            assert "\n" not in text and text, f"{path}: {text}"
    assert sum(kind == "usage" for _, kind, _ in outcomes) > len(outcomes) // 2


def test_a_spec_that_fits_is_not_refused_by_the_shape_check():
    from etprop.program.builder import check_shapes

    for record in BASES:
        check_shapes(record["spec"])


def test_the_schema_ships_with_the_package():
    import importlib.resources

    folder = importlib.resources.files("etprop.program") / "schemas"
    names = {entry.name for entry in folder.iterdir()}
    assert {specmod.SCHEMA, repro.SCHEMA} <= names
    with pytest.raises(UsageError, match="is a required property"):
        specmod.check_schema({"format": specmod.FORMAT}, specmod.SCHEMA)


def test_a_corrupt_database_entry_is_skipped_and_reported(tmp_path):
    """A shared database whose entries are junk: undecodable ones are
    skipped with a warning, decodable junk replays through the strategy (so
    it can only yield valid specs); the test runs to the end."""
    from hypothesis.database import ExampleDatabase

    from etprop.commands.database import ScreenedDatabase, UndecodableEntry, open_database
    from etprop.strategies.programs import programs

    class Junk(ExampleDatabase):
        def fetch(self, key):
            yield from (b"\xff\xff\xff\xff", bytes(range(256)), b"\x1f", b"")

        def save(self, key, value):
            pass

        def delete(self, key, value):
            pass

    assert isinstance(open_database(str(tmp_path / "db"), None, tmp_path), ScreenedDatabase)
    database = ScreenedDatabase(Junk())
    seen = []

    @settings(max_examples=5, deadline=None, database=database, suppress_health_check=list(HealthCheck))
    @given(programs(min_nodes=2, max_nodes=6))
    def drawn(spec):
        specmod.validate(spec)
        seen.append(spec)

    with pytest.warns(UndecodableEntry, match="skipped 2 entries that do not decode"):
        drawn()
    assert seen and database.skipped >= 2
