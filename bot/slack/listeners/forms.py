"""What the two task forms (`/kernel new`'s reference, `/kernel port`) do alike on submit, as Bolt lazy listeners.

`read_form`, the listener's middleware, reads the submission and what is wrong with it once (a saved task of the
same name counts) and puts both in the request's context as `submitted_form`, where the ack function and the lazy
one find them: Bolt starts the two together, so the lazy one cannot wait for the ack's verdict, and reading the saved
tasks twice could give two. The ack refuses in the form what is wrong, else shows the working view (Slack wants the
view's answer within 3 seconds); the lazy function does the slow part of an accepted form in its lane and updates
that view when done."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from slack_bolt import Ack, BoltContext

from bot.slack.listener_context import BotContext
from bot.task_suites import suite_tasks
from tpu_runner.tasks import read_task_files

FORM = "submitted_form"  # the context key, and so the name of the listeners' argument


class Named(Protocol):
    @property
    def name(self) -> str: ...


S = TypeVar("S", bound=Named)


@dataclass(frozen=True)
class SubmittedForm(Generic[S]):
    submission: S
    problems: dict[str, str]  # block id -> what is wrong; none: accepted
    user: str
    view_id: str


def saved_task_files(ctx: BotContext, name: str) -> dict[str, str] | None:
    """The files of the task already saved under `name` (None when there is none), for the name-taken check."""
    return read_task_files(suite_tasks(ctx.suites).get(name)) if name else None


def read_form(ctx: BotContext, context: BoltContext, body: dict[str, Any], view: dict[str, Any],
              next_: Callable[[], None], *, parse: Callable[[dict[str, Any]], S],
              problems_of: Callable[..., Mapping[str, str]]) -> None:
    """The listener middleware: the `SubmittedForm`, put in the request's context before either listener runs."""
    submission = parse(view)
    problems = problems_of(submission, existing=saved_task_files(ctx, submission.name))
    user = str((body.get("user") or {}).get("id", ""))
    context[FORM] = SubmittedForm(submission, dict(problems), user=user, view_id=str(view.get("id", "")))
    next_()


def accept_form(ack: Ack, submitted_form: SubmittedForm[S], *, working_view: Callable[[S], dict[str, Any]]) -> None:
    """The ack function: errors go back into the form; otherwise the form becomes `working_view(submission)`."""
    if submitted_form.problems:
        ack(response_action="errors", errors=submitted_form.problems)
        return
    ack(response_action="update", view=working_view(submitted_form.submission))
