"""Before a session starts in a channel the bot makes sure it can post there: the rule on conversations.info's
answers, then through the real app and the fake Slack (a private channel the bot is not in refuses with what to
do and starts nothing; a public one is joined and the session's thread arrives)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from slack_sdk import WebClient
from sqlmodel import Session, select

from bot.slack.channel_access import POST, ChannelAccess, decide, decide_join
from bot.slack.outbound.notifier import Notifier
from bot.slack.outbound.sender import ChannelPacer, SlackSender
from storage.connect import open_database
from storage.models import KernelSession, Schedule
from tests.fakes.slack_api import BOT_TOKEN, BOT_USER
from tests.support.bot import Served, bot_app
from tests.support.reading import text_of, wait_for
from tests.support.slack_http import command


# -- the rule --------------------------------------------------------------------------------------------------------
def test_what_conversations_info_says_decides_whether_to_post_join_or_refuse() -> None:
    assert decide("C1", {"id": "C1", "is_channel": True, "is_member": True}) == POST
    assert decide("C1", {"id": "C1", "is_channel": True, "is_member": False}).join
    assert decide("D1", {"id": "D1", "is_im": True}) == POST  # a DM the bot can see is one with the bot
    private = decide("G1", {"id": "G1", "is_private": True, "is_group": True, "is_member": False})
    assert not private.post and not private.join and "/invite @kernelbot" in private.problem
    archived = decide("C2", {"id": "C2", "is_channel": True, "is_member": True, "is_archived": True})
    assert not archived.post and "archived" in archived.problem
    hidden = decide("C3", None, error="channel_not_found")
    assert "/invite @kernelbot" in hidden.problem and "run it in a channel I am in" in hidden.problem
    dm = decide("D2", None, error="channel_not_found")
    assert "direct message" in dm.problem and "/invite" not in dm.problem
    scope = decide("G2", None, error="missing_scope", needed="groups:read")
    assert "lacks the groups:read scope" in scope.problem and "reinstall the app" in scope.problem
    assert decide_join("C1", error=None) == POST
    assert "channels:join" in decide_join("C1", error="missing_scope").problem
    assert "/invite @kernelbot" in decide_join("C1", error="method_not_supported_for_channel_type").problem


# -- through Slack ---------------------------------------------------------------------------------------------------
@pytest.fixture
def app(tmp_path: Path) -> Iterator[Served]:
    with bot_app(tmp_path / "home") as served:
        yield served


def _sessions(app: Served) -> list[KernelSession]:
    with Session(open_database(app.settings)) as s:
        return list(s.exec(select(KernelSession)).all())


def test_a_private_channel_the_bot_is_not_in_starts_nothing_and_says_what_to_do(app: Served) -> None:
    app.fake.add_channel("GSECRET", private=True, members=("U1",), bot=False)
    for text in ("new softmax --brain offline", "auto softmax", "search softmax --budget 2"):
        answer = command(app.url, text, fake=app.fake, channel="GSECRET")[1]["text"]
        assert "invite me with `/invite @kernelbot`" in answer and "Nothing was started." in answer, answer
    scheduled = command(app.url, 'schedule add softmax "0 2 * * *"', fake=app.fake, channel="GSECRET")[1]["text"]
    assert "/invite @kernelbot" in scheduled and "Nothing was scheduled." in scheduled
    posted = command(app.url, "digest now", fake=app.fake, channel="GSECRET")[1]["text"]
    assert "/invite @kernelbot" in posted and "No digest was posted." in posted
    subscribed = command(app.url, "digest subscribe", fake=app.fake, channel="GSECRET")[1]["text"]
    assert "/invite @kernelbot" in subscribed and "not subscribed" in subscribed
    assert _sessions(app) == []
    with Session(open_database(app.settings)) as s:
        assert s.exec(select(Schedule)).all() == []
    assert not any(m == "conversations.join" for m, _ in app.fake.calls)  # a private channel cannot be joined


def test_without_the_scope_to_look_the_person_is_told_which_scope(app: Served) -> None:
    app.fake.scopes = tuple(s for s in (app.fake.scopes or ()) if s != "channels:read")
    answer = command(app.url, "new softmax", fake=app.fake, channel="CNEW")[1]["text"]
    assert "lacks the channels:read scope" in answer and "Nothing was started." in answer
    assert _sessions(app) == []


def test_a_public_channel_the_bot_is_not_in_is_joined_and_the_thread_arrives(app: Served) -> None:
    channel = app.fake.add_channel("CPUBLIC", members=("U1",), bot=False)
    answer = command(app.url, "new softmax --brain offline", fake=app.fake, channel="CPUBLIC")[1]["text"]
    assert "Started HITL session" in answer
    assert BOT_USER in channel.members
    assert ("conversations.join", "CPUBLIC") in [(m, a.get("channel")) for m, a in app.fake.calls]
    (record,) = _sessions(app)
    assert record.slack_channel == "CPUBLIC"
    client = WebClient(token=BOT_TOKEN, base_url=app.fake.base_url, retry_handlers=[])
    notifier = Notifier(open_database(app.settings), SlackSender(client, ChannelPacer(100.0, 100)),
                        poll_seconds=0.05)
    threading.Thread(target=notifier.run, daemon=True).start()
    try:
        root = wait_for("the session's root post", lambda: next(
            (m for m in app.fake.messages.get("CPUBLIC", []) if m.thread_ts is None), None), timeout=10)
    finally:
        notifier.close()
    assert "*HITL session*" in text_of(root) and record.id in text_of(root)


def test_a_channel_found_postable_is_not_asked_about_again_for_a_while(app: Served) -> None:
    access = ChannelAccess(WebClient(token=BOT_TOKEN, base_url=app.fake.base_url, retry_handlers=[]))
    assert access.problem("C1") is None and access.problem("C1") is None
    assert [a.get("channel") for m, a in app.fake.calls if m == "conversations.info"] == ["C1"]
    app.fake.add_channel("GGONE", private=True, bot=False)
    assert access.problem("GGONE") and access.problem("GGONE")  # a refusal is asked again: an invite may follow
    assert [a.get("channel") for m, a in app.fake.calls if m == "conversations.info"] == ["C1", "GGONE", "GGONE"]
