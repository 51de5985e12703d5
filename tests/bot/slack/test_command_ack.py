"""`/kernel` is acked before any database work: under a write-locked SQLite database (what a busy runner or a
migration holds) the ack still comes within Slack's 3 s, forms still open, and the answer arrives at the
command's response_url once the lock is released; when the response_url refuses it, as an ephemeral message."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url
from sqlmodel import Session, select

from bot.slack.app import LISTENER_THREADS
from storage.connect import open_database
from storage.models import KernelSession
from storage.settings import Settings
from tests.fakes.slack_api import RESPONSES_PER_URL
from tests.support.bot import Served, bot_app
from tests.support.reading import wait_for
from tests.support.slack_http import command, send_command

SLACK_ACK_SECONDS = 3.0


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Served]:
    with bot_app(tmp_path / "home") as served:
        yield served


@contextmanager
def write_locked(settings: Settings) -> Iterator[None]:
    """Another connection holds SQLite's write lock (every kernelbot transaction begins IMMEDIATE, so waits)."""
    locker = sqlite3.connect(str(make_url(settings.database).database), isolation_level=None, timeout=1)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        locker.execute("ROLLBACK")
        locker.close()


def sessions_of(settings: Settings) -> list[KernelSession]:
    with Session(open_database(settings)) as s:
        return list(s.exec(select(KernelSession)).all())


def test_a_command_is_acked_under_a_locked_database_and_answered_once_it_is_free(app: Served) -> None:
    command(app.url, "help", fake=app.fake)  # the first request looks up the bot (auth.test) and imports
    with write_locked(app.settings):
        started = time.monotonic()
        # If the ack waited for the database, this would time out: the lock is only released below.
        status, ack = send_command(app.url, "new softmax --brain offline", response_url=app.fake.response_url("new"),
                                   timeout=SLACK_ACK_SECONDS)
        acked_in = time.monotonic() - started
        assert status == 200 and ack == {} and acked_in < SLACK_ACK_SECONDS
        # A command that needs no database is answered meanwhile; the one that does waits for the lock.
        assert "/kernel new" in command(app.url, "help", fake=app.fake)[1]["text"]
        assert "new" not in app.fake.responses
    answer = app.fake.wait_response("new", timeout=10)
    assert answer["response_type"] == "ephemeral" and "Started HITL session" in answer["text"]
    (record,) = sessions_of(app.settings)
    assert record.id in answer["text"] and (record.owner, record.slack_channel) == ("U1", "C1")


def test_more_waiting_commands_than_listener_threads_are_all_acked_in_time(app: Served) -> None:
    """Commands waiting on the database wait in their own lane: none holds a listener thread an ack needs."""
    command(app.url, "help", fake=app.fake)
    keys = [f"crowd-{i}" for i in range(LISTENER_THREADS + 4)]
    with write_locked(app.settings):
        for key in keys:
            started = time.monotonic()
            status, ack = send_command(app.url, "new softmax --brain offline", response_url=app.fake.response_url(key),
                                       timeout=SLACK_ACK_SECONDS)
            assert status == 200 and ack == {} and time.monotonic() - started < SLACK_ACK_SECONDS
    answers = [app.fake.wait_response(key, timeout=30) for key in keys]
    assert all("Started HITL session" in a["text"] for a in answers)
    assert len(sessions_of(app.settings)) == len(keys)


def test_a_form_opens_under_a_locked_database(app: Served) -> None:
    """The trigger lives 3 s: `/kernel port` opens its form right after the ack, with no database work first."""
    command(app.url, "help", fake=app.fake)
    with write_locked(app.settings):
        status, _ = command(app.url, "port", fake=app.fake, trigger_id="trigger-locked", answered=False,
                            timeout=SLACK_ACK_SECONDS)
        assert status == 200
        opened = wait_for("the form", lambda: [a for m, a in app.fake.calls if m == "views.open"], timeout=2.5)
    assert opened[-1]["trigger_id"] == "trigger-locked"


def test_an_answer_the_response_url_refuses_comes_as_an_ephemeral_message(app: Served) -> None:
    app.fake.responses["spent"] = [{"text": "earlier"}] * RESPONSES_PER_URL  # Slack takes five answers per command
    status, _ = send_command(app.url, "tasks", response_url=app.fake.response_url("spent"), user="U3",
                             channel="C3")
    assert status == 200
    told = wait_for("the ephemeral answer", lambda: [e for e in app.fake.ephemeral if e.get("user") == "U3"])
    assert told[0]["channel"] == "C3" and "`softmax`" in told[0]["text"]
