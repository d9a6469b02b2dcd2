"""Repro files: a failing example as data (JSON) and as a standalone script.

The JSON holds the spec, the flow and the property, plus the versions that
produced it; ``etprop repro FILE`` replays it. A repro file is untrusted input
(it travels between machines and is edited by hand): ``read`` checks it
against the published schema, the spec's semantics and size limits, and its
shapes on the meta device, before anything is built. The script is the builder's
generated program source followed by the flow's lowering recipe and an eager
comparison, runnable with torch and executorch alone for stock flows.
Writes are atomic (temp file + rename) so a crash never leaves half a file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Optional

from etprop.program import spec as specmod
from etprop.program.builder import check_shapes, render_source
from etprop.errors import UsageError

FORMAT = "etprop-repro/1"
# The published JSON Schema of repro files (etprop/program/schemas).
SCHEMA = "etprop-repro-1.schema.json"


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("etprop", "torch", "executorch", "coreai-torch", "coreai-core"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            pass
    return found


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write(path: Path, spec: dict, flows: list[str], prop: str, outcome: Optional[str] = None,
          message: str = "", script: bool = True, script_flow: Optional[str] = None) -> Path:
    """Write ``path`` (JSON) and, beside it, the standalone ``.py`` script
    lowering ``script_flow`` (default: the last flow)."""
    record = {"format": FORMAT, "property": prop, "flows": flows, "outcome": outcome,
              "message": message, "versions": versions(), "spec": spec}
    atomic_write(path, json.dumps(record, indent=1, sort_keys=True))
    if script:
        atomic_write(path.with_suffix(".py"), standalone_script(spec, script_flow or flows[-1]))
    return path


def read(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"repro file '{path}' does not exist")
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UsageError(f"repro file '{path}' is not valid JSON ({exc.msg}, line {exc.lineno}); "
                         "it may be truncated: take it again from the campaign's artifacts") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise UsageError(f"'{path}' is not an etprop repro (format {record.get('format') if isinstance(record, dict) else None!r}, "
                         f"expected {FORMAT!r})")
    try:
        specmod.check_schema(record, SCHEMA)
        specmod.validate(record["spec"])
        check_shapes(record["spec"])
    except UsageError as exc:
        raise type(exc)(f"repro file '{path}': {exc}") from None
    return record


def version_drift(record: dict) -> list[str]:
    """Packages whose version differs from the ones that made the repro."""
    now = versions()
    return [f"{name} {old} (repro) vs {now.get(name, 'absent')} (here)"
            for name, old in record.get("versions", {}).items()
            if name != "etprop" and now.get(name) != old]


_SCRIPT_TAIL = '''
import copy

# ---- lowering recipe of flow {flow!r} ----
{recipe}

# ---- etprop's tolerance policy: oracles/tolerance.py verbatim ----
{policy}

# ---- the program again, every value jittered by one ulp: what the policy measures sensitivity with ----
_JITTERED_SOURCE = {jittered}

# ---- run and compare with eager ----

class _Method(nn.Module):
    def __init__(self, program, name):
        super().__init__()
        self.program, self.name = program, name

    def forward(self, *args):
        return getattr(self.program, self.name)(*args)


def main():
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    from types import SimpleNamespace

    program = Program().eval()
    program64 = copy.deepcopy(program).double()
    variant = {{}}
    exec(compile(_JITTERED_SOURCE, "<jittered program>", "exec"), variant)
    jittered = variant["Program"]().eval()
    exported = {{name: torch.export.export(_Method(program, name),
                  tuple(make_input(tuple(i["shape"]), i["dtype"], "normal", k) for k, i in enumerate(inputs)),
                  strict=False) for name, inputs in INPUTS.items()}}
    edge = to_edge_transform_and_lower(exported, partitioner=partitioners() or None,
                                       transform_passes=transform_passes() or None,
                                       compile_config=compile_config())
    print(edge.exported_program(next(iter(INPUTS))).graph_module.graph)
    mutable = {mutable!r}
    config = ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(mutable)] if mutable else [])
    pte = edge.to_executorch(config).buffer
    run = make_runner(pte, edge)
    failed = False
    for name, inputs in INPUTS.items():
        for kind in ("normal", "negative", "zeros", "large", "small"):
            args = tuple(make_input(tuple(i["shape"]), i["dtype"], kind, k)
                         for k, i in enumerate(inputs))
            state = {{key: value.clone() for key, value in program.state_dict().items()}}
            with torch.no_grad():
                want = list(getattr(program, name)(*args))
                wide = list(getattr(program64, name)(*(a.double() for a in args)))
            runs = variant["_jittered_runs"](jittered, state, name, args, op_ulps({runtime!r}, {dtype!r}),
                                             {{c: getattr(program, c) for c in {constants!r}}})
            got = run(name, args)
            judgement = judge(SimpleNamespace(expected=want, wide=wide, jittered=runs), got, {runtime!r})
            if judgement.unstable:
                print(f"{{name}} {{kind}}: {{judgement.unstable}} unstable elements")
            if judgement.problem:
                failed = True
                print(f"MISMATCH {{name}} {{kind}}: {{judgement.problem}}")
    print("VERDICT:", "mismatch" if failed else "pass")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
'''

STOCK_RUNNER = '''
def make_runner(pte, edge):
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(pte)  # keep `pte` referenced: 1.5.1 does not
    return lambda name, args: list(program.load_method(name).execute(list(args)))
'''


def standalone_script(spec: dict, flow_name: str) -> str:
    from etprop import flows

    flow = flows.get(flow_name)
    recipe = flow.repro_recipe + (STOCK_RUNNER if flow.runtime == "executorch" else "")
    header = (f'"""Standalone repro made by etprop: flow {flow_name!r}.\n\n'
              "Run: python THIS_FILE. Prints the lowered graph and a verdict; exits 1 on mismatch.\n"
              '"""\n')
    mutable = [n for n, e in spec["state"].items() if e["kind"] == "buffer" and e.get("mutable")]
    return header + render_source(spec) + _SCRIPT_TAIL.format(
        flow=flow_name, recipe=recipe, mutable=mutable, policy=_policy_source(), dtype=spec.get("dtype", "float32"),
        runtime=flow.runtime, constants=[n for n, e in spec["state"].items() if e["kind"] == "constant"],
        jittered=_quoted(render_source(spec, jitter=True)))


def _policy_source() -> str:
    """oracles/tolerance.py as script text (it imports only torch)."""
    import inspect

    from etprop.oracles import tolerance

    return inspect.getsource(tolerance).replace("from __future__ import annotations\n", "")


def _quoted(source: str) -> str:
    return f"'''{source}'''" if "'''" not in source and "\\" not in source else repr(source)
