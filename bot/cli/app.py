"""`kernelbot`: the Typer app, wiring one command group per module; errors become one line with the next step."""

from __future__ import annotations

import os

import typer

from bot.cli import agents, config, doctor, evaluate, port, queue, search, serve
from storage.logs import configure_logging
from storage.settings import SettingsError, load_settings

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Agents that write and tune TPU kernels in JAX Pallas: the evaluator, the agents, the runner "
                  "fleet and the Slack bot.")
for group in (evaluate, agents, search, queue, serve, doctor, config, port):
    group.register(app)


def main() -> None:
    # This process never runs on a TPU: the chip has one holder at a time, and the evaluator's children that run
    # on it get their own environment. Set before anything imports JAX.
    os.environ["JAX_PLATFORMS"] = "cpu"
    try:
        configure_logging(load_settings())
    except SettingsError:
        configure_logging(None)  # the command itself says what is wrong with the settings
    app()
