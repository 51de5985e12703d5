"""The Socket Mode connection's state as `serve` last saw it, kept in a small JSON file in the data directory so
the container's health check (another process) can read it: connected or not, since when, and when `serve` last
looked. `serve` rewrites it every few seconds (atomically: a reader never sees half a file); a record that stops
changing means `serve` is hung. `assess` is the verdict, pure. One `serve` per data directory."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tpu_runner.reports import write_json

STATE_FILE = "socket-mode.json"
RECORD_SECONDS = 5.0  # how often serve records the connection
STALE_SECONDS = 30.0  # a record older than this: serve stopped looking (hung, or gone)
GRACE_SECONDS = 60.0  # disconnected this long (Slack's refreshes reconnect within seconds): unhealthy


@dataclass(frozen=True)
class SocketState:
    connected: bool
    since: float  # wall-clock time the connection became what it is
    checked: float  # wall-clock time serve last looked
    pid: int = 0


def state_path(home: Path) -> Path:
    return home / STATE_FILE


def write_state(path: Path, state: SocketState) -> None:
    """Replace the record in one step (the runner's records are written the same way: a file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, state)


def read_state(path: Path) -> SocketState | None:
    """The record, None when there is none yet; ValueError when it is not one."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is unreadable ({type(exc).__name__}: {exc})") from None
    try:
        return SocketState(connected=bool(data["connected"]), since=float(data["since"]),
                           checked=float(data["checked"]), pid=int(data.get("pid") or 0))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path} is not a Socket Mode record ({type(exc).__name__}: {exc})") from None


@dataclass
class SocketRecorder:
    """Turns serve's periodic look at the connection into records, keeping when the state last changed."""

    path: Path
    pid: int = 0
    _last: SocketState | None = None

    def record(self, connected: bool, now: float) -> SocketState:
        since = self._last.since if self._last is not None and self._last.connected == connected else now
        self._last = SocketState(connected=connected, since=since, checked=now, pid=self.pid or os.getpid())
        write_state(self.path, self._last)
        return self._last


def _at(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S UTC")


def assess(state: SocketState | None, *, now: float, stale_seconds: float = STALE_SECONDS,
           grace_seconds: float = GRACE_SECONDS) -> tuple[bool, str]:
    """(healthy, why) from the record serve keeps."""
    if state is None:
        return False, f"serve has not recorded its Socket Mode connection ({STATE_FILE} in the data directory) yet"
    age = now - state.checked
    if age > stale_seconds:
        return False, (f"serve last recorded its Socket Mode connection {age:.0f} s ago (it does every "
                       f"{RECORD_SECONDS:.0f} s): it is hung or stopped")
    lasted = now - state.since
    if state.connected:
        return True, f"Socket Mode connected since {_at(state.since)} ({lasted:.0f} s), checked {age:.0f} s ago"
    if lasted > grace_seconds:
        return False, (f"Socket Mode disconnected since {_at(state.since)} ({lasted:.0f} s, more than "
                       f"{grace_seconds:.0f} s): serve cannot reach Slack's WebSocket")
    return True, f"Socket Mode reconnecting for {lasted:.0f} s (within {grace_seconds:.0f} s)"
