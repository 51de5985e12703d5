"""A local fake of Slack's Socket Mode, for the real `slack_sdk` Socket Mode client (and so for Bolt's handler).

The protocol, as Slack runs it and as this fake does: the app calls `apps.connections.open` (answered by the Web
API fake with `fake_slack.socket_url`), opens a WebSocket at that `.../link/?ticket=...` address and is greeted
with `hello`. Slack then pushes envelopes (`slash_commands`, `interactive`, `events_api`), each of which the app
must ack with `{"envelope_id": ...}` within 3 s, with a `payload` only where the envelope accepts one. Slack
recycles connections with a `disconnect` message; the app opens a new one through a new `apps.connections.open`.

The fake is strict where a test would want to know: each ticket admits one connection (so a client that reuses
a stale URL instead of asking again is refused), an envelope not acked within 3 s lands in `unacked` (the test
may then send the retry Slack would), and acks Slack would reject or ignore land in `problems`.
"""

from __future__ import annotations

import http
import itertools
import json
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.sync.server import Server, ServerConnection, serve

from tests.fakes.slack_api import TEAM, FakeSlack

ACK_SECONDS = 3.0  # Slack's deadline for an ack
APP_ID = "A0001"
ENVELOPE_TYPES = ("slash_commands", "interactive", "events_api")


# -- payloads, as Slack puts them in envelopes (the shapes of tests/support/slack_http.py, as JSON) ----------------
def slash_command(text: str, *, user: str = "U1", channel: str = "C1", trigger_id: str = "1.2.3",
                  response_url: str = "http://127.0.0.1:9/unused") -> dict[str, Any]:
    """`/kernel TEXT`: in Socket Mode the command's form fields arrive as a JSON object."""
    return {"token": "unused", "team_id": TEAM, "team_domain": "kernelbot-test", "channel_id": channel,
            "channel_name": "kernels", "user_id": user, "user_name": user, "command": "/kernel", "text": text,
            "api_app_id": APP_ID, "is_enterprise_install": "false", "response_url": response_url,
            "trigger_id": trigger_id}


def block_actions(*, action_id: str, value: str, user: str = "U1", channel: str = "C1",
                  message_ts: str = "") -> dict[str, Any]:
    """A click on a button of a message in a channel."""
    return {"type": "block_actions", "user": {"id": user, "username": user}, "team": {"id": TEAM},
            "api_app_id": APP_ID, "trigger_id": f"trigger-{time.monotonic_ns()}", "channel": {"id": channel},
            "container": {"type": "message", "message_ts": message_ts, "channel_id": channel},
            "message": {"ts": message_ts}, "response_url": "http://127.0.0.1:9/unused",
            "actions": [{"action_id": action_id, "block_id": "b", "type": "button", "value": value,
                         "action_ts": str(time.time())}]}


def event_callback(inner: dict[str, Any], *, event_id: str | None = None) -> dict[str, Any]:
    """An Events API delivery of `inner`."""
    return {"token": "unused", "team_id": TEAM, "api_app_id": APP_ID, "type": "event_callback",
            "event_id": event_id or f"Ev{time.monotonic_ns()}", "event_time": int(time.time()), "event": inner}


def accepts_response_payload(kind: str, payload: dict[str, Any]) -> bool:
    """Whether Slack reads a payload in the ack: a command's reply, a view submission's response_action."""
    if kind == "slash_commands":
        return True
    return kind == "interactive" and payload.get("type") in ("view_submission", "block_suggestion")


# -- the fake's state -----------------------------------------------------------------------------------------------
@dataclass
class Envelope:
    """One delivery: what went out, on which connection, and the ack that came back (if any)."""

    envelope_id: str
    type: str
    payload: dict[str, Any]
    accepts_response_payload: bool
    retry_attempt: int = 0
    retry_reason: str = ""
    connection: int = 0  # the number of the connection it went out on
    sent_at: float = 0.0
    ack: dict[str, Any] | None = None  # the client's ack message, as received
    acked_at: float | None = None
    acked: threading.Event = field(default_factory=threading.Event, repr=False)

    def wire(self) -> dict[str, Any]:
        return {"envelope_id": self.envelope_id, "type": self.type, "payload": self.payload,
                "accepts_response_payload": self.accepts_response_payload, "retry_attempt": self.retry_attempt,
                "retry_reason": self.retry_reason}

    @property
    def ack_seconds(self) -> float | None:
        return None if self.acked_at is None else self.acked_at - self.sent_at

    @property
    def ack_payload(self) -> dict[str, Any] | None:
        return None if self.ack is None else self.ack.get("payload")


@dataclass
class Connection:
    number: int  # 1, 2, ... in the order they were accepted
    ws: ServerConnection = field(repr=False)
    retiring: bool = False  # told to disconnect: no new envelopes go here
    closed: threading.Event = field(default_factory=threading.Event)


@dataclass
class FakeSocketMode:
    slack: FakeSlack
    host: str = "127.0.0.1"
    port: int = 0
    connections: list[Connection] = field(default_factory=list)
    envelopes: list[Envelope] = field(default_factory=list)
    unacked: list[Envelope] = field(default_factory=list)  # not acked within ACK_SECONDS
    problems: list[str] = field(default_factory=list)  # what Slack would refuse or ignore
    refused: int = 0  # handshakes refused for a bad ticket
    _tickets: set[str] = field(default_factory=set)
    _timers: list[threading.Timer] = field(default_factory=list)
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _numbers: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    # -- tickets: one connection each ----------------------------------------------------------------------------
    def issue_ticket(self) -> str:
        """A fresh URL for the next apps.connections.open to hand out (the caller holds `_changed`)."""
        ticket = uuid.uuid4().hex
        self._tickets.add(ticket)
        with self.slack.lock:
            self.slack.socket_url = f"ws://{self.host}:{self.port}/link/?ticket={ticket}&app_id={APP_ID}"
        return ticket

    def check_handshake(self, ws: ServerConnection, request: Request) -> Response | None:
        """Admit a WebSocket only at /link/ with a ticket handed out and not used yet (websockets' hook)."""
        url = urllib.parse.urlsplit(request.path)
        ticket = (urllib.parse.parse_qs(url.query).get("ticket") or [""])[0]
        with self._changed:
            if url.path != "/link/" or ticket not in self._tickets:
                self.refused += 1
                self.problems.append(f"refused a WebSocket at {url.path} with an unknown or used ticket")
                return ws.respond(http.HTTPStatus.UNAUTHORIZED, "invalid or expired ticket\n")
            self._tickets.discard(ticket)
            self.issue_ticket()
        return None

    # -- a connection's life ---------------------------------------------------------------------------------------
    def handle(self, ws: ServerConnection) -> None:
        """Greet the client, then read its acks until it goes away."""
        connection = self._open(ws)
        try:
            for raw in ws:
                self._receive(connection, raw)
        except ConnectionClosed:
            pass  # the builtin client drops the TCP socket without a close frame
        finally:
            with self._changed:
                connection.closed.set()
                self._changed.notify_all()

    def _open(self, ws: ServerConnection) -> Connection:
        with self._changed:
            connection = Connection(number=next(self._numbers), ws=ws)
            live = sum(1 for c in self.connections if not c.closed.is_set()) + 1
            hello = {"type": "hello", "num_connections": live,
                     "debug_info": {"host": f"applink-fake-{connection.number}", "build_number": 1,
                                    "approximate_connection_time": 18060},
                     "connection_info": {"app_id": APP_ID}}
            ws.send(json.dumps(hello))  # before anyone can route an envelope here
            self.connections.append(connection)
            self._changed.notify_all()
        return connection

    def _receive(self, connection: Connection, raw: str | bytes) -> None:
        try:
            message = json.loads(raw)
            envelope_id = message["envelope_id"]
        except (json.JSONDecodeError, TypeError, KeyError):
            with self._changed:
                self.problems.append(f"connection {connection.number} sent something that is not an ack: "
                                     f"{raw!r:.200}")
            return
        with self._changed:
            envelope = next((e for e in self.envelopes if e.envelope_id == envelope_id), None)
            if envelope is None:
                self.problems.append(f"ack for an envelope never sent: {envelope_id}")
                return
            if envelope.ack is not None:
                self.problems.append(f"{envelope.type} envelope {envelope_id} acked twice")
                return
            if message.get("payload") is not None and not envelope.accepts_response_payload:
                self.problems.append(f"{envelope.type} envelope {envelope_id} acked with a payload Slack ignores")
            envelope.ack, envelope.acked_at = message, time.monotonic()
            envelope.acked.set()
            self._changed.notify_all()

    def _deadline(self, envelope: Envelope) -> None:
        with self._changed:
            if envelope.ack is None:
                self.unacked.append(envelope)

    def _open_to_envelopes(self) -> list[Connection]:
        return [c for c in self.connections if not c.retiring and not c.closed.is_set()]

    def _target(self, timeout: float) -> Connection:
        """The newest live connection that was not told to go (waiting for one during a reconnect)."""
        with self._changed:
            if not self._changed.wait_for(self._open_to_envelopes, timeout):
                raise AssertionError(f"no Socket Mode connection to deliver to after {timeout} s "
                                     f"({len(self.connections)} connections so far)")
            return self._open_to_envelopes()[-1]

    # -- what a test does ---------------------------------------------------------------------------------------------
    def send(self, kind: str, payload: dict[str, Any], *, retry_attempt: int = 0, retry_reason: str = "",
             timeout: float = 5.0) -> Envelope:
        """Deliver one envelope on the newest live connection and start its 3 s ack clock."""
        if kind not in ENVELOPE_TYPES:
            raise ValueError(f"{kind=} must be one of {', '.join(ENVELOPE_TYPES)}")
        connection = self._target(timeout)
        envelope = Envelope(envelope_id=str(uuid.uuid4()), type=kind, payload=payload,
                            accepts_response_payload=accepts_response_payload(kind, payload),
                            retry_attempt=retry_attempt, retry_reason=retry_reason, connection=connection.number)
        with self._changed:
            self.envelopes.append(envelope)
            envelope.sent_at = time.monotonic()
        connection.ws.send(json.dumps(envelope.wire()))
        timer = threading.Timer(ACK_SECONDS, self._deadline, args=(envelope,))
        timer.daemon = True
        timer.start()
        self._timers.append(timer)
        return envelope

    def retry(self, envelope: Envelope, reason: str = "timeout") -> Envelope:
        """Slack's redelivery of an envelope it counts as failed: same payload, a new envelope, the attempt counted."""
        return self.send(envelope.type, envelope.payload, retry_attempt=envelope.retry_attempt + 1,
                         retry_reason=reason)

    def wait_ack(self, envelope: Envelope, timeout: float = ACK_SECONDS) -> dict[str, Any] | None:
        """The ack's payload (None when it carried none); AssertionError when no ack came in time."""
        if not envelope.acked.wait(timeout):
            raise AssertionError(f"{envelope.type} envelope {envelope.envelope_id} was not acked within {timeout} s")
        seconds = envelope.ack_seconds or 0.0
        if seconds > ACK_SECONDS:
            raise AssertionError(f"{envelope.type} envelope acked after {seconds:.2f} s; Slack waits {ACK_SECONDS} s")
        return envelope.ack_payload

    def request(self, kind: str, payload: dict[str, Any]) -> dict[str, Any] | None:
        """Send an envelope and wait for its ack, as Slack does; returns the ack's payload."""
        return self.wait_ack(self.send(kind, payload))

    def command(self, text: str, **kwargs: Any) -> dict[str, Any]:
        """`/kernel TEXT` acked within 3 s, then its answer as posted to its response_url at the Web API fake."""
        key = f"socket-{uuid.uuid4().hex[:12]}"
        self.request("slash_commands", slash_command(text, response_url=self.slack.response_url(key), **kwargs))
        return self.slack.wait_response(key)

    def disconnect(self, reason: str = "refresh_requested") -> None:
        """Ask every live connection to go away, as Slack does before recycling one; nothing new is sent there."""
        with self._changed:
            live = [c for c in self.connections if not c.retiring and not c.closed.is_set()]
            for connection in live:
                connection.retiring = True
        for connection in live:
            connection.ws.send(json.dumps({"type": "disconnect", "reason": reason,
                                           "debug_info": {"host": f"applink-fake-{connection.number}"}}))

    def wait_connections(self, count: int, timeout: float = 10.0) -> None:
        """Until `count` connections were accepted in all (AssertionError after `timeout`)."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self.connections) >= count, timeout):
                raise AssertionError(f"{len(self.connections)} Socket Mode connections after {timeout} s, "
                                     f"expected {count}")

    def wait_closed(self, number: int, timeout: float = 10.0) -> None:
        """Until the client has dropped connection `number` (AssertionError after `timeout`)."""
        if not self.connections[number - 1].closed.wait(timeout):
            raise AssertionError(f"the client kept Socket Mode connection {number} open for {timeout} s")

    @property
    def connection_count(self) -> int:
        return len(self.connections)

    def live(self) -> list[Connection]:
        with self._changed:
            return [c for c in self.connections if not c.closed.is_set()]

    def close(self) -> None:
        for timer in self._timers:
            timer.cancel()
        for connection in self.live():
            connection.ws.close()


@contextmanager
def fake_socket_mode(slack: FakeSlack) -> Iterator[FakeSocketMode]:
    """Socket Mode on a free local port, wired into `slack` (the Web API fake) through `socket_url`."""
    fake = FakeSocketMode(slack)
    server: Server = serve(fake.handle, "127.0.0.1", 0, process_request=fake.check_handshake, compression=None)
    fake.port = server.socket.getsockname()[1]
    with fake._changed:
        fake.issue_ticket()
    thread = threading.Thread(target=server.serve_forever, name="fake-socket-mode", daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.close()
        server.shutdown()
        thread.join(timeout=10)
        with slack.lock:
            slack.socket_url = ""
