"""A session's task wherever the session runs: its directory when this host has it, else the files the session
carries (a task pasted in Slack or written by `kernelbot port` lives on the host that checked it; a runner on
another host writes the carried files under its own data directory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from storage.models import KernelSession
from tpu_runner.tasks import Task, files_digest, load_task, read_task_files, write_task


def carried_files(task: Task) -> dict[str, str] | None:
    """The files a session carries for its task (None for a task in a format that is not this project's)."""
    return read_task_files(task.path)


def session_task(record: KernelSession, home: Path) -> Task:
    budget: dict[str, Any] = dict(record.budget or {})
    files = budget.get("task_files")
    task_dir = record.task_dir
    if files and not (task_dir and Path(task_dir).is_dir()):
        task_dir = str(write_task(files, home / "tasks" / f"{record.task}-{files_digest(files)}"))
    return load_task(task_dir or "")
