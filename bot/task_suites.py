"""Where tasks come from for every surface: the repository's `tasks/` and the suites a team configures."""

from __future__ import annotations

from pathlib import Path

from tpu_runner.tasks import discover_tasks

SOURCE_ROOT = Path(__file__).resolve().parent.parent  # pyproject.toml, tasks/ (an editable install)
REPO_TASKS = SOURCE_ROOT / "tasks"


def suite_tasks(suites: list[Path]) -> dict[str, Path]:
    """Task name -> directory (or module file), over `tasks/` and the configured suites (a later suite overrides an
    earlier). A KernelBench-style module is named by its file's stem, as `/kernel new 19_Gemm_ReLU` asks for it."""
    found: dict[str, Path] = {}
    for suite in [REPO_TASKS, *suites]:
        if not suite.is_dir():  # the pasted-tasks folder before anything was pasted
            continue
        for task_dir in discover_tasks(suite):
            found[task_dir.stem if task_dir.suffix == ".py" else task_dir.name] = task_dir
    return found
