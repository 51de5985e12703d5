"""`/kernel`: acked at once with an ephemeral answer; a modal the command asks for is opened right after."""

from __future__ import annotations

import logging
from typing import Any

from slack_bolt import Ack, App
from slack_sdk import WebClient

from agents.hitl import DecisionRejected
from agents.search import SearchError
from bot.slack.kernel_commands import KernelCommands, OpenView
from bot.slack.listener_context import BotContext
from bot.slack.slash import UsageError, parse
from tpu_runner.hardware import UnknownTarget
from tpu_runner.tasks import TaskError

log = logging.getLogger("kernelbot.slack")
PEOPLES_ERRORS = (UsageError, TaskError, UnknownTarget, SearchError, DecisionRejected, LookupError, ValueError)


def register(app: App, ctx: BotContext) -> None:
    commands = KernelCommands(ctx)

    @app.command("/kernel")
    def handle_kernel_command(ack: Ack, command: dict[str, Any], client: WebClient) -> None:
        user, channel = command.get("user_id", ""), command.get("channel_id", "")
        try:
            reply = commands.run(parse(command.get("text", "")), user=user, channel=channel)
        except PEOPLES_ERRORS as exc:
            reply = str(exc)
        except Exception as exc:  # noqa: BLE001 - a person gets a sentence, the log gets the traceback
            log.exception("/kernel %r failed", command.get("text"))
            reply = f"Something went wrong on our side ({type(exc).__name__}); it is in kernelbot's log."
        if isinstance(reply, OpenView):
            ack()
            client.views_open(trigger_id=command.get("trigger_id", ""), view=reply.view)
            return
        ack(response_type="ephemeral", text=reply)
