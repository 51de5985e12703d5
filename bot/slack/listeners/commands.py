"""`/kernel`, as a Bolt lazy listener. The ack function acks at once with nothing, so Slack's 3 s deadline never
waits on the database (SQLite queues writers behind one lock); a command that opens a modal opens it right after
the ack (its trigger lives 3 s). The lazy function runs every other command in the `/kernel` lane and answers at
the command's response_url, ephemerally, or in an ephemeral message when the response_url does not take it."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from slack_bolt import Ack, App, Respond
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError

from bot.slack.kernel_commands import KernelCommands, OpenView
from bot.slack.lanes import Lane, in_lane
from bot.slack.listener_context import BotContext
from bot.slack.slash import Command, UsageError, parse
from storage.errors import KernelbotError, explain

log = logging.getLogger("kernelbot.slack")
COMMANDS_LANE = Lane("kernel-command", workers=4)  # commands answered at once; more wait their turn (the ack does not)


def register(app: App, ctx: BotContext) -> None:
    commands = KernelCommands(ctx)
    app.command("/kernel")(ack=partial(handle_kernel_command, commands),
                           lazy=[in_lane(partial(answer_kernel_command, commands), COMMANDS_LANE)])


def read(text: str) -> Command | str:
    """The parsed command, or the usage error that is its answer."""
    try:
        return parse(text)
    except UsageError as exc:
        return explain(exc)


def form_of(commands: KernelCommands, parsed: Command | str, *, channel: str) -> OpenView | None:
    return commands.modal(parsed, channel=channel) if isinstance(parsed, Command) else None


def handle_kernel_command(commands: KernelCommands, ack: Ack, command: dict[str, Any], client: WebClient,
                          respond: Respond) -> None:
    """Ack; open the command's form if it has one (`answer_kernel_command` answers the others)."""
    ack()
    channel = command.get("channel_id", "")
    view = form_of(commands, read(command.get("text", "")), channel=channel)
    if view is not None:
        open_view(client, view, trigger_id=command.get("trigger_id", ""), respond=respond)


def answer_kernel_command(commands: KernelCommands, command: dict[str, Any], client: WebClient,
                          respond: Respond) -> None:
    """The lazy half: every command without a form, run and answered."""
    user, channel, text = command.get("user_id", ""), command.get("channel_id", ""), command.get("text", "")
    parsed = read(text)
    if form_of(commands, parsed, channel=channel) is None:
        answer(commands, parsed, user=user, channel=channel, text=text, client=client, respond=respond)


def answer(commands: KernelCommands, parsed: Command | str, *, user: str, channel: str, text: str,
           client: WebClient, respond: Respond) -> None:
    """Run the command (a usage error is its own answer) and tell the person what came of it."""
    try:
        reply = parsed if isinstance(parsed, str) else commands.run(parsed, user=user, channel=channel)
    except KernelbotError as exc:  # the message and what to do next
        reply = explain(exc)
    except (LookupError, ValueError) as exc:  # a built-in error whose message names the bad id or value
        reply = str(exc)
    except Exception as exc:  # noqa: BLE001 - a person gets a sentence, the log gets the traceback
        log.exception("/kernel %r failed", text)
        reply = f"Something went wrong on our side ({type(exc).__name__}); it is in kernelbot's log."
    if isinstance(reply, OpenView):  # only `modal` opens views; a command that returns one here is a bug
        log.error("/kernel %r asked for a modal after its trigger was spent", text)
        reply = "Something went wrong on our side (a form opened too late); it is in kernelbot's log."
    tell(client, respond, user=user, channel=channel, text=reply)


def open_view(client: WebClient, view: OpenView, *, trigger_id: str, respond: Respond) -> None:
    try:
        client.views_open(trigger_id=trigger_id, view=view.view)
    except (SlackApiError, SlackClientError, OSError) as exc:
        log.exception("/kernel could not open its form")
        why = exc.response.get("error") if isinstance(exc, SlackApiError) else type(exc).__name__
        try:
            respond(text=f"Slack would not open the form ({why}); run the command again.",
                    response_type="ephemeral")
        except (SlackClientError, OSError):
            log.exception("/kernel could not say that its form did not open")


def tell(client: WebClient, respond: Respond, *, user: str, channel: str, text: str) -> None:
    """The command's answer at its response_url; if Slack does not take it there, as an ephemeral message."""
    try:
        response = respond(text=text, response_type="ephemeral")
        if response.status_code == 200:
            return
        log.warning("the response_url refused /kernel's answer (%s %s); answering with chat.postEphemeral",
                    response.status_code, str(response.body)[:200])
    except (SlackClientError, OSError, ValueError):  # ValueError: the command came without a response_url
        log.exception("the response_url did not take /kernel's answer; answering with chat.postEphemeral")
    try:
        client.chat_postEphemeral(channel=channel, user=user, text=text)
    except (SlackApiError, SlackClientError, OSError):
        log.exception("cannot tell %s in %s the answer to their /kernel command", user, channel)
