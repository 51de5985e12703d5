"""This host's TPU chip: one holder at a time, and who holds it.

libtpu lets one process open a chip; a second one fails at once ("Internal error when accessing libtpu
multi-process lockfile"). kernelbot's processes that run on the chip - the candidate's child, the reference's
child, doctor's probe - first take a host-wide file lock (`hold`), so they wait their turn instead of failing; the
lock is released by the kernel when its holder exits, however it exits (an abort or a kill included). Runners on
one host share the chip this way. A process outside kernelbot that holds the chip is named (`holders`), never
waited for silently. Only the standard library here: the children take the lock before importing JAX.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from storage.errors import KernelbotError
from storage.settings import EvalLimits

LOCK_PATH = Path("/tmp/kernelbot-tpu.lock")  # beside libtpu's own lockfile: one per host
LIBTPU_LOCKFILE = Path("/tmp/libtpu_lockfile")  # libtpu's: taken by the process that opens the chip
LIBTPU_LOGS = Path("/tmp/tpu_logs")  # where libtpu writes its logs
LIBTPU_BUSY = "libtpu multi-process lockfile"  # what libtpu says when another process has the chip
# A process that opens a TPU holds host memory of its own before any work (seen on a v5e host: ~4 GiB of pinned
# transfer buffer and ~1.6 GiB of runtime, beside the 8 GiB of the chip's memory mapped into it, which
# `sandbox.rss_mib` does not count), so a child on the chip may use this much more than the evaluation's limit.
CHIP_MEMORY_MIB = 16384
QUEUED_STAGE = "queued"  # the stage a child reports while it waits for the chip; not counted against its wall limit
_CHIP_FILE = re.compile(r"^/dev/(accel\d+|vfio/\d+)$")
_POLL_SECONDS = 0.2



def with_chip_memory(limits: EvalLimits) -> EvalLimits:
    """The limits of a child that opens the chip (its hold on the chip is resident memory beyond the evaluation's),
    and of a chip host's float64 runs of a reference at production shapes (reference.store)."""
    return replace(limits, memory_mib=limits.memory_mib + CHIP_MEMORY_MIB)

class ChipBusy(KernelbotError, RuntimeError):
    """The chip is held by another process and was not free in time."""
    next_step = ("run it again once the TPU is free, or with KERNELBOT_TPU=off to check it in interpret mode and "
                 "estimate its time")


@dataclass(frozen=True)
class Holder:
    pid: int
    command: str

    def describe(self) -> str:
        return f"pid {self.pid} ({self.command[:120]})" if self.command else f"pid {self.pid}"


def holders(proc: Path = Path("/proc"), *, exclude: int | None = None) -> list[Holder]:
    """Processes with a TPU device file open (/dev/accelN, /dev/vfio/N). Those of other users cannot be read and
    are not listed."""
    found = []
    for entry in proc.glob("[0-9]*"):
        pid = int(entry.name)
        if pid == (exclude if exclude is not None else os.getpid()):
            continue
        try:
            links = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:
            continue
        if any(_CHIP_FILE.match(link) for link in links):
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                command = ""
            found.append(Holder(pid, command))
    return sorted(found, key=lambda h: h.pid)


def busy_message(found: list[Holder]) -> str:
    """Why the chip cannot be opened, and what to do, for a person."""
    if not found:
        return ("the TPU is held by another process (libtpu's lockfile is taken; the process may belong to another "
                "user); wait for it to finish or stop it, then try again")
    who = ", ".join(h.describe() for h in found)
    return f"the TPU is held by {who}; wait for it to finish or stop it (kill {found[0].pid}), then try again"


def runtime_files() -> tuple[Path, ...]:
    """What a process on the chip writes outside its own directory (libtpu's lockfile and logs), made here first so
    that a sandbox confining writes (Landlock) can let a child on the chip write exactly these; and kernelbot's
    own lock, which a child only opens for reading."""
    for path in (LOCK_PATH, LIBTPU_LOCKFILE):
        if not path.exists():
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_RDONLY | os.O_CREAT, 0o666))
                os.chmod(path, 0o666)  # runners of other users on this host share them
    with contextlib.suppress(OSError):
        LIBTPU_LOGS.mkdir(exist_ok=True)
    return tuple(p for p in (LIBTPU_LOCKFILE, LIBTPU_LOGS) if p.exists())


def try_hold(path: Path = LOCK_PATH) -> int | None:
    """The lock's file descriptor when it was free (kept open: the lock lasts while it is), else None."""
    try:
        fd = os.open(path, os.O_RDONLY)  # a child confined by Landlock may read it, not create it
    except FileNotFoundError:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o666)  # runners of other users on this host share the lock
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


def hold(*, on_wait: Callable[[], None] | None = None, timeout: float | None = None,
         path: Path = LOCK_PATH) -> int:
    """Wait for the chip's lock and take it; `on_wait` is called once if it has to wait. Raises ChipBusy after
    `timeout` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    waited = False
    while True:
        fd = try_hold(path)
        if fd is not None:
            return fd
        if not waited and on_wait is not None:
            on_wait()
        waited = True
        if deadline is not None and time.monotonic() > deadline:
            raise ChipBusy(f"another kernelbot process kept the TPU for more than {timeout:.0f} s")
        time.sleep(_POLL_SECONDS)


def release(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def open_chip() -> str:
    """Open this host's TPU through JAX (the lock held) and return its device kind; ChipBusy, naming the holder, when
    a process outside kernelbot has it."""
    import jax

    try:
        return jax.devices()[0].device_kind
    except RuntimeError as exc:
        if LIBTPU_BUSY in str(exc):
            raise ChipBusy(busy_message(holders())) from None
        raise
