"""`kernelbot`: the command line. A thin root that wires commands; errors become one line with the next step."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from storage.settings import Settings, SettingsError, load_settings
from tpu_runner.hardware import CHIPS, UnknownTarget
from tpu_runner.tasks import TaskError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Agents that write and tune TPU kernels in JAX Pallas; this CLI evaluates them.")
console = Console()
err_console = Console(stderr=True)

REPO_TASKS = Path(__file__).resolve().parent.parent / "tasks"
Target = Annotated[str | None, typer.Option("--target", help=f"TPU generation: {', '.join(CHIPS)} (default v6e)")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


def _friendly(exc: Exception) -> tuple[str, str]:
    """One line and the next step, for each kind of bad input."""
    from storage.migrate import SchemaOutdated
    from storage.queue import JobNotFound
    from tpu_runner.evaluate import KernelFileError

    table: list[tuple[type[Exception], str]] = [
        (TaskError, "check the task directory (reference.py + kernel_task.yaml); `kernelbot tasks` lists valid ones"),
        (KernelFileError, "pass the path of a Python file that defines computation(...)"),
        (UnknownTarget, f"use --target with one of {', '.join(CHIPS)}"),
        (SettingsError, "fix the environment variable named above"),
        (SchemaOutdated, "run `kernelbot db upgrade`"),
        (JobNotFound, "`kernelbot jobs` lists the jobs"),
    ]
    for kind, hint in table:
        if isinstance(exc, kind):
            return str(exc), hint
    raise exc


def run_command(fn: Callable[[], int]) -> None:
    try:
        code = fn()
    except (TaskError, UnknownTarget, SettingsError, ValueError, RuntimeError, LookupError) as exc:
        try:
            message, hint = _friendly(exc)
        except Exception:
            if os.environ.get("KERNELBOT_DEBUG"):
                raise
            logging.getLogger("kernelbot").exception("unexpected error")
            err_console.print(f"[red]error:[/red] {type(exc).__name__}: {exc} (set KERNELBOT_DEBUG=1 for a traceback)",
                              soft_wrap=True)
            raise typer.Exit(2) from None
        err_console.print(f"[red]error:[/red] {message}\n[dim]next: {hint}[/dim]", soft_wrap=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


def get_settings() -> Settings:
    return load_settings()


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from bot import cli_eval, cli_queue

    cli_eval.register(app)
    cli_queue.register(app)
    app()


if __name__ == "__main__":
    main()
