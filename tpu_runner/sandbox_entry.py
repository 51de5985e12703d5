"""First code a sandboxed child runs: apply its limits while it is still one thread, then run the stage code.

`python -m tpu_runner.sandbox_entry LIMITS_JSON MODULE|SCRIPT.py ARGS...`. Kept free of heavy imports so the limits
and the network namespace are in place before JAX, libtpu or any candidate code is loaded.
"""

from __future__ import annotations

import json
import os
import resource
import runpy
import sys


def apply_limits(limits: dict[str, int]) -> list[str]:
    notes = []
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 5))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        os.unshare(os.CLONE_NEWNET)  # a namespace with no interfaces but a down loopback: no network
    except (AttributeError, OSError) as exc:
        notes.append(f"network isolation unavailable here ({exc}); imports of network modules are still refused")
    return notes


def main() -> None:
    limits = json.loads(sys.argv[1])
    notes = apply_limits(limits)
    if notes:
        print("sandbox: " + "; ".join(notes), file=sys.stderr)
    target = sys.argv[2]
    sys.argv = [target, *sys.argv[3:]]
    if target.endswith(".py"):  # a script path (the sandbox's own tests use this)
        runpy.run_path(target, run_name="__main__")
    else:
        runpy.run_module(target, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
