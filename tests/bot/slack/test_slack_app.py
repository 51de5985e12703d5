"""The Slack app over HTTP: the real Bolt app behind kernelbot's HTTP server, signed requests, the fake Web API."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import Session, select

from bot.slack.app import SlackSettingsError, build_app
from storage.connect import open_database
from storage.models import Job, KernelSession
from storage.settings import Settings, load_settings
from tests.fakes.slack_api import BOT_TOKEN, FakeSlack, fake_slack
from tests.support.slack_http import SECRET, command, send_command, served


@pytest.fixture
def app_url(tmp_path: Path) -> Iterator[tuple[str, Settings, FakeSlack]]:
    with fake_slack() as fake:
        settings = load_settings({"KERNELBOT_HOME": str(tmp_path), "SLACK_BOT_TOKEN": BOT_TOKEN,
                                  "SLACK_SIGNING_SECRET": SECRET, "KERNELBOT_SLACK_API_URL": fake.base_url})
        with served(build_app(settings, open_database(settings))) as url:
            yield url, settings, fake


def test_commands_are_acked_at_once_and_answered_ephemerally(app_url: tuple[str, Settings, FakeSlack]) -> None:
    url, _, fake = app_url
    started = time.monotonic()
    status, ack = send_command(url, "help", response_url=fake.response_url("help"))
    assert status == 200 and ack == {}  # the ack carries nothing: the answer goes to the response_url
    assert time.monotonic() - started < 3.0
    body = fake.wait_response("help")
    assert body["response_type"] == "ephemeral" and "/kernel new" in body["text"]
    status, body = command(url, "serch softmax", fake=fake)
    assert status == 200 and "Did you mean `search`?" in body["text"]
    assert "No task `nosuch`" in command(url, "new nosuch", fake=fake)[1]["text"]
    assert "`softmax`" in command(url, "tasks", fake=fake)[1]["text"]
    bad_strategy = command(url, "search softmax --strategy bean", fake=fake)[1]["text"]
    assert "must be one of beam, parallel, tune, hybrid" in bad_strategy


def test_new_auto_and_search_record_a_session_and_queue_its_work(app_url: tuple[str, Settings, FakeSlack]) -> None:
    url, settings, fake = app_url
    assert "Started HITL session" in command(url, "new softmax --brain offline", fake=fake)[1]["text"]
    assert "Started Auto session" in command(url, "auto layer_norm --budget 2", fake=fake)[1]["text"]
    assert "beam search" in command(url, "search rms_norm --budget 3", fake=fake)[1]["text"]
    with Session(open_database(settings)) as s:
        rows = s.exec(select(KernelSession).order_by(KernelSession.created_at)).all()
        kinds = sorted(j.kind for j in s.exec(select(Job)).all())
    assert [(r.mode, r.task, r.owner, r.slack_channel) for r in rows] == [
        ("hitl", "softmax", "U1", "C1"), ("auto", "layer_norm", "U1", "C1"), ("search", "rms_norm", "U1", "C1")]
    assert rows[1].budget == {"brain": "offline", "iterations": 2}
    assert kinds == ["auto_session", "hitl_advance", "search_node"]
    listed = command(url, "list", fake=fake)[1]["text"]
    assert all(r.id in listed for r in rows)
    assert all(r.id in command(url, "status", fake=fake)[1]["text"] for r in rows)  # every one is active
    assert "may steer this session" in command(url, f"cancel {rows[0].id}", fake=fake, user="U2")[1]["text"]
    assert "Cancelled" in command(url, f"cancel {rows[0].id}", fake=fake)[1]["text"]
    assert "already cancelled" in command(url, f"cancel {rows[0].id}", fake=fake)[1]["text"]
    with Session(open_database(settings)) as s:
        assert s.get(KernelSession, rows[0].id).status == "cancelled"
        assert {j.status for j in s.exec(select(Job).where(Job.session_id == rows[0].id))} == {"cancelled"}
    assert "no session nosuch" in command(url, "status nosuch", fake=fake)[1]["text"]


def test_bad_signatures_and_stale_requests_are_refused(app_url: tuple[str, Settings, FakeSlack]) -> None:
    url, _, fake = app_url
    assert command(url, "help", fake=fake, secret="wrong")[0] == 401
    assert command(url, "help", fake=fake, age=600)[0] == 401


def test_the_health_check_answers(app_url: tuple[str, Settings, FakeSlack]) -> None:
    url, _, _ = app_url
    with urllib.request.urlopen(url.replace("/slack/events", "/healthz"), timeout=5) as response:
        assert response.status == 200 and b'"ok": true' in response.read()


def test_serve_without_tokens_says_what_is_missing(tmp_path: Path) -> None:
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path)})
    with pytest.raises(SlackSettingsError, match="SLACK_BOT_TOKEN"):
        build_app(settings, open_database(settings))
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path), "SLACK_BOT_TOKEN": BOT_TOKEN,
                              "SLACK_SIGNING_SECRET": SECRET, "KERNELBOT_STEERERS": "U1, bob"})
    with pytest.raises(SlackSettingsError, match="KERNELBOT_STEERERS: bob"):
        build_app(settings, open_database(settings))
    with pytest.raises(SlackSettingsError, match="SLACK_APP_TOKEN"):
        build_app(settings.__class__(**{**settings.__dict__, "steerers": ""}), open_database(settings),
                  socket_mode=True)
