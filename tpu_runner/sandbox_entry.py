"""First code a sandboxed child runs: apply its limits while it is still one thread, then run the stage code.

`python -m tpu_runner.sandbox_entry LIMITS_JSON MODULE|SCRIPT.py`, then one line of JSON arguments on stdin.
Kept free of heavy imports so the limits and the network namespace are in place before JAX, libtpu or any
candidate code is loaded; the module is imported before its arguments arrive, so a spare starts at once.
"""

from __future__ import annotations

import importlib
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
    # Import the stage code now, then wait: a spare child is ready the moment its request arrives.
    module = None if target.endswith(".py") else importlib.import_module(target)
    line = sys.stdin.readline()
    if not line:
        return  # discarded unused
    sys.argv = [target, *json.loads(line)]
    if module is None:  # a script path (the sandbox's own tests use this)
        runpy.run_path(target, run_name="__main__")
    else:
        sys.exit(module.main(sys.argv))


if __name__ == "__main__":
    main()
