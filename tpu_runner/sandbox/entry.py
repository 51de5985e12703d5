"""First code a sandboxed child runs: apply its limits while it is still one thread, then run the stage code.

`python -m tpu_runner.sandbox.entry LIMITS_JSON MODULE|SCRIPT.py` (`protocol.SandboxLimits`), then one line of
JSON on stdin (`protocol.ChildStart`): the arguments, as a list or as `{"argv": [...], "writable": [...]}`. Kept
free of heavy imports (the protocol's records are plain dataclasses) so the limits and the network namespace are
in place before JAX, libtpu or any candidate code is loaded; the module is imported before its arguments arrive,
so a spare starts at once. Once they arrive, and before any of the code they name
runs, Landlock confines writes to the working directory and the `writable` directories, and - for a child that
runs a candidate's or a task's code - reads to what importing Python, JAX and that code needs: a candidate can
neither touch nor read the database, the caches, the settings or other evaluations' artifacts.
`KERNELBOT_SANDBOX` tells the code what holds.
"""

from __future__ import annotations

import importlib
import os
import resource
import runpy
import sys

from tpu_runner.reports import MEMORY_LIMIT_ENV, ChildStart, SandboxLimits


def die_with_supervisor() -> None:
    """End this process when its supervisor is gone: it runs in a session of its own, so nothing else would, and a
    child on the TPU would keep the chip. (Linux's parent-death signal follows the thread that started the child,
    and the evaluator starts children from worker threads that end first.)"""
    import threading
    import time

    supervisor = os.getppid()

    def watch() -> None:
        while os.getppid() == supervisor:
            time.sleep(1.0)
        os._exit(70)

    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()


def apply_limits(limits: SandboxLimits) -> list[str]:
    notes = []
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 5))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    problem = isolate_network()
    if problem:
        notes.append(f"network isolation unavailable here ({problem}); imports of network modules are still refused")
    return notes


def isolate_network() -> str | None:
    """Enter a network namespace with no interfaces but a down loopback: no network. Root may do so directly; any
    other user (a container's, a systemd unit's) first enters a user namespace of its own, mapped to itself, in
    which it may. Returns why it could not, or None."""
    try:
        os.unshare(os.CLONE_NEWNET)
        return None
    except AttributeError as exc:
        return str(exc)
    except PermissionError:
        pass
    except OSError as exc:
        return str(exc)
    uid, gid = os.getuid(), os.getgid()
    try:
        os.unshare(os.CLONE_NEWUSER | os.CLONE_NEWNET)
    except OSError as exc:
        return f"{exc} (unprivileged user namespaces may be disabled: sysctl kernel.unprivileged_userns_clone)"
    # Keep the same ids inside, so getuid() and file owners look as they did (setgroups must be denied first).
    # Best effort: unmapped, the ids read as the overflow id, and the network is gone all the same.
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    except OSError:
        pass
    return None


def confine(writable: list[str], readable: list[str] | None, listable: list[str]) -> str:
    """Landlock on the given trees; returns what the sandbox holds, for the code to report."""
    from tpu_runner.sandbox.landlock import LandlockUnavailable, restrict_writes

    what = "writes" if readable is None else "writes and reads"
    try:
        abi = restrict_writes(writable, readable, listable)
    except LandlockUnavailable as exc:
        print(f"sandbox: {what} are not confined ({exc})", file=sys.stderr)
        return f"{what} unconfined: {exc}"
    return f"{what} confined (Landlock ABI {abi})"


def main() -> None:
    limits = SandboxLimits.from_json(sys.argv[1])
    notes = apply_limits(limits)
    if limits.memory_mib:
        os.environ[MEMORY_LIMIT_ENV] = str(limits.memory_mib)
    if notes:
        print("sandbox: " + "; ".join(notes), file=sys.stderr)
    target = sys.argv[2]
    # Import the stage code now, then wait: a spare child is ready the moment its request arrives.
    module = None if target.endswith(".py") else importlib.import_module(target)
    line = sys.stdin.readline()
    if not line:
        return  # discarded unused
    start = ChildStart.from_json(line)
    if start.memory_mib:  # the limit of this run, which may be more than the one this child was started with
        os.environ[MEMORY_LIMIT_ENV] = str(start.memory_mib)
    os.environ["KERNELBOT_SANDBOX"] = confine([os.getcwd(), *start.writable], start.readable, start.listable)
    die_with_supervisor()  # after Landlock, which binds only the thread that asks for it and threads started later
    sys.argv = [target, *start.argv]
    if module is None:  # a script path (the sandbox's own tests use this)
        runpy.run_path(target, run_name="__main__")
    else:
        sys.exit(module.main(sys.argv))


if __name__ == "__main__":
    main()
