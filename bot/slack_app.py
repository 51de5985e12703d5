"""The Slack app: `/kernel` commands, acked at once and turned into recorded session commands.

Surfaces never call agents: starting a session records it and enqueues its first job in one transaction
(`agents.commands`, `agents.search`); runners do the work; what people should see comes back as session events
(delivered to threads by the notifier). Every reply here is ephemeral and goes out with the ack.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from slack_bolt import App
from slack_sdk import WebClient
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from agents.brains import default_brain
from agents.commands import start_session
from agents.search import start_search
from agents.search_decide import SearchConfig
from bot.cli import REPO_TASKS
from bot.slash import Command, UsageError, help_text, parse
from storage import runners, sessions
from storage.models import KernelSession
from storage.settings import Settings
from tpu_runner.hardware import UnknownTarget, get_chip
from tpu_runner.tasks import TaskError, discover_tasks, load_task

log = logging.getLogger(__name__)


class SlackSettingsError(ValueError):
    """What `serve` needs from the environment and did not get."""


def suite_tasks(suites: list[Path]) -> dict[str, Path]:
    """Task name -> directory, over `tasks/` and the configured suites (a later suite overrides an earlier)."""
    found: dict[str, Path] = {}
    for suite in [REPO_TASKS, *suites]:
        for task_dir in discover_tasks(suite):
            found[task_dir.name] = task_dir
    return found


class KernelCommands:
    """Each /kernel command as a function from its parsed form to the ephemeral reply."""

    def __init__(self, settings: Settings, engine: Engine, suites: list[Path]):
        self.settings, self.engine, self.suites = settings, engine, suites

    def run(self, command: Command, *, user: str, channel: str) -> str:
        handler = getattr(self, f"do_{command.name}", None)
        if handler is None:
            return f"`/kernel {command.name}` is not available in this version yet. {help_text()}"
        return handler(command, user=user, channel=channel)

    def _task(self, name: str) -> Any:
        tasks = suite_tasks(self.suites)
        if name not in tasks:
            known = ", ".join(sorted(tasks)) or "none"
            raise UsageError(f"No task `{name}`. Tasks: {known}.")
        return load_task(tasks[name])

    def _target(self, command: Command) -> str:
        return get_chip(str(command.options.get("target") or self.settings.default_target)).name

    def do_help(self, command: Command, **_: Any) -> str:
        return help_text()

    def do_new(self, command: Command, *, user: str, channel: str) -> str:
        if "task" not in command.args:
            return "Pasting a reference in a form is not available in this version yet: give a task, e.g. " \
                   "`/kernel new softmax` (`/kernel tasks` lists them)."
        task = self._task(command.args["task"])
        brain = str(command.options.get("brain") or default_brain(self.settings))
        session_id = start_session(self.engine, mode="hitl", task=task, target=self._target(command), owner=user,
                                   budget={"brain": brain}, slack_channel=channel)
        return f"Started HITL session `{session_id}` on *{task.task_id}*; its plan comes to a thread here."

    def do_auto(self, command: Command, *, user: str, channel: str) -> str:
        task = self._task(command.args["task"])
        brain = str(command.options.get("brain") or default_brain(self.settings))
        session_id = start_session(self.engine, mode="auto", task=task, target=self._target(command), owner=user,
                                   budget={"brain": brain, "iterations": int(command.options.get("budget", 5))},
                                   slack_channel=channel)
        return f"Started Auto session `{session_id}` on *{task.task_id}*; results come to a thread here."

    def do_search(self, command: Command, *, user: str, channel: str) -> str:
        task = self._task(command.args["task"])
        brain = str(command.options.get("brain") or default_brain(self.settings))
        config = SearchConfig(strategy=str(command.options.get("strategy", "beam")),
                              budget=int(command.options.get("budget", 12)))
        with Session(self.engine) as s, s.begin():
            session_id = start_search(s, task=task, target=self._target(command), config=config, seed_code=None,
                                      brain=brain, owner=user, slack_channel=channel)
        return (f"Started a {config.strategy} search `{session_id}` on *{task.task_id}* ({config.budget} "
                "evaluations); the result comes to a thread here.")

    def do_tasks(self, command: Command, **_: Any) -> str:
        tasks = suite_tasks(self.suites)
        return "Tasks: " + ", ".join(f"`{name}`" for name in sorted(tasks))

    def do_runners(self, command: Command, **_: Any) -> str:
        with Session(self.engine) as s:
            fleet = runners.get_runners(s)
        if not fleet:
            return "No runner is active: sessions wait in the queue until one starts (`kernelbot runner`)."
        return "\n".join(f"• {r.name} on {r.host}: {', '.join(r.targets or [])}, {len(r.current_jobs or [])} "
                         f"job(s) running" for r in fleet)

    def do_list(self, command: Command, **_: Any) -> str:
        with Session(self.engine) as s:
            recent = s.exec(select(KernelSession).order_by(col(KernelSession.created_at).desc()).limit(10)).all()
        if not recent:
            return "No sessions yet: `/kernel new TASK` starts one."
        return "\n".join(f"• `{r.id}` {r.mode} on *{r.task}* ({r.target}): {r.status}" for r in recent)

    def do_status(self, command: Command, **_: Any) -> str:
        if "session" not in command.args:
            return self.do_list(command)
        with Session(self.engine) as s:
            record = sessions.get_session(s, session_id=command.args["session"])
            return f"`{record.id}` {record.mode} on *{record.task}* ({record.target}): {record.status}"

    do_show = do_status

    def do_cancel(self, command: Command, *, user: str, **_: Any) -> str:
        with Session(self.engine) as s, s.begin():
            record = sessions.get_session(s, session_id=command.args["session"])
            if record.status in ("done", "cancelled"):
                return f"Session `{record.id}` is already {record.status}."
            if record.owner and record.owner != user:
                return f"Only <@{record.owner}>, who started session `{record.id}`, may cancel it."
            sessions.set_session_status(s, session_id=record.id, status="cancelled")
        return f"Cancelled session `{command.args['session']}`."


def build_app(settings: Settings, engine: Engine, *, suites: list[Path] | None = None,
              socket_mode: bool = False) -> App:
    if not settings.slack_bot_token:
        raise SlackSettingsError("SLACK_BOT_TOKEN is not set: the bot token (xoxb-...) from the app's OAuth page")
    if not socket_mode and not settings.slack_signing_secret:
        raise SlackSettingsError("SLACK_SIGNING_SECRET is not set: HTTP mode verifies every request with it")
    client = WebClient(token=settings.slack_bot_token,
                       **({"base_url": settings.slack_api_url} if settings.slack_api_url else {}))
    app = App(client=client, signing_secret=settings.slack_signing_secret or "unused-in-socket-mode",
              token_verification_enabled=False)
    commands = KernelCommands(settings, engine, suites or [])

    @app.command("/kernel")
    def kernel(ack: Any, command: dict[str, Any]) -> None:
        user, channel = command.get("user_id", ""), command.get("channel_id", "")
        try:
            reply = commands.run(parse(command.get("text", "")), user=user, channel=channel)
        except (UsageError, TaskError, UnknownTarget, LookupError, ValueError) as exc:
            reply = str(exc)
        except Exception as exc:  # noqa: BLE001 - a person gets a sentence, the log gets the traceback
            log.exception("/kernel %r failed", command.get("text"))
            reply = f"Something went wrong on our side ({type(exc).__name__}); it is in kernelbot's log."
        ack(response_type="ephemeral", text=reply)

    return app
