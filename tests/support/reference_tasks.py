"""A task folder around a reference written in a test: what the offline brain's family tests read and evaluate."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from tpu_runner.tasks import Task, load_task


def reference_task(root: Path, name: str, reference: str, *, description: str, atol: float = 2.0e-2,
                   rtol: float = 2.0e-2) -> Task:
    path = root / name
    path.mkdir()
    (path / "reference.py").write_text(reference)
    (path / "kernel_task.yaml").write_text(f"task_id: {name}\ndescription: {description}\n"
                                           f"atol: {atol!r}\nrtol: {rtol!r}\n")
    return load_task(path)


def load_module(path: Path) -> ModuleType:
    """A Python file (a reference, a written kernel) imported as a module of its own, to call it directly."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
