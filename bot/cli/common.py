"""What every command group shares: the consoles, the common options, and the one mapping that turns an error into
one line and the next step (kernelbot's own errors carry theirs)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from storage.errors import KernelbotError
from storage.settings import Settings, SettingsError, load_settings
from tpu_runner.hardware import CHIPS

console = Console()
err_console = Console(stderr=True)

Target = Annotated[str | None, typer.Option("--target", help=f"TPU generation: {', '.join(CHIPS)} (default v6e)")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


def _is(exc: Exception, where: str) -> bool:
    """`exc` is an instance of the class at `where` ("module:Name"). A class whose module was never imported cannot
    have been raised, so that module is not imported to ask: importing the Slack app and the Anthropic SDK only to
    learn that made every failing command seconds slower."""
    module, name = where.split(":")
    kind = getattr(sys.modules.get(module), name, None)
    return isinstance(kind, type) and isinstance(exc, kind)


def _friendly(exc: Exception) -> tuple[str, str] | None:
    """One line and the next step for an error a person can act on; None for one that is kernelbot's fault.
    Kernelbot's own errors carry their next step (`storage.errors`); the rest are the database driver's and the
    built-in lookups and values whose message names the bad input."""
    if isinstance(exc, KernelbotError):
        return str(exc), exc.next_step
    if _is(exc, "sqlalchemy.exc:OperationalError"):
        return (f"cannot use the database: {str(getattr(exc, 'orig', exc)).strip().splitlines()[0]}",
                "check KERNELBOT_DATABASE_URL and that the server is running")
    if isinstance(exc, LookupError):
        return str(exc), "check the id; the session may live in another KERNELBOT_HOME or database"
    if isinstance(exc, ValueError):
        return str(exc), "check the command's options (`kernelbot COMMAND --help`) and the settings it names"
    return None


def _log_unexpected(exc: Exception) -> str:
    """Keep the traceback in the log directory; return an id a person can quote."""
    error_id = uuid.uuid4().hex[:8]
    try:
        log_dir = load_settings().logs_dir
    except SettingsError:
        log_dir = Path(tempfile.gettempdir())
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "errors.log", "a") as f:
        f.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} error {error_id} (argv: {sys.argv[1:]})\n")
        f.write("".join(traceback.format_exception(exc)))
    return f"{error_id} (traceback in {log_dir / 'errors.log'})"


def run_command(fn: Callable[[], int], *, as_json: bool = False) -> None:
    """Run a command's body: its exit code, or a failure as one line and the next step (exit 2) - on stderr, and
    with `as_json` also as a JSON object on stdout, where the command's JSON would have been."""
    try:
        code = fn()
    except typer.Exit:
        raise
    except BrokenPipeError:  # the reader went away (`| head`): nothing more to say, and no one to say it to
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None
    except Exception as exc:
        known = _friendly(exc)
        if known is None:
            if os.environ.get("KERNELBOT_DEBUG"):
                raise
            known = (f"unexpected {type(exc).__name__}: {exc}", f"report error {_log_unexpected(exc)}; "
                     "KERNELBOT_DEBUG=1 shows the traceback here")
        message, hint = known
        err_console.print(f"[red]error:[/red] {message}\n[dim]next: {hint}[/dim]", soft_wrap=True)
        if as_json:
            print(json.dumps({"error": message, "next": hint, "exit_code": 2}, indent=1))
        raise typer.Exit(2) from None
    raise typer.Exit(code)


def get_settings() -> Settings:
    return load_settings()
