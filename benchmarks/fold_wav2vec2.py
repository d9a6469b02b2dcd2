"""wav2vec2's positional conv on stock XNNPACK vs xnnpack+fold.

The layer is ``weight_norm(Conv1d(1024, 1024, 128, padding=64, groups=16),
dim=2)`` (synthetic weights) at sequence length 499. Stock executorch 1.5.1
leaves the convolution and its weight-norm computation on portable kernels;
xnnpack+fold folds the weight inside the delegate. Prints the median latency
after warm-up of both lowerings in executorch.runtime, their ratio, the
delegate counts and the .pte sizes.

    python benchmarks/fold_wav2vec2.py [--stock-runs 3] [--fold-runs 20]
"""

from __future__ import annotations

import argparse
import operator
import statistics
import time

import torch
import torch.nn as nn
from torch.nn.utils import parametrizations

import etprop.flows as flows


def positional_conv() -> nn.Module:
    torch.manual_seed(0)
    conv = nn.Conv1d(1024, 1024, 128, padding=64, groups=16)
    return parametrizations.weight_norm(conv, name="weight", dim=2).eval()


def lower(flow_name: str, module: nn.Module, inputs: tuple):
    """(.pte bytes, number of delegates, ops left outside delegates)."""
    from executorch.exir import to_edge_transform_and_lower

    flow = flows.get(flow_name)
    ep = torch.export.export(module, inputs)
    with flow.context():
        edge = to_edge_transform_and_lower(ep, partitioner=flow.partitioners())
        graph = edge.exported_program().graph
        calls = [n.target.__name__ for n in graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
        delegates = calls.count("executorch_call_delegate")
        outside = [c for c in calls if c != "executorch_call_delegate"]
        buffer = edge.to_executorch().buffer
    return buffer, delegates, outside


def median_latency(buffer: bytes, inputs: tuple, warmup: int, runs: int, expected) -> float:
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(buffer)  # ``buffer`` stays referenced by the caller
    method = program.load_method("forward")
    out = None
    for _ in range(warmup):
        out = method.execute(list(inputs))
    torch.testing.assert_close(out[0], expected, rtol=1e-3, atol=1e-3)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        method.execute(list(inputs))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--stock-runs", type=int, default=3)
    parser.add_argument("--fold-runs", type=int, default=20)
    args = parser.parse_args()

    module = positional_conv()
    inputs = (torch.randn(1, 1024, 499),)
    with torch.no_grad():
        expected = module(*inputs)
    rows = {}
    for name, runs in (("xnnpack", args.stock_runs), ("xnnpack+fold", args.fold_runs)):
        start = time.perf_counter()
        buffer, delegates, outside = lower(name, module, inputs)
        lowering = time.perf_counter() - start
        latency = median_latency(buffer, inputs, args.warmup, runs, expected)
        rows[name] = (latency, delegates, len(buffer), lowering, outside)

    print(f"torch {torch.__version__}; {torch.get_num_threads()} threads; input [1, 1024, 499]")
    print(f"{'flow':<14}{'median ms':>12}{'delegates':>11}{'.pte bytes':>14}{'lower s':>9}  outside delegates")
    for name, (latency, delegates, size, lowering, outside) in rows.items():
        left = ", ".join(o.split(".")[-2] for o in outside) or "-"
        print(f"{name:<14}{latency * 1e3:>12.2f}{delegates:>11}{size:>14,}{lowering:>9.1f}  {left}")
    ratio = rows["xnnpack"][0] / rows["xnnpack+fold"][0]
    print(f"speed-up xnnpack -> xnnpack+fold: {ratio:.1f}x")


if __name__ == "__main__":
    main()
