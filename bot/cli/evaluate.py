"""`kernelbot tasks | eval | demo`: the evaluator from a terminal."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated

import typer

from bot.cli import render
from bot.cli.common import AsJson, Target, console, err_console, get_settings, run_command
from bot.cli.progress import Progress
from bot.task_suites import REPO_TASKS
from tpu_runner.tasks import TaskError

_app = typer.Typer()


def register(app: typer.Typer) -> None:
    for command in _app.registered_commands:
        app.registered_commands.append(command)


@_app.command("tasks")
def tasks_command(
    suite: Annotated[list[Path] | None, typer.Option("--suite", help="Task suite directory (repeatable).")] = None,
    target: Target = None,
    as_json: AsJson = False,
) -> None:
    """List tasks with shapes, FLOPs, bytes and roofline class on the target chip."""

    def run() -> int:
        from tpu_runner.compiler import compile_service
        from tpu_runner.evaluation import TaskInfo
        from tpu_runner.evaluation.task_info import task_info
        from tpu_runner.hardware import get_chip
        from tpu_runner.reference import reference_store
        from tpu_runner.tasks import Task, discover_tasks, load_task

        settings = get_settings()
        settings.ensure_dirs()
        chip = get_chip(target or settings.default_target)
        infos = []
        errors: list[str] = []
        dirs = [d for s in (suite or [REPO_TASKS]) for d in discover_tasks(s)]
        workers = min(2, os.cpu_count() or 1)

        # Each reference runs in its sandboxed child and compiles on a compile server (one per worker); on a
        # cold cache that is the slow part (f32 HIGHEST matmuls take ~15 s), so the tasks go in parallel.
        with Progress("tasks", console=err_console) as status, \
                compile_service(root=settings.sandbox_dir, limits=settings.limits,
                                static_profile=settings.static_profile) as compilers, \
                ThreadPoolExecutor(max_workers=workers) as pool:
            loaded: dict[Path, Task | TaskError] = {}
            for d in dirs:
                try:
                    loaded[d] = load_task(d)
                except TaskError as exc:
                    loaded[d] = exc
            store = reference_store(settings)
            status.update(f"reading {len(dirs)} references (one sandboxed process)")
            refused = store.prefetch([t for t in loaded.values() if isinstance(t, Task)])

            def read(d: Path) -> TaskInfo | TaskError:
                task_or_error = loaded[d]
                if isinstance(task_or_error, TaskError):
                    return task_or_error
                if task_or_error.task_id in refused:
                    return refused[task_or_error.task_id]
                try:
                    return task_info(task_or_error, chip, settings, compilers)
                except TaskError as exc:
                    return exc

            for done, (d, read_out) in enumerate(zip(dirs, pool.map(read, dirs), strict=True), start=1):
                status.update(f"read {done}/{len(dirs)} tasks ({d.name}; compiling references for cost analysis)")
                if isinstance(read_out, TaskError):
                    errors.append(str(read_out))
                else:
                    infos.append(read_out)
        if as_json:
            from dataclasses import asdict

            print(json.dumps({"target": chip.name, "tasks": [asdict(i) for i in infos], "errors": errors}, indent=1))
        else:
            console.print(render.tasks_table(infos, chip.name))
            for e in errors:
                err_console.print(f"[yellow]skipped:[/yellow] {e}")
        return 0 if not errors else 1

    run_command(run, as_json=as_json)


@_app.command("eval")
def eval_command(
    task: Annotated[Path, typer.Option("--task", help="Task directory (reference.py + kernel_task.yaml, or a "
                                       "JAXBench workload with baseline.py).")],
    kernel: Annotated[Path, typer.Option("--kernel", help="Candidate module defining computation(...) (or "
                                         "JAXBench's workload(...)).")],
    target: Target = None,
    allow_pure_jax: Annotated[bool, typer.Option("--allow-pure-jax", help="Accept candidates without pallas_call.")]
    = False,
    as_json: AsJson = False,
) -> None:
    """Evaluate one candidate kernel: static, lower, compile, correctness, performance, profile."""

    def run() -> int:
        from tpu_runner.evaluation import EvalRequest
        from tpu_runner.evaluation.evaluate import evaluate

        settings = get_settings()
        request = EvalRequest(task, kernel, target or settings.default_target, allow_pure_jax)
        with Progress(f"evaluating {kernel.name}", console=err_console) as progress:
            result = evaluate(request, settings,
                              on_stage=lambda stage: progress.update(render.STAGE_LABELS.get(stage, stage)))
        if as_json:
            print(json.dumps(result.to_json(), indent=1, default=float))
        else:
            console.print(render.result_panel(result))
        return 0 if result.ok else 1

    run_command(run, as_json=as_json)
