"""Runs standalone repro scripts in forks of one warm interpreter.

A standalone script spends about 20 s importing torch, executorch and torchao
and compiling its first export before it lowers a one-node program in 3 s.
This server pays that once: started with ``python -I``, it imports those
packages and lowers one tiny program (never running it: a fork must not
inherit a runtime thread pool), then runs each script it is sent in a fresh
fork, as ``__main__``, with its own working directory and output files. A
fork inherits only the imports and the warm compiler; the scripts share no
state. Torch is held to one thread so no OpenMP pool exists at fork time (a
verdict must not depend on the thread count).

Protocol, one JSON object per line: stdin ``{"script", "cwd", "stdout",
"stderr", "timeout"}``; on the original stdout ``{"returncode"}`` (negative:
killed by that signal) or ``{"returncode", "timed_out": true}``.
"""

import json
import os
import runpy
import signal
import sys
import time


def _warm_up() -> None:
    import torch

    torch.set_num_threads(1)
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime  # noqa: F401  (imported to be inherited)

    try:
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: F401
    except ImportError:
        pass
    try:
        import executorch.backends.apple.coreai  # noqa: F401
    except ImportError:
        pass

    class Tiny(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) + 1

    exported = torch.export.export(Tiny(), (torch.randn(2, 3),))
    to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()]).to_executorch()


def _run_in_child(request: dict) -> None:
    code = 1
    try:
        os.chdir(request["cwd"])
        nothing = os.open(os.devnull, os.O_RDONLY)
        os.dup2(nothing, 0)  # the requests stay the server's
        os.close(nothing)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        sys.argv = [request["script"]]
        try:
            runpy.run_path(request["script"], run_name="__main__")
            code = 0
        except SystemExit as stop:
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001  (reported as an uncaught exception would be)
            import traceback

            traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _wait(pid: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return {"returncode": os.waitstatus_to_exitcode(status)}
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"returncode": -signal.SIGKILL, "timed_out": True}
        time.sleep(0.05)


def main() -> None:
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever the warm-up prints stays off the reply channel
    _warm_up()
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _run_in_child(request)
        replies.write(json.dumps(_wait(pid, request["timeout"])) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
