"""The `/kernel new` reference form's submission.

Static problems (syntax, missing functions, a bad name or tolerance) are shown next to their inputs at once.
Otherwise the form becomes a "checking" view; then a Bolt lazy listener, in the reference-check lane, makes sure the
bot can post in the channel (the session's thread lives there), checks the reference in a sandbox and turns the view
into either the started HITL session or the form again, with what was typed and what went wrong.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from slack_bolt import App
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError

from agents.brains import default_brain
from agents.commands import start_session
from bot.slack.channel_access import ChannelUnavailable
from bot.slack.lanes import Lane, in_lane
from bot.slack.listener_context import BotContext
from bot.slack.listeners.forms import SubmittedForm, accept_form, read_form
from bot.slack.views.reference_form import (
    REFERENCE_CALLBACK,
    ReferenceSubmission,
    checking_view,
    parse_submission,
    reference_form,
    started_view,
    static_problems,
    task_files,
)
from tpu_runner.tasks import TaskError, add_checked_task, load_task

log = logging.getLogger("kernelbot.slack")
HITL_ITERATIONS = 5
CHECKS_LANE = Lane("reference-check", workers=2)  # sandboxed checks at once on the serve host; more wait their turn


def register(app: App, ctx: BotContext) -> None:
    app.view(REFERENCE_CALLBACK,
             middleware=[partial(read_form, ctx, parse=parse_submission, problems_of=static_problems)])(
        ack=partial(accept_form, working_view=checking_view),
        lazy=[in_lane(partial(check_reference_submission, ctx), CHECKS_LANE)])


def check_reference_submission(ctx: BotContext, client: WebClient,
                               submitted_form: SubmittedForm[ReferenceSubmission]) -> None:
    """The lazy half: an accepted form's reference checked, and the session started."""
    if not submitted_form.problems:
        check_and_start(ctx, client, submitted_form.submission, user=submitted_form.user,
                        view_id=submitted_form.view_id)


def check_and_start(ctx: BotContext, client: WebClient, submission: ReferenceSubmission, *, user: str,
                    view_id: str) -> None:
    """Check the reference, save its task and start the session; then show the outcome in the modal."""
    files = task_files(submission)
    brain = submission.brain or default_brain(ctx.settings)
    try:
        ctx.channels.require(submission.channel)
        added = add_checked_task(files, dest=ctx.settings.home / "tasks" / submission.name, settings=ctx.settings)
        if added.task_dir is None:
            error = added.check.error or "the check failed without saying why"
            view = reference_form(channel=submission.channel, values=submission, error=error)
            text = f"The reference *{submission.name}* did not pass the check; nothing was started:\n{error}"
        else:
            session_id = start_session(
                ctx.engine, mode="hitl", task=load_task(added.task_dir), target=submission.target, owner=user,
                budget={"brain": brain, "iterations": HITL_ITERATIONS, "task_files": files},
                slack_channel=submission.channel)
            ctx.notify()
            view = started_view(session_id, submission=submission, brain=brain, check=added.check)
            text = f"Started HITL session `{session_id}` on *{submission.name}*; its plan comes to a thread here."
    except ChannelUnavailable as exc:
        view = reference_form(channel=submission.channel, values=submission, error=str(exc))
        text = str(exc)
    except TaskError as exc:  # the name was taken meanwhile
        error = str(exc).replace(str(ctx.settings.home), "KERNELBOT_HOME")
        view, text = reference_form(channel=submission.channel, values=submission, error=error), error
    except Exception as exc:  # noqa: BLE001 - a person gets a sentence, the log gets the traceback
        log.exception("checking the pasted reference %r failed", submission.name)
        error = f"Something went wrong on our side ({type(exc).__name__}); it is in kernelbot's log. Nothing started."
        view, text = reference_form(channel=submission.channel, values=submission, error=error), error
    _show(client, view_id=view_id, view=view, channel=submission.channel, user=user, text=text)


def _show(client: WebClient, *, view_id: str, view: dict[str, Any], channel: str, user: str, text: str) -> None:
    """Update the modal; if the person closed it meanwhile, tell them in the channel instead."""
    try:
        client.views_update(view_id=view_id, view=view)
        return
    except (SlackApiError, SlackClientError, OSError) as exc:
        log.info("cannot update view %s (%s); answering in %s instead", view_id, exc, channel)
    try:
        client.chat_postEphemeral(channel=channel, user=user, text=text[:3000])
    except (SlackApiError, SlackClientError, OSError):
        log.exception("cannot tell %s in %s about their reference", user, channel)
