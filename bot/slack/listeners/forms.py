"""What the two task forms (`/kernel new`'s reference, `/kernel port`) do alike on submit: look up a saved task of
the same name, refuse in the form what is wrong, else show the working view and do the slow part on a thread (Slack
wants the view's answer within 3 seconds)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from slack_bolt import Ack

from bot.slack.listener_context import BotContext
from bot.task_suites import suite_tasks
from tpu_runner.tasks.reference_check import read_task_files


def saved_task_files(ctx: BotContext, name: str) -> dict[str, str] | None:
    """The files of the task already saved under `name` (None when there is none), for the name-taken check."""
    return read_task_files(suite_tasks(ctx.suites).get(name)) if name else None


def accept_and_work(ack: Ack, body: dict[str, Any], view: dict[str, Any], *, problems: dict[str, str],
                    working_view: Callable[[], dict[str, Any]], work: Callable[..., None], args: tuple[Any, ...],
                    thread_name: str) -> None:
    """Errors go back into the form; otherwise the form becomes `working_view()` and `work(*args, user=, view_id=)`
    runs on a daemon thread, updating that view when done."""
    if problems:
        ack(response_action="errors", errors=problems)
        return
    ack(response_action="update", view=working_view())
    user = str((body.get("user") or {}).get("id", ""))
    threading.Thread(target=work, args=args, kwargs={"user": user, "view_id": str(view.get("id", ""))},
                     name=thread_name, daemon=True).start()
