"""The `/kernel port` form's submission and the buttons on the ported task.

Static problems (no source, both a paste and a file, a bad or taken name, a syntax error) are shown next to their
inputs at once. Otherwise the form becomes a "porting" view; then a Bolt lazy listener, in the port lane, makes sure
the bot can post in the channel (the buttons start sessions there), fetches an uploaded file with the bot token, ports
the source to a task, and turns the view into the new task with two buttons (start a HITL or an Auto session in the
channel the form was opened in), or the form again with what went wrong.
"""

from __future__ import annotations

import logging
import re
import tempfile
import urllib.error
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any

from slack_bolt import Ack, App
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError

from agents.brain import Budget
from agents.brains import BrainUnavailable, default_brain
from agents.commands import start_session
from agents.porter import SourceError, port_file, porter_brain
from bot.slack.channel_access import ChannelUnavailable
from bot.slack.lanes import Lane, in_lane
from bot.slack.listener_context import BotContext
from bot.slack.listeners.forms import SubmittedForm, accept_form, read_form, saved_task_files
from bot.slack.views.port_form import (
    FILE_MAX_BYTES,
    KINDS,
    MODES,
    PORT_CALLBACK,
    PortSubmission,
    UploadedFile,
    name_taken,
    parse_submission,
    paste_filename,
    port_form,
    ported_view,
    porting_view,
    read_start_value,
    source_kind,
    start_failed_view,
    started_view,
    static_problems,
    torch_reference_refused,
)
from storage.errors import KernelbotError
from tpu_runner.porting import PortError, PortResult, PortUnavailable
from tpu_runner.tasks import TaskError, load_task, read_task_files

log = logging.getLogger("kernelbot.slack")
ITERATIONS = 5
DOWNLOAD_SECONDS = 30
PORTS_LANE = Lane("port", workers=2)  # ports at once on the serve host (each a sandboxed child); more wait their turn


class UploadRefused(KernelbotError):
    """The uploaded file cannot be used; the message says why and what to do."""
    next_step = "fix the upload as the message says, then submit the form again"


def register(app: App, ctx: BotContext) -> None:
    app.view(PORT_CALLBACK, middleware=[partial(read_form, ctx, parse=parse_submission, problems_of=static_problems)])(
        ack=partial(accept_form, working_view=porting_view),
        lazy=[in_lane(partial(port_submission, ctx), PORTS_LANE)])
    for action_id in MODES:
        app.action(action_id)(partial(handle_start_button, ctx))


# --- the submission, in the port lane -------------------------------------------------------------------------------


def port_submission(ctx: BotContext, client: WebClient, submitted_form: SubmittedForm[PortSubmission]) -> None:
    """The lazy half: an accepted form's source ported."""
    if not submitted_form.problems:
        port_and_show(ctx, client, submitted_form.submission, user=submitted_form.user,
                      view_id=submitted_form.view_id)


def port_and_show(ctx: BotContext, client: WebClient, submission: PortSubmission, *, user: str, view_id: str) -> None:
    """Fetch the source, port it to a task and show the outcome in the modal."""
    try:
        ctx.channels.require(submission.channel)
        with tempfile.TemporaryDirectory(prefix="kernelbot-port-") as scratch:
            kind, source, reference = write_sources(ctx, client, submission, Path(scratch))
            result = port_source(ctx, source, kind=kind, name=submission.name, torch_reference=reference)
        if result.ok:
            view = ported_view(result, channel=submission.channel, kind=kind, source_name=submission.source_name)
            text = (f"Ported *{submission.name}*; `/kernel new {submission.name}` or `/kernel auto "
                    f"{submission.name}` starts a session on it.")
        else:
            error = describe_error(result.error, home=ctx.settings.home)
            view = port_form(channel=submission.channel, values=submission, error=error)
            text = f"*{submission.name}* was not ported; nothing was written:\n{error}"
    except (ChannelUnavailable, UploadRefused, PortUnavailable, SourceError, BrainUnavailable) as exc:
        view, text = port_form(channel=submission.channel, values=submission, error=str(exc)), str(exc)
    except Exception as exc:  # noqa: BLE001 - a person gets a sentence, the log gets the traceback
        log.exception("porting %r from Slack failed", submission.name)
        error = (f"Something went wrong on our side ({type(exc).__name__}); it is in kernelbot's log. Nothing was "
                 "written.")
        view, text = port_form(channel=submission.channel, values=submission, error=error), error
    _show(client, view_id=view_id, view=view, channel=submission.channel, user=user, text=text)


def write_sources(ctx: BotContext, client: WebClient, submission: PortSubmission,
                  scratch: Path) -> tuple[str, Path, Path | None]:
    """(its kind, the source file, the PyTorch reference's file or None), written in `scratch`; an upload is
    fetched first and checked as a paste was in the form (UploadRefused saying why not)."""
    if submission.files:
        filename, source = download_upload(client, submission.files[0])
        taken = name_taken(submission.name, saved_task_files(ctx, submission.name), source)
        if taken:
            raise UploadRefused(taken)
    else:
        source, filename = submission.source, paste_filename(submission.name, submission.source)
    kind, unknown = source_kind(filename, source)
    if kind is None:
        raise UploadRefused(str(unknown))
    path = scratch / filename
    path.write_text(source)
    if not submission.torch_reference.strip():
        return kind, path, None
    refused = torch_reference_refused(kind)
    if refused:
        raise UploadRefused(refused)
    reference = scratch / "torch_reference.py"
    reference.write_text(submission.torch_reference)
    return kind, path, reference


def port_source(ctx: BotContext, path: Path, *, kind: str, name: str, torch_reference: Path | None) -> PortResult:
    """Port the source at `path` to the task `name` among the pasted and ported tasks: a PyTorch module exactly,
    CUDA or Triton through the deployment's LLM brain (BrainUnavailable, in Slack's words, without one)."""
    brain = None
    if kind != "pytorch":
        try:
            brain = porter_brain(None, ctx.settings, Budget())
        except BrainUnavailable as exc:
            raise BrainUnavailable(f"porting a {KINDS[kind]} needs the anthropic brain to write its JAX reference, "
                                   "and this deployment has no ANTHROPIC_API_KEY: ask whoever runs kernelbot serve "
                                   "to set it, or paste the PyTorch module of the same operation instead.") from exc
    return port_file(path, name=name, dest=ctx.settings.home / "tasks" / name, settings=ctx.settings, brain=brain,
                     torch_reference=torch_reference)


def describe_error(error: PortError | None, *, home: Path) -> str:
    if error is None:
        return "porting failed without saying why"
    return error.message.replace(str(home), "KERNELBOT_HOME")


def download_upload(client: WebClient, upload: UploadedFile) -> tuple[str, str]:
    """(a safe file name, the text) of a file someone uploaded to the form: its download address from `files.info`,
    fetched with the bot token (Slack's private file URLs need it). Refuses files over FILE_MAX_BYTES."""
    try:
        info = client.files_info(file=upload.id)["file"]
    except SlackApiError as exc:
        raise UploadRefused(f"Slack would not describe the uploaded file {upload.name} "
                            f"({exc.response.get('error')}); does the app have the files:read scope?") from exc
    name = _safe_name(str(info.get("name") or upload.name))
    size = int(info.get("size") or 0)
    if size > FILE_MAX_BYTES:
        raise UploadRefused(f"{name} is {size:,} bytes; kernelbot ports files up to {FILE_MAX_BYTES:,} bytes (1 MB). "
                            "Upload the module or kernel alone.")
    url = str(info.get("url_private_download") or info.get("url_private") or "")
    if not url:
        raise UploadRefused(f"Slack gave no download address for {name}; upload it again.")
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {client.token}"})
    try:
        with urllib.request.urlopen(request, timeout=DOWNLOAD_SECONDS) as response:
            content_type = response.headers.get("Content-Type") or ""
            data = response.read(FILE_MAX_BYTES + 1)
    except (urllib.error.URLError, OSError) as exc:
        raise UploadRefused(f"fetching {name} from Slack failed ({exc}); submit the form again.") from exc
    if len(data) > FILE_MAX_BYTES:
        raise UploadRefused(f"{name} is over {FILE_MAX_BYTES:,} bytes (1 MB); upload the module or kernel alone.")
    if content_type.startswith("text/html") and not name.endswith((".html", ".htm")):
        # Slack answers a request its token does not cover with its sign-in page, not an error status.
        raise UploadRefused(f"Slack sent a web page instead of {name}: the app needs the files:read scope "
                            "(reinstall it from bot/slack/manifest.yaml).")
    try:
        return name, data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UploadRefused(f"{name} is not UTF-8 text: upload the source file itself.") from exc


def _safe_name(name: str) -> str:
    """The file's own name without directories or odd characters (it becomes a file in a scratch directory)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "_", Path(name).name).lstrip(".")
    return cleaned or "upload.py"


# --- the buttons -----------------------------------------------------------------------------------------------------


def handle_start_button(ctx: BotContext, ack: Ack, body: dict[str, Any], action: dict[str, Any],
                        client: WebClient) -> None:
    """Start the session the button names, once per ported result, and show it in the modal."""
    ack()
    user = str((body.get("user") or {}).get("id", ""))
    view_id = str((body.get("view") or {}).get("id") or (body.get("container") or {}).get("view_id") or "")
    mode = MODES[action["action_id"]]
    try:
        task_name, channel = read_start_value(str(action.get("value", "")))
    except ValueError as exc:
        _show(client, view_id=view_id, view=start_failed_view(task="?", error=str(exc)), channel="", user=user,
              text=str(exc))
        return
    if view_id and not ctx.first_delivery(f"port-start:{view_id}"):
        return  # a second click (or Slack's retry) on the same result: one session per ported result
    view, text = start_on_ported(ctx, mode=mode, task_name=task_name, channel=channel, user=user)
    _show(client, view_id=view_id, view=view, channel=channel, user=user, text=text)


def start_on_ported(ctx: BotContext, *, mode: str, task_name: str, channel: str,
                    user: str) -> tuple[dict[str, Any], str]:
    """Start a session on the ported task in `channel`; (the view to show, the same as a sentence)."""
    task_dir = ctx.settings.home / "tasks" / task_name
    files = read_task_files(task_dir)
    if files is None:
        error = "the task is no longer in KERNELBOT_HOME/tasks; run /kernel port again."
        return start_failed_view(task=task_name, error=error), f"No session was started on {task_name}: {error}"
    brain, target = default_brain(ctx.settings), ctx.settings.default_target
    try:
        ctx.channels.require(channel)
        session_id = start_session(ctx.engine, mode=mode, task=load_task(task_dir), target=target, owner=user,
                                   budget={"brain": brain, "iterations": ITERATIONS, "task_files": files},
                                   slack_channel=channel)
    except (ChannelUnavailable, TaskError, ValueError) as exc:
        error = str(exc).replace(str(ctx.settings.home), "KERNELBOT_HOME")
        return start_failed_view(task=task_name, error=error), f"No session was started on {task_name}: {error}"
    ctx.notify()
    label = "HITL" if mode == "hitl" else "Auto"
    return (started_view(session_id, mode=mode, task=task_name, channel=channel, target=target, brain=brain),
            f"Started {label} session `{session_id}` on *{task_name}*; its thread is here.")


def _show(client: WebClient, *, view_id: str, view: dict[str, Any], channel: str, user: str, text: str) -> None:
    """Update the modal; if the person closed it meanwhile, tell them in the channel instead."""
    try:
        client.views_update(view_id=view_id, view=view)
        return
    except (SlackApiError, SlackClientError, OSError) as exc:
        log.info("cannot update view %s (%s); answering in %s instead", view_id, exc, channel)
    if not channel:
        return
    try:
        client.chat_postEphemeral(channel=channel, user=user, text=text[:3000])
    except (SlackApiError, SlackClientError, OSError):
        log.exception("cannot tell %s in %s about their port", user, channel)
