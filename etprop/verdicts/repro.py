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

from etprop.errors import UsageError, parse_json
from etprop.program import spec as specmod
from etprop.program.builder import check_shapes, render_source

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


def write(
    path: Path,
    spec: dict,
    flows: list[str],
    prop: str,
    outcome: Optional[str] = None,
    message: str = "",
    script: bool = True,
    script_flow: Optional[str] = None,
    shrink: Optional[dict] = None,
) -> Path:
    """Write ``path`` (JSON) and, beside it, the standalone ``.py`` script
    lowering ``script_flow`` (default: the last flow). ``shrink``: how the
    spec was shrunk (whether it is 1-minimal)."""
    record = {
        "format": FORMAT,
        "property": prop,
        "flows": flows,
        "outcome": outcome,
        "message": message,
        "versions": versions(),
        "spec": spec,
    }
    if shrink is not None:
        record["shrink"] = shrink
    atomic_write(path, json.dumps(record, indent=1, sort_keys=True))
    if script:
        atomic_write(path.with_suffix(".py"), standalone_script(spec, script_flow or flows[-1]))
    return path


def read(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"repro file '{path}' does not exist")
    record = parse_json(
        path.read_bytes(),
        f"repro file '{path}'",
        "it may be truncated or not a repro: take it again from the campaign's artifacts",
    )
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise UsageError(
            f"'{path}' is not an etprop repro (format {record.get('format') if isinstance(record, dict) else None!r}, "
            f"expected {FORMAT!r})"
        )
    check_record(record, str(path))
    return record


def check_record(record, where: str) -> None:
    """The published schema, the spec's semantics and size limits, and its
    shapes on the meta device; UsageError naming ``where`` otherwise."""
    try:
        specmod.check_schema(record, SCHEMA)
        specmod.validate(record["spec"])
        check_shapes(record["spec"])
    except UsageError as exc:
        raise type(exc)(f"repro file '{where}': {exc}") from None


def check_flows(record: dict, where: str) -> None:
    """Every flow the record names is registered here (UsageError naming the
    unknown one and the known ones otherwise)."""
    from etprop import flows

    for name in record["flows"]:
        try:
            flows.get(name)
        except UsageError as exc:
            raise UsageError(f"repro file '{where}': {exc}") from None


def version_drift(record: dict) -> list[str]:
    """Packages whose version differs from the ones that made the repro."""
    now = versions()
    return [
        f"{name} {old} (repro) vs {now.get(name, 'absent')} (here)"
        for name, old in record.get("versions", {}).items()
        if name != "etprop" and now.get(name) != old
    ]


_SCRIPT_TAIL = """
import base64
import io
import sys
import traceback
from types import SimpleNamespace

# ---- lowering recipe of flow {flow!r} ----
{recipe}

# ---- etprop's tolerance policy: oracles/tolerance.py verbatim ----
{policy}

# ---- what etprop computed, embedded: for each (method, input kind) in the oracle's
# order, the inputs, the expected outputs (eager in the program's dtype), a float64
# run and the jittered eager runs the bound is built from (torch.save, base64) ----
RUNTIME = {runtime!r}
DYNAMIC = {dynamic!r}
MUTABLE = {mutable!r}
QUANTIZATION = {quantization!r}
CASES = (
{cases}
)


class _Method(nn.Module):
    def __init__(self, program, name):
        super().__init__()
        self.program, self.name = program, name

    def forward(self, *args):
        return getattr(self.program, self.name)(*args)


def _verdict(outcome, detail=""):
    print("VERDICT:", outcome + (": " + detail if detail else ""))
    raise SystemExit(0 if outcome == "pass" else 1)


def _dynamic_shapes(name):
    if not DYNAMIC.get(name):
        return None
    return (tuple({{dim: torch.export.Dim(f"{{name}}_{{k}}_d{{dim}}", min=low, max=high)
                   for dim, low, high in dims}} or None for k, dims in enumerate(DYNAMIC[name])),)


def main():
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    cases = torch.load(io.BytesIO(base64.b64decode("".join(CASES))), weights_only=True) if CASES else []
    first = {{}}
    for name, kind, inputs, *_ in cases:
        first.setdefault(name, tuple(inputs))
    for name, inputs in INPUTS.items():  # no cases embedded: etprop could not quantize the program
        first.setdefault(name, tuple(
            make_input(tuple(inp["shape"]), inp.get("dtype", "float32"), "normal", index, inp.get("high"))
            for index, inp in enumerate(inputs)))
    program = Program().eval()

    def method_module(name):
        if QUANTIZATION is None:
            return _Method(program, name)
        # The quantized (Q/DQ) program, by the steps etprop took (quantize_pt2e above).
        calibration = calibration_inputs(INPUTS[name], QUANTIZATION.get("calibration", 1))
        source = fold_computed_weights(Program().eval()) if QUANTIZATION.get("fold_computed_weights") else program
        return _Method(quantize_pt2e(_Method(source, name), first[name], calibration, QUANTIZATION["scheme"],
                                     QUANTIZATION.get("modules"), _dynamic_shapes(name)), "forward")

    if QUANTIZATION is not None:
        try:
            modules = {{name: method_module(name) for name in first}}
        except Exception as exc:
            traceback.print_exc()
            _verdict("quantization error", f"{{type(exc).__name__}}: {{exc}}")
        method_module = modules.__getitem__
    try:
        exported = {{name: torch.export.export(method_module(name), first[name],
                                              dynamic_shapes=_dynamic_shapes(name), strict=False)
                    for name in first}}
    except Exception as exc:
        if QUANTIZATION is not None:  # the float program exported: PT2E made one torch.export rejects
            _verdict("quantization error", f"the converted (Q/DQ) program does not export: "
                                           f"{{type(exc).__name__}}: {{exc}}")
        _verdict("export error", f"{{type(exc).__name__}}: {{exc}}")
    try:
        edge = to_edge_transform_and_lower(exported, partitioner=partitioners() or None,
                                           transform_passes=transform_passes() or None,
                                           compile_config=compile_config())
        print(edge.exported_program(next(iter(first))).graph_module.graph)
        config = ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(MUTABLE)] if MUTABLE else [])
        manager = edge.to_executorch(config)
        pte = manager.buffer
    except Exception as exc:
        traceback.print_exc()
        _verdict("lowering error", f"{{type(exc).__name__}}: {{exc}}")
    try:
        run = make_runner(pte, manager)
    except Exception as exc:
        _verdict("load error", f"{{type(exc).__name__}}: {{exc}}")
    unstable = 0
    for name, kind, inputs, expected, wide, jittered, directional, flips in cases:
        try:
            got = run(name, tuple(inputs))
        except Exception as exc:
            _verdict("run error", f"method '{{name}}' failed on {{kind}} inputs: {{type(exc).__name__}}: {{exc}}")
        judgement = judge(SimpleNamespace(expected=expected, wide=wide, jittered=jittered, directional=directional,
                                          flips=flips), got,
                          RUNTIME)
        unstable += judgement.unstable
        if judgement.problem:
            _verdict("mismatch", f"method '{{name}}', {{kind}} inputs: {{judgement.problem}}")
    print(f"{{len(cases)}} (method, input) pairs match ({{unstable}} unstable elements)")
    _verdict("pass")


if __name__ == "__main__":
    main()
"""

STOCK_RUNNER = """
def make_runner(pte, program):
    from executorch.runtime import Runtime

    loaded = Runtime.get().load_program(pte)  # keep `pte` referenced: 1.5.1 does not
    return lambda name, args: list(loaded.load_method(name).execute(list(args)))
"""

_STANDALONE_DOC = '''"""Standalone repro made by etprop: flow {flow!r}.

Needs torch and executorch only (a candidate flow also imports its add-on; Core AI flows
import etprop's Core AI bridge, as ExecuTorch's runtime has no Core AI backend). Rebuilds
the program, lowers it with the flow's recipe, runs it on the inputs etprop used and judges
each output against the expected values embedded below with etprop's tolerance policy.
Prints the lowered graph and 'VERDICT: <outcome>'; exits 1 unless the verdict is pass.
"""
'''

_ETPROP_SCRIPT = '''"""etprop repro script for {name}: replays the embedded repro in etprop's isolated
worker, judged by the suite's oracles, tolerance and attribution. Needs etprop installed.
Exits 1 while the defect is present, 0 once it is gone.
"""

import json
import sys
import tempfile
from pathlib import Path

RECORD = json.loads({record})

if __name__ == "__main__":
    from etprop.commands.replay import replay_record

    outcome = replay_record(RECORD, {name!r}, Path(tempfile.mkdtemp(prefix="etprop-script-")), verbose=True)
    sys.exit(1 if outcome.still_failing else 0)
'''


def _embedded_cases(spec: dict, runtime: str) -> str:
    """The equivalence oracle's own cases and references, so the script
    judges the very numbers the suite judged (oracles/equivalence.py)."""
    import base64
    import io

    import torch

    from etprop.oracles import equivalence, tolerance
    from etprop.program import builder
    from etprop.program.quantize import QuantizationFailed

    try:
        built = builder.build(spec)
    except QuantizationFailed:
        return ""  # the script stops where etprop did, at the quantization
    sequence = built.stateful and runtime == "executorch"
    ulps = tolerance.op_ulps(runtime, spec.get("dtype", "float32"))
    cases = []
    built.reset_state()
    for method, kind, inputs in equivalence.cases(built, sequence=sequence):
        reference = built.reference(method, inputs, restore=not sequence, ulps=ulps)
        cases.append(
            (
                method,
                kind,
                list(inputs),
                reference.expected,
                reference.wide,
                reference.jittered,
                reference.directional,
                reference.flips,
            )
        )
    built.reset_state()
    buffer = io.BytesIO()
    torch.save(cases, buffer)
    text = base64.b64encode(buffer.getvalue()).decode("ascii")
    return "\n".join(f"    {text[i : i + 100]!r}," for i in range(0, len(text), 100))


def standalone_script(spec: dict, flow_name: str) -> str:
    from etprop import flows

    flow = flows.get(flow_name)
    recipe = flow.repro_recipe + (STOCK_RUNNER if flow.runtime == "executorch" else "")
    mutable = [n for n, e in spec["state"].items() if e["kind"] == "buffer" and e.get("mutable")]
    dynamic = {
        name: [inp.get("dynamic", []) for inp in body["inputs"]]
        for name, body in spec["methods"].items()
        if any(inp.get("dynamic") for inp in body["inputs"])
    }
    return (
        _STANDALONE_DOC.format(flow=flow_name)
        + render_source(spec)
        + _SCRIPT_TAIL.format(
            flow=flow_name,
            recipe=recipe,
            mutable=mutable,
            quantization=spec.get("quantization"),
            policy=_policy_source(),
            runtime=flow.runtime,
            dynamic=dynamic,
            cases=_embedded_cases(spec, flow.runtime),
        )
    )


def etprop_script(record: dict, name: str) -> str:
    """A script replaying ``record`` through etprop, judged exactly as the
    suite judges (same oracles, tolerance and attribution); needs etprop."""
    return _ETPROP_SCRIPT.format(name=name, record=repr(json.dumps(record, sort_keys=True)))


def _policy_source() -> str:
    """oracles/tolerance.py as script text (it imports only torch)."""
    import inspect

    from etprop.oracles import tolerance

    return inspect.getsource(tolerance).replace("from __future__ import annotations\n", "")
