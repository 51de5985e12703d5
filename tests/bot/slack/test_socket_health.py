"""The Socket Mode health record: `serve` writes the connection's state every few seconds and the container's
health check reads it (healthy while connected, or briefly reconnecting; unhealthy when down past the grace or
when the record went stale). The verdict, the record's file, and `serve` against the Socket Mode fake."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from bot.cli import healthcheck
from bot.slack.server import ServeOptions, Server
from bot.slack.socket_health import (
    GRACE_SECONDS,
    STALE_SECONDS,
    SocketRecorder,
    SocketState,
    assess,
    read_state,
    state_path,
)
from storage.connect import open_database
from storage.settings import load_settings
from tests.fakes.slack_api import APP_TOKEN, BOT_TOKEN, fake_slack
from tests.fakes.socket_mode import fake_socket_mode
from tests.support.reading import wait_for

NOW = 1_800_000_000.0


def test_the_verdict_on_a_record() -> None:
    ok, why = assess(None, now=NOW)
    assert not ok and "has not recorded" in why
    ok, why = assess(SocketState(connected=True, since=NOW - 600, checked=NOW - 2), now=NOW)
    assert ok and "connected since" in why and "(600 s)" in why
    ok, why = assess(SocketState(connected=True, since=NOW - 600, checked=NOW - STALE_SECONDS - 1), now=NOW)
    assert not ok and "hung or stopped" in why
    ok, why = assess(SocketState(connected=False, since=NOW - 10, checked=NOW - 1), now=NOW)
    assert ok and "reconnecting for 10 s" in why
    ok, why = assess(SocketState(connected=False, since=NOW - GRACE_SECONDS - 5, checked=NOW - 1), now=NOW)
    assert not ok and "disconnected since" in why and f"more than {GRACE_SECONDS:.0f} s" in why


def test_the_record_keeps_since_across_looks_and_is_read_back(tmp_path: Path) -> None:
    recorder = SocketRecorder(state_path(tmp_path))
    recorder.record(True, NOW)
    recorder.record(True, NOW + 5)
    state = read_state(state_path(tmp_path))
    assert state == SocketState(connected=True, since=NOW, checked=NOW + 5, pid=os.getpid())
    recorder.record(False, NOW + 10)
    state = read_state(state_path(tmp_path))
    assert state is not None and (state.connected, state.since, state.checked) == (False, NOW + 10, NOW + 10)
    assert [p.name for p in tmp_path.iterdir()] == ["socket-mode.json"]  # no temporary file left behind
    state_path(tmp_path).write_text("{not json")
    with pytest.raises(ValueError, match="unreadable"):
        read_state(state_path(tmp_path))


def test_the_health_check_of_serve_in_socket_mode_reads_the_record(tmp_path: Path) -> None:
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path)})
    ok, why = healthcheck.assess(["kernelbot", "serve"], settings)
    assert not ok and "has not recorded its Socket Mode connection" in why
    SocketRecorder(state_path(tmp_path)).record(True, time.time())
    ok, why = healthcheck.assess(["kernelbot", "serve"], settings)
    assert ok and "Socket Mode connected" in why and "SQLite" in why
    state_path(tmp_path).write_text('{"connected": true}')
    ok, why = healthcheck.assess(["kernelbot", "serve"], settings)
    assert not ok and "not a Socket Mode record" in why


def test_serve_records_its_socket_connected_then_disconnected(tmp_path: Path) -> None:
    with fake_slack() as slack, fake_socket_mode(slack) as socket:
        settings = load_settings({"KERNELBOT_HOME": str(tmp_path), "SLACK_BOT_TOKEN": BOT_TOKEN,
                                  "SLACK_APP_TOKEN": APP_TOKEN, "KERNELBOT_SLACK_API_URL": slack.base_url})
        server = Server(settings, open_database(settings), ServeOptions(http=False), socket_record_seconds=0.1)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            socket.wait_connections(1)
            up = wait_for("a connected record", lambda: (s := read_state(state_path(tmp_path))) and s.connected and s)
            assert healthcheck.assess(["kernelbot", "serve"], settings)[0]
            with slack.lock:
                slack.socket_url = ""  # Slack's side goes away and stays away: apps.connections.open fails
            socket.close()
            down = wait_for("a disconnected record", lambda: (s := read_state(state_path(tmp_path)))
                            and not s.connected and s, timeout=10)
            assert down.since >= up.checked and down.checked >= down.since
            ok, why = healthcheck.assess(["kernelbot", "serve"], settings)
            assert ok and "reconnecting" in why  # within the grace: Slack's refreshes look like this briefly
            assert not assess(down, now=down.since + GRACE_SECONDS + 1)[0]
        finally:
            server.shutdown(grace_seconds=5)
