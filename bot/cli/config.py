"""`kernelbot config`: every setting with the value in force and where it came from (secrets masked)."""

from __future__ import annotations

import json
import os
from typing import Annotated

import typer
from rich.table import Table

from bot.cli.common import AsJson, console, run_command

_app = typer.Typer()


def register(app: typer.Typer) -> None:
    for command in _app.registered_commands:
        app.registered_commands.append(command)


def shown(value: str, secret: bool) -> str:
    """What may be printed of a value: a secret's first four characters only."""
    return f"{value[:4]}… (set)" if secret and value else value


@_app.command("config")
def config_command(
    as_json: AsJson = False,
    check: Annotated[bool, typer.Option("--check", help="Only check that the settings load (exit 2 if not).")]
    = False,
) -> None:
    """Every setting with the value in force and where it came from (environment, config file, default)."""

    def run() -> int:
        from storage.settings import VARIABLES, config_values, in_force, load_settings

        settings = load_settings()  # a wrong value stops here, naming the setting
        if check:
            console.print(f"settings load{f' (with {settings.config_file})' if settings.config_file else ''}")
            return 0
        from_file = config_values(settings.config_file) if settings.config_file else {}
        values = in_force(settings)
        rows = []
        for v in VARIABLES:
            if os.environ.get(v.name):
                source = "environment"
            elif v.name in from_file:
                source = str(settings.config_file)
            else:
                source = f"default: {v.default}"
            value = values[v.name] if v.name in values else shown(os.environ.get(v.name) or
                                                                   from_file.get(v.name, ""), v.secret)
            rows.append({"name": v.name, "value": value, "source": source,
                         "choices": list(v.choices)})
        if as_json:
            print(json.dumps(rows, indent=1))
            return 0
        table = Table(title="kernelbot settings", pad_edge=False)
        table.add_column("setting", no_wrap=True)
        for column in ("value", "from"):
            table.add_column(column, overflow="fold")
        for row in rows:
            choices = f" (one of {', '.join(row['choices'])})" if row["choices"] else ""
            table.add_row(row["name"], row["value"], row["source"] + choices)
        console.print(table)
        return 0

    run_command(run, as_json=as_json)
