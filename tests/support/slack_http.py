"""Signed Slack requests to a served Bolt app, as Slack sends them: slash commands and interactions as forms,
events as JSON, each with `X-Slack-Signature` over `v0:{timestamp}:{body}`."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from slack_bolt import App

from bot.slack.http_mode import make_server, serve_in_thread
from tests.fakes.slack_api import FakeSlack

SECRET = "test-signing-secret"
_COMMANDS = itertools.count(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port} after {timeout} s")


@contextmanager
def served(app: App) -> Iterator[str]:
    """The app behind kernelbot's HTTP server on a free port; yields the /slack/events URL."""
    port = free_port()
    server = make_server(app, host="127.0.0.1", port=port)
    serve_in_thread(server)
    try:
        yield f"http://127.0.0.1:{port}/slack/events"
    finally:
        server.shutdown()
        server.server_close()


def signed_post(url: str, body: str, content_type: str, *, secret: str = SECRET, age: float = 0.0,
                timeout: float = 10.0) -> tuple[int, dict[str, Any]]:
    stamp = str(int(time.time() - age))
    signature = "v0=" + hmac.new(secret.encode(), f"v0:{stamp}:{body}".encode(), hashlib.sha256).hexdigest()
    request = urllib.request.Request(url, data=body.encode(), headers={
        "Content-Type": content_type, "X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": signature})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw.strip() else {}
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def command(url: str, text: str, *, fake: FakeSlack, user: str = "U1", channel: str = "C1",
            trigger_id: str = "1.2.3", answered: bool = True, answer_timeout: float = 10.0,
            **kwargs: Any) -> tuple[int, dict[str, Any]]:
    """`/kernel TEXT` as Slack posts it, with its response_url at `fake`: (the ack's HTTP status, the answer
    posted to the response_url). The ack itself carries nothing; with `answered=False` (a command that opens a
    modal) the ack's body is returned instead of waiting for an answer."""
    key = f"cmd-{next(_COMMANDS)}"
    status, ack = send_command(url, text, response_url=fake.response_url(key), user=user, channel=channel,
                               trigger_id=trigger_id, **kwargs)
    if status != 200 or not answered:
        return status, ack
    return status, fake.wait_response(key, answer_timeout)


def send_command(url: str, text: str, *, response_url: str, user: str = "U1", channel: str = "C1",
                 trigger_id: str = "1.2.3", **kwargs: Any) -> tuple[int, dict[str, Any]]:
    """Post `/kernel TEXT` and return the ack (status, body) without waiting for the answer."""
    body = urllib.parse.urlencode({"command": "/kernel", "text": text, "user_id": user, "channel_id": channel,
                                   "team_id": "T0001", "response_url": response_url, "trigger_id": trigger_id})
    return signed_post(url, body, "application/x-www-form-urlencoded", **kwargs)


def interaction(url: str, payload: dict[str, Any], **kwargs: Any) -> tuple[int, dict[str, Any]]:
    """A block action or a view submission: the JSON payload in a `payload` form field."""
    body = urllib.parse.urlencode({"payload": json.dumps(payload)})
    return signed_post(url, body, "application/x-www-form-urlencoded", **kwargs)


def click(url: str, *, action_id: str, value: str, user: str = "U1", channel: str = "C1", message_ts: str = "",
          **kwargs: Any) -> tuple[int, dict[str, Any]]:
    """A click on a button of a message in a channel."""
    return interaction(url, {
        "type": "block_actions", "user": {"id": user, "username": user}, "team": {"id": "T0001"},
        "api_app_id": "A0001", "trigger_id": f"trigger-{time.monotonic_ns()}", "channel": {"id": channel},
        "container": {"type": "message", "message_ts": message_ts, "channel_id": channel},
        "message": {"ts": message_ts}, "response_url": "http://127.0.0.1:9/unused",
        "actions": [{"action_id": action_id, "block_id": "b", "type": "button", "value": value,
                     "action_ts": str(time.time())}]}, **kwargs)


def submit_view(url: str, view: dict[str, Any], values: dict[str, dict[str, dict[str, Any]]], *, user: str = "U1",
                **kwargs: Any) -> tuple[int, dict[str, Any]]:
    """Submit a modal the app opened (`view` as the fake stored it) with these input values."""
    submitted = {**view, "state": {"values": values}}
    return interaction(url, {"type": "view_submission", "user": {"id": user, "username": user},
                             "team": {"id": "T0001"}, "api_app_id": "A0001", "view": submitted}, **kwargs)


def event(url: str, inner: dict[str, Any], *, event_id: str | None = None, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    """An Events API delivery (`event_callback`) of `inner`."""
    body = json.dumps({"token": "unused", "team_id": "T0001", "api_app_id": "A0001", "type": "event_callback",
                       "event_id": event_id or f"Ev{time.monotonic_ns()}", "event_time": int(time.time()),
                       "event": inner})
    return signed_post(url, body, "application/json", **kwargs)
