"""The Slack app over Socket Mode: the real Bolt app and slack_sdk's builtin WebSocket client, against local fakes
of Slack's Web API and of its Socket Mode endpoint; and `kernelbot serve` as a real process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlmodel import Session, select

from bot.slack.app import SlackSettingsError, build_app
from bot.slack.socket_mode import SocketConnection, connect
from storage.connect import open_database
from storage.models import KernelSession
from storage.settings import Settings, load_settings
from tests.fakes.slack_api import APP_TOKEN, BOT_TOKEN, FakeSlack, fake_slack
from tests.fakes.socket_mode import (
    ACK_SECONDS,
    FakeSocketMode,
    block_actions,
    event_callback,
    fake_socket_mode,
    slash_command,
)
from tests.support.reading import wait_for


@dataclass
class Connected:
    slack: FakeSlack
    socket: FakeSocketMode
    settings: Settings
    connection: SocketConnection

    def opens(self) -> int:
        """How many times the client asked the Web API for a WebSocket URL."""
        return sum(1 for method, _ in self.slack.calls if method == "apps.connections.open")


def socket_settings(home: Path, slack: FakeSlack, app_token: str = APP_TOKEN) -> Settings:
    return load_settings({"KERNELBOT_HOME": str(home), "SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_APP_TOKEN": app_token,
                          "KERNELBOT_SLACK_API_URL": slack.base_url})




@pytest.fixture(scope="module")
def connected(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Connected]:
    """One app on one Socket Mode connection for the module: the builtin client takes ~3 s to close (its socket
    read timeout), so a connection per test would cost more than the tests."""
    with fake_slack() as slack, fake_socket_mode(slack) as socket:
        settings = socket_settings(tmp_path_factory.mktemp("socket-home"), slack)
        connection = connect(build_app(settings, open_database(settings), socket_mode=True), settings)
        try:
            socket.wait_connections(1)
            yield Connected(slack, socket, settings, connection)
        finally:
            connection.close()
        assert socket.problems == []


def test_help_is_acked_within_3_s_and_answered_at_its_response_url(connected: Connected) -> None:
    envelope = connected.socket.send("slash_commands", slash_command(
        "help", response_url=connected.slack.response_url("socket-help")))
    assert connected.socket.wait_ack(envelope) is None  # an empty ack: the answer goes to the response_url
    assert envelope.ack_seconds is not None and envelope.ack_seconds < ACK_SECONDS
    payload = connected.slack.wait_response("socket-help")
    assert payload["response_type"] == "ephemeral" and "/kernel new" in payload["text"]
    assert connected.connection.is_connected()


def test_new_records_a_session_for_the_user_and_channel(connected: Connected) -> None:
    payload = connected.socket.command("new softmax --brain offline", user="U_NEW", channel="C_NEW")
    assert payload is not None and "Started HITL session" in payload["text"]
    with Session(open_database(connected.settings)) as s:
        rows = s.exec(select(KernelSession).where(KernelSession.owner == "U_NEW")).all()
    assert [(r.mode, r.task, r.owner, r.slack_channel) for r in rows] == [("hitl", "softmax", "U_NEW", "C_NEW")]
    assert rows[0].id in payload["text"]


def test_a_click_on_a_gone_session_is_acked_then_answered_ephemerally(connected: Connected) -> None:
    value = json.dumps({"session": "nosuch", "step": 1})
    envelope = connected.socket.send("interactive", block_actions(action_id="approve", value=value, user="U_CLICK",
                                                                  channel="C_CLICK", message_ts="1796000001.000001"))
    assert connected.socket.wait_ack(envelope) is None  # a button's ack carries nothing
    told = wait_for("a listener's work", lambda: [e for e in connected.slack.ephemeral if e.get("user") == "U_CLICK"])
    assert isinstance(told, list) and len(told) == 1
    assert told[0]["channel"] == "C_CLICK" and "`nosuch` no longer exists" in told[0]["text"]


def test_thread_messages_are_acked_and_so_is_slacks_retry(connected: Connected) -> None:
    reply = {"type": "message", "channel": "C_THREAD", "user": "U1", "text": "try a bigger block",
             "ts": "1796000002.000002", "thread_ts": "1796000001.000001", "channel_type": "channel",
             "event_ts": "1796000002.000002"}
    envelope = connected.socket.send("events_api", event_callback(reply, event_id="EvThread1"))
    assert connected.socket.wait_ack(envelope) is None
    retry = connected.socket.retry(envelope)
    assert (retry.retry_attempt, retry.retry_reason) == (1, "timeout")
    assert connected.socket.wait_ack(retry) is None
    assert envelope not in connected.socket.unacked and retry not in connected.socket.unacked


def test_an_event_no_listener_takes_is_left_unacked_as_slack_would_see_it(connected: Connected) -> None:
    """Bolt answers 404 to an event it has no listener for, and its Socket Mode adapter then sends no ack: Slack
    would retry it. The fake keeps the count, which is what makes the acks above mean something."""
    reaction = {"type": "reaction_added", "user": "U1", "reaction": "tada",
                "item": {"type": "message", "channel": "C1", "ts": "1796000001.000001"}}
    envelope = connected.socket.send("events_api", event_callback(reaction))
    wait_for("a listener's work", lambda: envelope in connected.socket.unacked, timeout=ACK_SECONDS + 2)
    assert envelope.ack is None
    with pytest.raises(AssertionError, match="not acked"):
        connected.socket.wait_ack(envelope, timeout=0.1)


def test_a_refresh_makes_the_client_reconnect_and_commands_still_work(connected: Connected) -> None:
    socket, before, opens = connected.socket, connected.socket.connection_count, connected.opens()
    socket.disconnect("refresh_requested")
    socket.wait_connections(before + 1)
    socket.wait_closed(before)  # the client drops the old connection once the new one is up
    assert connected.opens() == opens + 1  # a fresh URL: the old ticket would be refused
    assert [c.number for c in socket.live()] == [before + 1]
    payload = socket.command("help")
    assert payload is not None and "/kernel new" in payload["text"]
    assert socket.envelopes[-1].connection == before + 1 and socket.refused == 0


def test_connect_says_which_setting_is_wrong(tmp_path: Path) -> None:
    with fake_slack() as slack, fake_socket_mode(slack) as socket:
        settings = socket_settings(tmp_path, slack)
        app = build_app(settings, open_database(settings), socket_mode=True)
        with pytest.raises(SlackSettingsError, match=r"refused SLACK_APP_TOKEN at apps.connections.open "
                                                     r"\(invalid_auth\)"):
            connect(app, socket_settings(tmp_path, slack, app_token="xapp-wrong"))
        with pytest.raises(SlackSettingsError, match="SLACK_APP_TOKEN is not set"):
            connect(app, socket_settings(tmp_path, slack, app_token=""))
        slack.socket_url = slack.socket_url.replace("ticket=", "ticket=stale")
        with pytest.raises(SlackSettingsError, match=r"could not open the Socket Mode WebSocket at 127\.0\.0\.1"):
            connect(app, settings)
        assert socket.refused >= 1 and socket.connection_count == 0  # the client may retry once before it is closed
        socket.problems.clear()
        slack.socket_url = ""  # Socket Mode switched off in the app's settings
        with pytest.raises(SlackSettingsError, match=r"\(socket_mode_not_enabled\): turn Socket Mode on"):
            connect(app, settings)


def test_kernelbot_serve_answers_over_socket_mode_and_stops_on_sigterm(tmp_path: Path) -> None:
    with fake_slack() as slack, fake_socket_mode(slack) as socket:
        process = subprocess.Popen([str(Path(sys.executable).parent / "kernelbot"), "serve"],
                                   env=_serve_env(tmp_path, slack), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        try:
            socket.wait_connections(1, timeout=20)
            payload = socket.command("help")
            assert payload is not None and "/kernel new" in payload["text"]
            process.send_signal(signal.SIGTERM)
            started = time.monotonic()
            code = process.wait(timeout=15)
            stopped_in = time.monotonic() - started
        finally:
            if process.poll() is None:
                process.kill()
            out, err = process.communicate(timeout=5)
        assert code == 0, err
        assert stopped_in < 10, f"took {stopped_in:.1f} s to stop"
        assert "serving Slack on Socket Mode" in out
        wait_for("a listener's work", lambda: socket.live() == [])  # the process took its connection with it
        assert socket.problems == []


def _serve_env(home: Path, slack: FakeSlack) -> dict[str, str]:
    """The caller's environment without any Slack or kernelbot settings, then the fakes' ones."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "KERNELBOT_"))}
    return {**env, "KERNELBOT_HOME": str(home), "SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_APP_TOKEN": APP_TOKEN,
            "KERNELBOT_SLACK_API_URL": slack.base_url, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
