"""A task folder around a reference written in a test: what the offline brain's family tests read and evaluate."""

from __future__ import annotations

from pathlib import Path

from tpu_runner.tasks import Task, load_task


def reference_task(root: Path, name: str, reference: str, *, description: str, atol: float = 2.0e-2,
                   rtol: float = 2.0e-2) -> Task:
    path = root / name
    path.mkdir()
    (path / "reference.py").write_text(reference)
    (path / "kernel_task.yaml").write_text(f"task_id: {name}\ndescription: {description}\n"
                                           f"atol: {atol!r}\nrtol: {rtol!r}\n")
    return load_task(path)
