"""Decisions from Slack on finished Auto sessions (adopt, continue with a search in the same thread, return to
HITL), steering by user group, and the App Home: the real Bolt app over signed HTTP, the notifier posting to the
fake Slack, sessions advanced by the real machines with a replayed evaluation."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from slack_sdk import WebClient
from sqlalchemy import Engine
from sqlmodel import Session, select

from agents.commands import decide
from agents.session_jobs import runner_kinds
from bot.slack.app import build_app
from bot.slack.outbound.notifier import Notifier
from bot.slack.outbound.sender import ChannelPacer, SlackSender
from storage import sessions
from storage.connect import open_database
from storage.models import Candidate, Decision, Job, KernelSession
from storage.settings import Settings, load_settings
from tests.fakes.slack_api import BOT_TOKEN, FakeSlack, Message, fake_slack
from tests.support import hitl_script
from tests.support.reading import buttons, keys, text_of, wait_for
from tests.support.slack_http import SECRET, click, event, served
from tpu_runner.runner import RunnerConfig, RunnerDaemon


@dataclass
class Bot:
    url: str
    slack: FakeSlack
    engine: Engine
    settings: Settings
    workdir: Path

    def thread(self, session_id: str) -> list[Message]:
        with Session(self.engine) as s:
            record = sessions.get_session(s, session_id=session_id)
        return self.slack.thread(str(record.slack_channel), str(record.slack_thread_ts))

    def summary(self, session_id: str) -> Message:
        return wait_for("Auto's summary", lambda: next((m for m in self.thread(session_id)
                                                        if "Auto finished" in m.text and buttons(m)), None))


@pytest.fixture
def bot(tmp_path: Path) -> Iterator[Bot]:
    with fake_slack() as slack:
        slack.usergroups = {"S1": ["U5"]}
        settings = load_settings({"KERNELBOT_HOME": str(tmp_path), "SLACK_BOT_TOKEN": BOT_TOKEN,
                                  "SLACK_SIGNING_SECRET": SECRET, "KERNELBOT_SLACK_API_URL": slack.base_url,
                                  "KERNELBOT_STEERERS": "S1"})
        engine = open_database(settings)
        notifier = Notifier(engine, SlackSender(WebClient(token=BOT_TOKEN, base_url=slack.base_url,
                                                          retry_handlers=[]), ChannelPacer(100.0, 100)),
                            poll_seconds=0.05)
        threading.Thread(target=notifier.run, daemon=True).start()
        with served(build_app(settings, engine, notify=notifier.notify)) as url:
            yield Bot(url, slack, engine, settings, tmp_path / "k")
        notifier.close()


def test_adopting_auto_s_best_kernel_is_recorded_and_shown(bot: Bot) -> None:
    sid = hitl_script.finished_auto(bot.engine, bot.settings, bot.workdir, channel="C1")
    summary = bot.summary(sid)
    shown = buttons(summary)  # (the fake edits its messages in place)
    assert list(shown) == ["adopt", "search", "handback"] and "x2.00 estimated" in summary.text
    names = [bot.slack.files[f]["name"] for m in bot.thread(sid) for f in m.files]
    assert any(n.startswith("best_candidate_") for n in names)
    click(bot.url, action_id="adopt", value=buttons(summary)["adopt"], user="U6")  # not owner, not in S1
    told = wait_for("the refusal", lambda: [e for e in bot.slack.ephemeral if e["user"] == "U6"])
    assert "<!subteam^S1>" in told[0]["text"]
    click(bot.url, action_id="adopt", value=buttons(summary)["adopt"], user="U5")  # a member of S1 may
    wait_for("the answered summary", lambda: "Adopted by <@U5>" in text_of(bot.slack.find("C1", summary.ts)))
    assert not buttons(bot.slack.find("C1", summary.ts))
    with Session(bot.engine) as s:
        assert [d.action for d in s.exec(select(Decision).where(Decision.session_id == sid))] == ["adopt"]
        assert s.get(KernelSession, sid).status == "done"
    click(bot.url, action_id="handback", value=shown["handback"], user="U1")  # a card answered already
    told = wait_for("the stale click's answer", lambda: [e for e in bot.slack.ephemeral if e["user"] == "U1"])
    assert "already answered (adopt by <@U5>)" in told[0]["text"]
    with Session(bot.engine) as s:
        assert s.get(KernelSession, sid).mode == "auto"  # nothing changed


def test_continuing_with_a_search_starts_one_in_the_same_thread_from_the_best_kernel(bot: Bot) -> None:
    sid = hitl_script.finished_auto(bot.engine, bot.settings, bot.workdir, channel="C1")
    summary = bot.summary(sid)
    click(bot.url, action_id="search", value=buttons(summary)["search"], user="U1")
    with Session(bot.engine) as s:
        record = sessions.get_session(s, session_id=sid)
    search = wait_for("the search session", lambda: _search_in(bot.engine, record.slack_thread_ts))
    root = wait_for("the search's root in the thread", lambda: next(
        (m for m in bot.thread(sid) if "*Search session*" in text_of(m)), None))
    assert root.thread_ts == record.slack_thread_ts  # a reply in the Auto session's thread, not a new thread
    with Session(bot.engine) as s:
        seed = s.exec(select(Candidate).where(Candidate.session_id == search.id)).first()
        best = s.get(Candidate, record.best_candidate_id)
        assert seed is not None and best is not None and seed.code == best.code
        assert [j.kind for j in s.exec(select(Job).where(Job.session_id == search.id))] == ["search_node"]
    wait_for("the answered summary", lambda: "Search started by <@U1>" in text_of(bot.slack.find("C1", summary.ts)))


def _search_in(engine: Engine, thread_ts: str | None) -> KernelSession | None:
    with Session(engine) as s:
        return s.exec(select(KernelSession).where(KernelSession.mode == "search",
                                                  KernelSession.slack_thread_ts == thread_ts)).first()


def test_returning_to_hitl_gives_the_result_card_back(bot: Bot) -> None:
    sid = hitl_script.finished_auto(bot.engine, bot.settings, bot.workdir, channel="C1")
    summary = bot.summary(sid)
    click(bot.url, action_id="handback", value=buttons(summary)["handback"], user="U1")
    wait_for("the answered summary", lambda: "Returned to HITL by <@U1>" in text_of(bot.slack.find("C1", summary.ts)))
    with Session(bot.engine) as s:
        assert s.get(KernelSession, sid).mode == "hitl"
    # The session's queued Auto job finds it handed back and queues the HITL machine, which waits for a decision.
    config = RunnerConfig(name="t", targets=("v6e",), exit_when_idle=True, poll_seconds=0.05,
                          kinds=("hitl_advance", "auto_session"))
    assert RunnerDaemon(engine=bot.engine, settings=bot.settings, config=config, job_kinds=runner_kinds()).run() == 0
    with Session(bot.engine) as s:
        assert [(j.kind, j.status) for j in s.exec(select(Job).where(Job.session_id == sid))] == [
            ("auto_session", "done"), ("hitl_advance", "done")]
    card = wait_for("the result card again", lambda: next((m for m in bot.thread(sid)
                                                          if list(buttons(m))[:1] == ["iterate"]), None))
    assert "Result: ok" in text_of(card)
    click(bot.url, action_id="finish", value=buttons(card)["finish"], user="U1")
    root = bot.thread(sid)[0]
    wait_for("the finished root", lambda: "finished by <@U1>" in text_of(bot.slack.find("C1", root.ts)))
    wait_for("Finished by <@U1>", lambda: "Finished by <@U1>" in text_of(bot.slack.find("C1", card.ts)))
    with Session(bot.engine) as s:
        assert s.get(KernelSession, sid).status == "done"


def test_the_app_home_lists_recent_sessions_and_what_waits_for_this_person(bot: Bot) -> None:
    waiting = hitl_script.start(bot.engine, channel="C1")
    hitl_script.machine(bot.engine, bot.settings, bot.workdir).run(waiting)  # a plan awaits approval
    other = hitl_script.start(bot.engine, channel="C2", owner="U7")
    event(bot.url, {"type": "app_home_opened", "user": "U1", "channel": "D1", "tab": "home"})
    home = wait_for("the published home", lambda: bot.slack.home.get("U1"))
    text = json.dumps(home)
    assert waiting in text and other in text and "a plan to approve" in text
    waiting_part = text.split("Recent sessions")[0]
    assert waiting in waiting_part and other not in waiting_part  # U1 may not steer U7's session


# -- Cancel on every running session's messages ---------------------------------------------------------------
def _cancel_button(message: Message) -> dict[str, Any]:
    return next(e for b in message.blocks if b["type"] == "actions" for e in b["elements"]
                if e["action_id"] == "cancel")


def _running(bot: Bot, session_id: str, key: str, *, thread_of: str | None = None) -> Message:
    """The session's message under this notifier key once it shows a Cancel button that asks first."""
    def find() -> Message | None:
        return next((m for m in bot.thread(thread_of or session_id) if keys([m]) == [key] and "cancel" in buttons(m)),
                    None)
    message = wait_for(f"{key} with a Cancel button", find)
    assert "the runner stops" in _cancel_button(message)["confirm"]["text"]["text"]
    return message


def _jobs(engine: Engine, session_id: str) -> list[str]:
    with Session(engine) as s:
        return [j.status for j in s.exec(select(Job).where(Job.session_id == session_id))]


def _status(engine: Engine, session_id: str) -> str:
    with Session(engine) as s:
        return str(s.get(KernelSession, session_id).status)  # type: ignore[union-attr]


def _refused(bot: Bot, *, message: Message, session_id: str) -> None:
    """A click on Cancel by someone who may not steer: told why, and nothing changes."""
    status, jobs = _status(bot.engine, session_id), _jobs(bot.engine, session_id)
    click(bot.url, action_id="cancel", value=buttons(message)["cancel"], user="U6")
    told = wait_for("the refusal", lambda: [e for e in bot.slack.ephemeral if e["user"] == "U6"])
    assert "may steer this session" in told[0]["text"]
    assert (_status(bot.engine, session_id), _jobs(bot.engine, session_id)) == (status, jobs)
    assert "queued" in jobs and status not in ("cancelled", "done")


def test_cancelling_auto_from_its_progress_message_after_a_hand_off(bot: Bot) -> None:
    sid = hitl_script.start(bot.engine, channel="C1")
    hitl_script.machine(bot.engine, bot.settings, bot.workdir).run(sid)  # the plan awaits approval
    plan = wait_for("the plan card", lambda: next((m for m in bot.thread(sid) if "approve" in buttons(m)), None))
    assert _cancel_button(plan)["confirm"]["style"] == "danger"
    click(bot.url, action_id="handoff", value=buttons(plan)["handoff"], user="U1")
    auto = _running(bot, sid, "auto")
    root = bot.thread(sid)[0]
    title = wait_for("the root naming Auto", lambda: (lambda t: "(now in Auto)" in t and t)(
        bot.slack.find("C1", root.ts).blocks[0]["text"]["text"]))
    assert title.startswith(f"*HITL session* `{sid}`")  # the mode it started in, kept after the hand-off

    _refused(bot, message=auto, session_id=sid)
    click(bot.url, action_id="cancel", value=buttons(auto)["cancel"], user="U1")
    wait_for("the cancelled session", lambda: _status(bot.engine, sid) == "cancelled")
    assert set(_jobs(bot.engine, sid)) == {"cancelled"}  # its queued Auto job will not run
    shown = wait_for("Auto's message without buttons", lambda: (lambda m: not buttons(m) and m)(
        bot.slack.find("C1", auto.ts)))
    assert "cancelled by <@U1>" in text_of(shown)


def test_cancelling_a_search_from_its_progress_message(bot: Bot) -> None:
    sid = hitl_script.finished_auto(bot.engine, bot.settings, bot.workdir, channel="C1")
    click(bot.url, action_id="search", value=buttons(bot.summary(sid))["search"], user="U1")
    with Session(bot.engine) as s:
        thread = sessions.get_session(s, session_id=sid).slack_thread_ts
    search = wait_for("the search session", lambda: _search_in(bot.engine, thread))
    progress = _running(bot, search.id, "progress:search", thread_of=sid)

    _refused(bot, message=progress, session_id=search.id)
    click(bot.url, action_id="cancel", value=buttons(progress)["cancel"], user="U1")
    wait_for("the cancelled search", lambda: _status(bot.engine, search.id) == "cancelled")
    assert _jobs(bot.engine, search.id) == ["cancelled"]  # its queued search_node job
    wait_for("the progress message without buttons", lambda: not buttons(bot.slack.find("C1", progress.ts)))
    root = next(m for m in bot.thread(sid) if "*Search session*" in text_of(m))
    wait_for("the search's root saying so", lambda: "cancelled by <@U1>" in text_of(bot.slack.find("C1", root.ts)))


class _Stopped(Exception):
    """The runner stops right after it wrote the kernel, as if the evaluation were under way."""


def test_cancelling_a_hitl_cycle_from_its_progress_message(bot: Bot) -> None:
    sid = hitl_script.start(bot.engine, channel="C1")
    hitl = hitl_script.machine(bot.engine, bot.settings, bot.workdir)
    hitl.run(sid)
    decide(bot.engine, session_id=sid, actor="U1", action="approve", via="button")

    def stop_after_implement(action: str, outputs: dict[str, Any]) -> None:
        if action == "implement":
            raise _Stopped

    with pytest.raises(_Stopped):
        dataclasses.replace(hitl, on_step=stop_after_implement).run(sid)
    with Session(bot.engine) as s:
        candidate = sessions.get_steps(s, session_id=sid)[-1].outputs["candidate_id"]
    cycle = _running(bot, sid, f"progress:{candidate}")
    click(bot.url, action_id="cancel", value=buttons(cycle)["cancel"], user="U1")
    wait_for("the cancelled session", lambda: _status(bot.engine, sid) == "cancelled")
    shown = wait_for("the cycle's message without buttons", lambda: (lambda m: not buttons(m) and m)(
        bot.slack.find("C1", cycle.ts)))
    assert "cancelled by <@U1>" in text_of(shown)
