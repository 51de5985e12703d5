"""Each `/kernel` command as a function from its parsed form to the ephemeral reply; `modal` names the commands
that open a form instead (no database, no Slack: the listener opens it within the trigger's 3 s).

Surfaces never call agents: starting a session records it and enqueues its first job in one transaction
(`agents.commands`, `agents.search`); runners do the work; what people should see comes back as session events,
delivered to threads by the notifier.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlmodel import Session

from agents.brains import default_brain
from agents.commands import cancel_session, start_session
from agents.search import start_search
from agents.search_decide import SearchConfig
from bot.slack.listener_context import BotContext
from bot.slack.schedule_commands import digest_reply, schedule_reply
from bot.slack.slash import Command, UsageError, help_text
from bot.slack.views.home import mode_words, status_words
from bot.slack.views.kit import mode_name, thread_link
from bot.slack.views.port_form import port_form
from bot.slack.views.reference_form import reference_form
from bot.slack.visibility import audience
from bot.task_suites import suite_tasks
from storage import runners, sessions
from storage.models import KernelSession, now
from tpu_runner.hardware import get_chip
from tpu_runner.tasks import load_task

ACTIVE = ("active", "awaiting")
LOOKED_AT = 200  # the newest sessions a listing picks from: some may be hidden from whoever asks


@dataclass(frozen=True)
class OpenView:
    """Open this modal (the command's trigger is only valid for 3 seconds: the listener opens it at once)."""

    view: dict[str, Any]


Reply = str | OpenView


def session_line(r: KernelSession) -> str:
    link = thread_link(r.slack_channel, r.slack_thread_ts)
    return (f"• `{r.id}` {mode_words(r.mode)} on *{r.task}* ({r.target}): {status_words(r.status)}"
            + (f", {link}" if link else ""))


class KernelCommands:
    def __init__(self, ctx: BotContext):
        self.ctx = ctx

    def run(self, command: Command, *, user: str, channel: str) -> Reply:
        view = self.modal(command, channel=channel)
        if view is not None:
            return view
        handler = getattr(self, f"do_{command.name}")
        return handler(command, user=user, channel=channel)

    def modal(self, command: Command, *, channel: str) -> OpenView | None:
        """The form this command opens (`/kernel port`, `/kernel new` without a task), None for the others."""
        if command.name == "port":
            return OpenView(port_form(channel=channel))
        if command.name == "new" and "task" not in command.args:
            return OpenView(reference_form(channel=channel, target=self.ctx.settings.default_target))
        return None

    # -- helpers --------------------------------------------------------------------------------------------------
    def _task(self, name: str) -> Any:
        tasks = suite_tasks(self.ctx.suites)
        if name not in tasks:
            known = ", ".join(sorted(tasks)) or "none"
            raise UsageError(f"No task `{name}`. Tasks: {known}.")
        return load_task(tasks[name])

    def _target(self, command: Command) -> str:
        return get_chip(str(command.options.get("target") or self.ctx.settings.default_target)).name

    def _brain(self, command: Command) -> str:
        return str(command.options.get("brain") or default_brain(self.ctx.settings))

    # -- commands -------------------------------------------------------------------------------------------------
    def do_help(self, command: Command, **_: Any) -> Reply:
        return help_text()

    def do_new(self, command: Command, *, user: str, channel: str) -> Reply:
        return self._start(command, user=user, channel=channel, mode="hitl", then="its plan comes to a thread here")

    def do_auto(self, command: Command, *, user: str, channel: str) -> Reply:
        return self._start(command, user=user, channel=channel, mode="auto", then="results come to a thread here")

    def _start(self, command: Command, *, user: str, channel: str, mode: str, then: str) -> Reply:
        """A HITL or Auto session on the task the command names, in this channel."""
        task = self._task(command.args["task"])
        self.ctx.channels.require(channel)
        budget = {"brain": self._brain(command), "iterations": int(command.options.get("budget", 5))}
        session_id = start_session(self.ctx.engine, mode=mode, task=task, target=self._target(command), owner=user,
                                   budget=budget, slack_channel=channel)
        return f"Started {mode_name(mode)} session `{session_id}` on *{task.task_id}*; {then}."

    def do_search(self, command: Command, *, user: str, channel: str) -> Reply:
        task = self._task(command.args["task"])
        config = SearchConfig(strategy=str(command.options.get("strategy", "beam")),
                              budget=int(command.options.get("budget", 12)))
        self.ctx.channels.require(channel)
        with Session(self.ctx.engine) as s, s.begin():
            session_id = start_search(s, task=task, target=self._target(command), config=config, seed_code=None,
                                      brain=self._brain(command), owner=user, slack_channel=channel)
        return (f"Started a {config.strategy} search `{session_id}` on *{task.task_id}* ({config.budget} "
                "evaluations); the result comes to a thread here.")

    def do_tasks(self, command: Command, **_: Any) -> Reply:
        tasks = suite_tasks(self.ctx.suites)
        return "Tasks: " + ", ".join(f"`{name}`" for name in sorted(tasks))

    def do_runners(self, command: Command, **_: Any) -> Reply:
        with Session(self.ctx.engine) as s:
            fleet = runners.get_runners(s)
        if not fleet:
            return "No runner is active: sessions wait in the queue until one starts (`kernelbot runner`)."
        t = now()
        return "\n".join(f"• {r.name} on {r.host}: {', '.join(r.targets or [])}, {len(r.current_jobs or [])} "
                         f"job(s) running, heard from {t - r.heartbeat_at:.0f} s ago" for r in fleet)

    def _shown(self, rows: list[KernelSession], *, user: str, channel: str, limit: int) -> list[KernelSession]:
        """The first `limit` sessions this person may see, in an answer that appears in this channel."""
        shown = audience(self.ctx.visibility, viewer=user, where=channel)
        return [r for r in rows if shown(r.slack_channel)][:limit]

    def do_list(self, command: Command, *, user: str, channel: str) -> Reply:
        with Session(self.ctx.engine) as s:
            recent = self._shown(sessions.get_sessions(s, limit=LOOKED_AT), user=user, channel=channel, limit=10)
        if not recent:
            return "No sessions to show here yet: `/kernel new TASK` starts one."
        return "Recent sessions:\n" + "\n".join(session_line(r) for r in recent)

    def do_status(self, command: Command, *, user: str, channel: str) -> Reply:
        if "session" in command.args:
            return self.do_show(command, user=user, channel=channel)
        with Session(self.ctx.engine) as s:
            active = self._shown(sessions.get_sessions(s, limit=LOOKED_AT, statuses=ACTIVE), user=user,
                                 channel=channel, limit=20)
        if not active:
            return "No session is active here. `/kernel list` shows recent ones."
        return "Active sessions:\n" + "\n".join(session_line(r) for r in active)

    def _session_shown(self, s: Session, session_id: str, *, user: str, channel: str) -> KernelSession:
        """The session, if this person may see it here; a hidden one answers as one that does not exist."""
        record = sessions.get_session(s, session_id=session_id)
        if not self._shown([record], user=user, channel=channel, limit=1):
            raise LookupError(f"no session {record.id}")
        return record

    def do_show(self, command: Command, *, user: str, channel: str) -> Reply:
        with Session(self.ctx.engine) as s:
            record = self._session_shown(s, command.args["session"], user=user, channel=channel)
            steps = sessions.get_steps(s, session_id=record.id, status=None)
            lines = [session_line(record).removeprefix("• ")]
            for st in list(steps)[-12:]:
                out = st.outputs or {}
                what = out.get("message") or out.get("action") or out.get("reason") or ""
                lines.append(f"  {st.index}. {st.kind}" + (f": {str(what)[:140]}" if what else ""))
            if record.best_candidate_id:
                lines.append(f"best kernel: candidate {record.best_candidate_id}")
        return "\n".join(lines)

    def do_schedule(self, command: Command, *, user: str, channel: str) -> Reply:
        return schedule_reply(self.ctx, command, user=user, channel=channel)

    def do_digest(self, command: Command, *, user: str, channel: str) -> Reply:
        return digest_reply(self.ctx, command, user=user, channel=channel)

    def do_cancel(self, command: Command, *, user: str, channel: str) -> Reply:
        session_id = command.args["session"]
        with Session(self.ctx.engine) as s:
            self._session_shown(s, session_id, user=user, channel=channel)
        allowed, why = self.ctx.may_steer_session(user=user, session_id=session_id)
        if not allowed:
            return why
        cancel_session(self.ctx.engine, session_id=session_id, actor=user, via="command")
        self.ctx.notify()
        return f"Cancelled session `{session_id}`."
