"""Replies in a session's thread: only those addressed to the bot (a mention, or a leading `redirect:`) redirect
it, with the address taken out of what is recorded; the rest is people talking and is left alone. The rule,
then through the real app over signed HTTP with a plan waiting in the thread."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import Session, col, select

from bot.slack.thread_replies import addressed_text
from storage.connect import open_database
from storage.models import Decision, KernelSession
from tests.fakes.slack_api import BOT_USER
from tests.support import hitl_script
from tests.support.bot import Served, bot_app
from tests.support.reading import wait_for
from tests.support.slack_http import event


def test_only_a_reply_addressed_to_the_bot_is_an_instruction() -> None:
    assert addressed_text("looks good!", bot_user="UBOT") is None
    assert addressed_text("can someone redirect: this later?", bot_user="UBOT") is None
    assert addressed_text("<@U2> what do you think?", bot_user="UBOT") is None  # a teammate, not the bot
    assert addressed_text("<@UBOT> use rows of 64", bot_user="UBOT") == "use rows of 64"
    assert addressed_text("<@UBOT|kernelbot>: rows 64", bot_user="UBOT") == "rows 64"
    assert addressed_text("try rows 64 <@UBOT> please", bot_user="UBOT") == "try rows 64 please"
    assert addressed_text("<@UBOT> redirect: rows 64", bot_user="UBOT") == "rows 64"
    assert addressed_text("Redirect: rows 32\nand bf16", bot_user="UBOT") == "rows 32\nand bf16"
    assert addressed_text("redirect: rows 32", bot_user=None) == "rows 32"
    assert addressed_text("<@UBOT>", bot_user="UBOT") is None and addressed_text("redirect:  ", bot_user="U") is None


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Served]:
    with bot_app(tmp_path / "home") as served:
        yield served


def plan_waiting(app: Served, *, thread_ts: str, workdir: Path) -> str:
    """A HITL session whose first plan waits for a person, in a thread of C1."""
    engine = open_database(app.settings)
    session_id = hitl_script.start(engine, channel="C1")
    hitl_script.machine(engine, app.settings, workdir).run(session_id)
    with Session(engine) as s, s.begin():
        record = s.get(KernelSession, session_id)
        assert record is not None and record.status == "awaiting"
        record.slack_thread_ts = thread_ts
        s.add(record)
    return session_id


def reply(app: Served, text: str, *, thread_ts: str, user: str = "U1") -> None:
    status, _ = event(app.url, {"type": "message", "channel": "C1", "user": user, "text": text,
                                "ts": f"{time.time():.6f}", "thread_ts": thread_ts, "channel_type": "channel"})
    assert status == 200


def decisions(app: Served, session_id: str) -> list[tuple[str, str | None, str]]:
    with Session(open_database(app.settings)) as s:
        rows = s.exec(select(Decision).where(Decision.session_id == session_id).order_by(col(Decision.id))).all()
        return [(d.action, d.text, d.actor) for d in rows]


def test_conversation_is_left_alone_and_a_mention_redirects(app: Served, tmp_path: Path) -> None:
    sid = plan_waiting(app, thread_ts="1796000001.000001", workdir=tmp_path / "k")
    reply(app, "looks good!", thread_ts="1796000001.000001")
    reply(app, f"<@{BOT_USER}> use rows of 64", thread_ts="1796000001.000001")
    recorded = wait_for("the redirect", lambda: decisions(app, sid))
    assert recorded == [("redirect", "use rows of 64", "U1")]  # "looks good!" redirected nothing
    assert app.fake.ephemeral == []  # and nobody was told anything about it


def test_the_keyword_redirects_and_an_addressed_reply_not_taken_says_why(app: Served, tmp_path: Path) -> None:
    sid = plan_waiting(app, thread_ts="1796000002.000002", workdir=tmp_path / "k")
    reply(app, "Redirect: rows 32", thread_ts="1796000002.000002", user="U1")
    assert wait_for("the redirect", lambda: decisions(app, sid)) == [("redirect", "rows 32", "U1")]
    reply(app, f"<@{BOT_USER}> rows 8", thread_ts="1796000002.000002", user="U9")  # may not steer
    told = wait_for("the refusal", lambda: [e for e in app.fake.ephemeral if e.get("user") == "U9"])
    assert "not taken as a redirect" in told[0]["text"] and "may steer" in told[0]["text"]
    assert told[0]["thread_ts"] == "1796000002.000002"
    assert decisions(app, sid) == [("redirect", "rows 32", "U1")]
