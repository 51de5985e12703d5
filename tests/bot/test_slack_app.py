"""The Slack app over HTTP: the real Bolt app and its HTTP server, signed requests, the fake Slack Web API."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import Session, select

from bot.slack_app import SlackSettingsError, build_app
from storage.database import open_database
from storage.models import Job, KernelSession
from storage.settings import Settings, load_settings
from tests.fakes.slack_api import BOT_TOKEN, fake_slack

SECRET = "test-signing-secret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Settings]]:
    with fake_slack() as fake:
        settings = load_settings({"KERNELBOT_HOME": str(tmp_path), "SLACK_BOT_TOKEN": BOT_TOKEN,
                                  "SLACK_SIGNING_SECRET": SECRET, "KERNELBOT_SLACK_API_URL": fake.base_url})
        app = build_app(settings, open_database(settings))
        port = _free_port()
        threading.Thread(target=app.start, kwargs={"port": port, "path": "/slack/events"}, daemon=True).start()
        url = f"http://127.0.0.1:{port}/slack/events"
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield url, settings


def _post(url: str, text: str, *, secret: str = SECRET, age: float = 0.0, user: str = "U1") -> tuple[int, dict]:
    body = urllib.parse.urlencode({"command": "/kernel", "text": text, "user_id": user, "channel_id": "C1",
                                   "team_id": "T0001", "response_url": "http://127.0.0.1:9/unused",
                                   "trigger_id": "1.2.3"})
    stamp = str(int(time.time() - age))
    signature = "v0=" + hmac.new(secret.encode(), f"v0:{stamp}:{body}".encode(), hashlib.sha256).hexdigest()
    request = urllib.request.Request(url, data=body.encode(), headers={
        "Content-Type": "application/x-www-form-urlencoded", "X-Slack-Request-Timestamp": stamp,
        "X-Slack-Signature": signature})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def test_commands_are_acked_with_an_ephemeral_answer(served: tuple[str, Settings]) -> None:
    url, _ = served
    started = time.monotonic()
    status, body = _post(url, "help")
    assert status == 200 and body["response_type"] == "ephemeral" and "/kernel new" in body["text"]
    assert time.monotonic() - started < 3.0
    status, body = _post(url, "serch softmax")
    assert status == 200 and "Did you mean `search`?" in body["text"]
    assert "No task `nosuch`" in _post(url, "new nosuch")[1]["text"]
    assert "`softmax`" in _post(url, "tasks")[1]["text"]


def test_new_auto_and_search_record_a_session_and_queue_its_work(served: tuple[str, Settings]) -> None:
    url, settings = served
    assert "Started HITL session" in _post(url, "new softmax --brain offline")[1]["text"]
    assert "Started Auto session" in _post(url, "auto layer_norm --budget 2")[1]["text"]
    assert "beam search" in _post(url, "search rms_norm --budget 3")[1]["text"]
    with Session(open_database(settings)) as s:
        rows = s.exec(select(KernelSession).order_by(KernelSession.created_at)).all()
        kinds = sorted(j.kind for j in s.exec(select(Job)).all())
    assert [(r.mode, r.task, r.owner, r.slack_channel) for r in rows] == [
        ("hitl", "softmax", "U1", "C1"), ("auto", "layer_norm", "U1", "C1"), ("search", "rms_norm", "U1", "C1")]
    assert kinds == ["auto_session", "hitl_advance", "search_node"]
    listed = _post(url, "list")[1]["text"]
    assert all(r.id in listed for r in rows)
    assert "may cancel it" in _post(url, f"cancel {rows[0].id}", user="U2")[1]["text"]
    assert "Cancelled" in _post(url, f"cancel {rows[0].id}")[1]["text"]
    assert "no session nosuch" in _post(url, "status nosuch")[1]["text"]


def test_bad_signatures_and_stale_requests_are_refused(served: tuple[str, Settings]) -> None:
    url, _ = served
    assert _post(url, "help", secret="wrong")[0] == 401
    assert _post(url, "help", age=600)[0] == 401


def test_serve_without_tokens_says_what_is_missing(tmp_path: Path) -> None:
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path)})
    with pytest.raises(SlackSettingsError, match="SLACK_BOT_TOKEN"):
        build_app(settings, open_database(settings))
