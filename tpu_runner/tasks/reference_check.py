"""Check a reference someone pasted before a session starts on it, and put its task where `/kernel new` finds it.

The reference is untrusted code: it runs only in a sandboxed child (`tpu_runner.tasks.check_child`: limits, a
scratch directory, an environment without secrets, no network), never in this process. The child imports it,
traces `get_inputs` to shapes, traces `computation` on them and runs it on `get_test_inputs()` if there are any.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from storage.settings import EvalLimits, Settings
from tpu_runner.sandbox import ChildOutcome, run_one_shot
from tpu_runner.tasks.task import TaskError

TASK_FILES = ("reference.py", "kernel_task.yaml")
CHECK_SECONDS = 60
CHECK_MEMORY_MIB = 4096


@dataclass(frozen=True)
class ReferenceCheck:
    ok: bool
    shapes: tuple[str, ...] = ()  # per configuration of get_inputs(): its arguments, e.g. "float32[64,128], 2.0"
    outputs: tuple[str, ...] = ()  # per configuration: what computation returns, e.g. "float32[64,128]"
    error: str | None = None  # one message for a person, starting "Line N: " when the reference's line is known
    line: int | None = None
    tested: int = 0  # get_test_inputs() configurations computation ran on
    notes: tuple[str, ...] = ()


def _stopped(outcome: ChildOutcome, wall_seconds: int, memory_mib: int) -> str:
    stop = outcome.why_stopped(wall_seconds=wall_seconds, memory_mib=memory_mib, doing="starting Python and JAX",
                               tail_lines=8)
    if stop.kind == "timeout":
        return (f"The reference {stop.how} (it was in {stop.doing}). Build inputs with "
                "jax.random rather than Python loops, and keep get_test_inputs() small.")
    if stop.kind == "memory_limit":
        return (f"The reference {stop.how} in {stop.doing} and was stopped. "
                "Keep get_test_inputs() small; get_inputs() is only traced unless it needs host-side code.")
    return f"The check of the reference {stop.how} in {stop.doing} without a result.\n{stop.tail[-1200:]}".strip()


def check_reference(task_dir: Path, settings: Settings, *, wall_seconds: int = CHECK_SECONDS,
                    memory_mib: int = CHECK_MEMORY_MIB) -> ReferenceCheck:
    """Import and trace the task's reference in a sandboxed child within `wall_seconds` and `memory_mib`."""
    limits = EvalLimits(wall_seconds=wall_seconds, cpu_seconds=max(30, 2 * wall_seconds), memory_mib=memory_mib,
                        output_bytes=settings.limits.output_bytes)
    outcome, report = run_one_shot(module="tpu_runner.tasks.check_child", root=settings.sandbox_dir,
                                   prefix="reference", limits=limits, report_name="reference_check.json",
                                   request_for=lambda _: {"task_dir": str(Path(task_dir).resolve())})
    if report is None:
        return ReferenceCheck(ok=False, error=_stopped(outcome, wall_seconds, memory_mib))
    return ReferenceCheck(ok=bool(report["ok"]), shapes=tuple(report["shapes"]), outputs=tuple(report["outputs"]),
                          error=report["error"], line=report["line"], tested=int(report["tested"]),
                          notes=tuple(report["notes"]))


# --- task directories from their files ------------------------------------------------------------------------


def files_digest(files: Mapping[str, str]) -> str:
    """The digest `load_task` gives a task with these files (`Task.digest`)."""
    return hashlib.sha256(files["reference.py"].encode() + b"\0" + files["kernel_task.yaml"].encode()).hexdigest()[:16]


def read_task_files(task_dir: Path | None) -> dict[str, str] | None:
    """reference.py and kernel_task.yaml of a task directory, or None where there is none."""
    if task_dir is None:
        return None
    try:
        return {name: (task_dir / name).read_text() for name in TASK_FILES}
    except (OSError, UnicodeDecodeError):
        return None


def write_task(files: Mapping[str, str], dest: Path) -> Path:
    """Put a task's files at `dest` at once (written beside it, then renamed), so nobody reads half a task.

    A `dest` that already holds the same files is kept; one with other files raises TaskError."""
    missing = [name for name in TASK_FILES if name not in files]
    if missing:
        raise TaskError(f"a task needs {', '.join(TASK_FILES)}; {', '.join(missing)} missing")
    if dest.is_dir():
        if read_task_files(dest) == {name: files[name] for name in TASK_FILES}:
            return dest
        raise TaskError(f"a different task already lives at {dest}; choose another name")
    # Written one level down, so that a suite listing never sees the half-written directory as a task.
    staging = dest.parent / ".incoming" / f"{dest.name}-{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    try:
        for name in TASK_FILES:
            (staging / name).write_text(files[name])
        try:
            staging.rename(dest)
        except OSError:  # someone else put a task there first
            if read_task_files(dest) == {name: files[name] for name in TASK_FILES}:
                return dest
            raise TaskError(f"a different task was just put at {dest}; choose another name") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(staging)
    return dest


@dataclass(frozen=True)
class AddedTask:
    check: ReferenceCheck
    task_dir: Path | None  # where the task lives now; None when the check failed (nothing was left behind)


def add_checked_task(files: Mapping[str, str], *, dest: Path, settings: Settings,
                     wall_seconds: int = CHECK_SECONDS) -> AddedTask:
    """Check the reference in a staging directory and, only if it passes, put the task at `dest`.

    Raises TaskError when `dest` holds a different task (someone took the name meanwhile)."""
    staging_root = settings.home / "staging"
    staging = staging_root / f"{dest.name}-{uuid.uuid4().hex[:10]}"
    staging.mkdir(parents=True)
    try:
        for name in TASK_FILES:
            (staging / name).write_text(files[name])
        check = check_reference(staging, settings, wall_seconds=wall_seconds)
        if not check.ok:
            return AddedTask(check=check, task_dir=None)
        return AddedTask(check=check, task_dir=write_task(files, dest))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
