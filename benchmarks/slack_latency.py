"""How fast the Slack bot answers and delivers, against the tests' fake Slack (real Bolt app, real slack_sdk).

1. Slash commands at a steady rate over HTTP: signed `/kernel` requests sent on a fixed schedule (--rate per
   second for --seconds; each request on its own thread, so a slow answer does not delay the next send), a mix
   of help, list, status, tasks and `new softmax` (which checks the channel, records a session and queues its
   job). Two figures per request, median and p99: the time to the ack (Slack gives up after 3 s) and the time to
   the answer at the command's response_url (code that answers in the ack has both the same). Scenarios: the
   plain load; the same load with the SQLite database write-locked by another connection for --lock-seconds
   from --lock-at seconds in (what a long transaction elsewhere does: every kernelbot transaction begins
   IMMEDIATE and waits up to 30 s); and, as the baseline, the plain load on Bolt's own development server
   (`App.start`, one request at a time) instead of kernelbot's threaded server.
2. Event to message: session events recorded in the database (--events, one a second, round-robin over
   --channels channels), each one timed from its commit to the moment the fake Slack stores its message. With
   the notifier woken when an event is recorded (what `serve` does for decisions taken in Slack) and, as the
   baseline, polling only (what it does for events recorded by runners in other processes; it polls every 0.5 s).

--code DIR runs the same measurements against another checkout of kernelbot (its bot, storage and tests
packages), e.g. the code before a change, without touching it.

    .venv/bin/python benchmarks/slack_latency.py [--rate 20] [--seconds 15] [--events 60] [--channels 3]
        [--lock-at 5] [--lock-seconds 4] [--code DIR]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
_pre = argparse.ArgumentParser(add_help=False)
_pre.add_argument("--code", type=Path, default=REPO)
CODE = _pre.parse_known_args()[0].code.resolve()
sys.path.insert(0, str(CODE))

from slack_bolt.app.app import SlackAppDevelopmentServer  # noqa: E402
from slack_sdk import WebClient  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402
from sqlmodel import Session  # noqa: E402

from bot.slack.app import build_app  # noqa: E402
from bot.slack.outbound.notifier import Notifier  # noqa: E402
from bot.slack.outbound.sender import ChannelPacer, SlackSender  # noqa: E402
from storage import sessions  # noqa: E402
from storage.connect import open_database  # noqa: E402
from storage.settings import Settings, load_settings  # noqa: E402
from tests.fakes.slack_api import BOT_TOKEN, Message, fake_slack  # noqa: E402
from tests.support.slack_http import SECRET, free_port, served, signed_post, wait_for_port  # noqa: E402

MIX = ("help", "list", "status", "tasks", "new softmax --brain offline")
SLACK_ACK_SECONDS = 3.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Answers:
    """When each response_url got its first answer, stamped as the fake Slack stores it (no polling)."""

    arrived: dict[str, float] = field(default_factory=dict)
    events: dict[str, threading.Event] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def expect(self, key: str) -> threading.Event:
        with self.lock:
            return self.events.setdefault(key, threading.Event())

    def wrap(self, respond: Callable[[str, dict[str, Any]], int]) -> Callable[[str, dict[str, Any]], int]:
        def stamped(key: str, body: dict[str, Any]) -> int:
            status = respond(key, body)
            if status == 200 and body.get("text"):
                with self.lock:
                    self.arrived.setdefault(key, time.perf_counter())
                self.expect(key).set()
            return status
        return stamped


@dataclass
class Timings:
    acks: list[float] = field(default_factory=list)
    answers: list[float] = field(default_factory=list)
    failed: int = 0  # no ack within 30 s, an ack that was not 200, or no answer within 30 s
    late_acks: int = 0  # acked after Slack's 3 s: Slack shows the person an error and retries nothing


def steady_load(url: str, base_url: str, answers: Answers, *, rate: float, seconds: float,
                during: Callable[[], None] | None = None) -> Timings:
    """Send at fixed times (starting `during` on its own thread once the load runs); the ack and answer times."""
    timings = Timings()
    lock = threading.Lock()
    threads = []
    start = time.perf_counter() + 0.2
    total = int(rate * seconds)

    def one(i: int) -> None:
        key = f"bench-{time.monotonic_ns()}-{i}"
        arrived = answers.expect(key)
        body = urllib.parse.urlencode({"command": "/kernel", "text": MIX[i % len(MIX)], "user_id": f"U{i % 7}",
                                       "channel_id": f"C{i % 3}", "team_id": "T0001", "trigger_id": "1.2.3",
                                       "response_url": f"{base_url}respond/{key}"})
        sent = time.perf_counter()
        try:
            status, ack = signed_post(url, body, "application/x-www-form-urlencoded", timeout=30)
        except OSError:
            status, ack = 0, {}
        acked = time.perf_counter()
        answered = acked if ack.get("text") else (answers.arrived.get(key) if arrived.wait(30) else None)
        with lock:
            if status != 200 or answered is None:
                timings.failed += 1
                return
            timings.acks.append(acked - sent)
            timings.answers.append(answered - sent)
            timings.late_acks += acked - sent > SLACK_ACK_SECONDS

    if during is not None:
        threading.Thread(target=during, daemon=True).start()
    for i in range(total):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        thread = threading.Thread(target=one, args=(i,), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(timeout=90)
    return timings


def _figures(values: list[float]) -> str:
    if not values:
        return "      none"
    return (f"median {statistics.median(values) * 1e3:7.1f} ms, p99 {percentile(values, 0.99) * 1e3:7.1f} ms, "
            f"max {max(values) * 1e3:7.1f} ms")


def report(name: str, t: Timings) -> None:
    print(f"  {name}: {len(t.acks)} answered, {t.failed} failed, {t.late_acks} acked after 3 s")
    print(f"    ack     {_figures(t.acks)}")
    print(f"    answer  {_figures(t.answers)}")


def write_lock(settings: Settings, *, at: float, seconds: float) -> Callable[[], None]:
    """Hold SQLite's write lock from another connection for `seconds`, `at` seconds after the load starts."""
    path = str(make_url(settings.database).database)

    def hold() -> None:
        time.sleep(at)
        locker = sqlite3.connect(path, isolation_level=None, timeout=30)
        locker.execute("BEGIN EXCLUSIVE")
        time.sleep(seconds)
        locker.execute("ROLLBACK")
        locker.close()
    return hold


def command_latency(rate: float, seconds: float, *, lock_at: float, lock_seconds: float) -> None:
    print(f"slash commands at {rate:g} requests/s for {seconds:g} s (mix: {', '.join(MIX)}), code: {CODE}")
    answers = Answers()
    with fake_slack() as fake, tempfile.TemporaryDirectory() as home:
        if hasattr(fake, "respond"):
            fake.respond = answers.wrap(fake.respond)  # type: ignore[method-assign]
        settings = load_settings({"KERNELBOT_HOME": home, "SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_SIGNING_SECRET": SECRET,
                                  "KERNELBOT_SLACK_API_URL": fake.base_url})
        engine = open_database(settings)
        app = build_app(settings, engine)
        with served(app) as url:
            steady_load(url, fake.base_url, answers, rate=5, seconds=1)  # warm-up: imports, auth.test
            report("kernelbot's threaded server", steady_load(url, fake.base_url, answers, rate=rate,
                                                               seconds=seconds))
            report(f"the same, the database write-locked for {lock_seconds:g} s from {lock_at:g} s in",
                   steady_load(url, fake.base_url, answers, rate=rate, seconds=seconds,
                               during=write_lock(settings, at=lock_at, seconds=lock_seconds)))
        port = free_port()
        baseline = SlackAppDevelopmentServer(port=port, path="/slack/events", app=app,
                                             http_server_logger_enabled=False)
        threading.Thread(target=baseline._server.serve_forever, daemon=True).start()
        wait_for_port(port)
        report("baseline: Bolt's development server",
               steady_load(f"http://127.0.0.1:{port}/slack/events", fake.base_url, answers, rate=rate,
                           seconds=seconds))
        baseline._server.shutdown()
        engine.dispose()


def event_latency(events: int, channels: int, *, woken: bool) -> list[float]:
    with fake_slack() as fake, tempfile.TemporaryDirectory() as home:
        fake.burst, fake.per_second = 3, 1.0  # Slack's own pace per channel
        arrived: dict[str, float] = {}

        def stamp(message: Message) -> None:
            key = (message.metadata or {}).get("event_payload", {}).get("key")
            if key:
                arrived[key] = time.perf_counter()

        fake.after_post = stamp
        settings = load_settings({"KERNELBOT_HOME": home})
        engine = open_database(settings)
        client = WebClient(token=BOT_TOKEN, base_url=fake.base_url, retry_handlers=[])
        notifier = Notifier(engine, SlackSender(client, ChannelPacer()))
        threading.Thread(target=notifier.run, daemon=True).start()
        with Session(engine) as s, s.begin():
            ids = [sessions.create_session(s, mode="auto", task="softmax", target="v6e", owner="U1",
                                           slack_channel=f"C{c}").id for c in range(channels)]
            for sid in ids:
                sessions.add_event(s, session_id=sid, kind="session_started", payload={})
        deadline = time.monotonic() + 30
        while len(arrived) < channels and time.monotonic() < deadline:  # the roots first: threads exist
            time.sleep(0.05)
        recorded: dict[str, float] = {}
        for i in range(events):  # one event a second, round-robin over the channels: within Slack's pace
            with Session(engine) as s, s.begin():
                event = sessions.add_event(s, session_id=ids[i % channels], kind="job_failed",
                                           payload={"kind": "auto_session", "reason": f"benchmark event {i}"})
                key = f"event:{event.id}"
            recorded[key] = time.perf_counter()
            if woken:
                notifier.notify()
            time.sleep(1.0)
        deadline = time.monotonic() + 60
        while not all(k in arrived for k in recorded) and time.monotonic() < deadline:
            time.sleep(0.05)
        notifier.close()
        engine.dispose()
        missing = [k for k in recorded if k not in arrived]
        if missing:
            raise SystemExit(f"{len(missing)} events never reached the fake Slack")
        if fake.rate_limited:
            print(f"  (the fake answered {fake.rate_limited} 429s)")
        return [arrived[k] - recorded[k] for k in recorded]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--events", type=int, default=60)
    parser.add_argument("--channels", type=int, default=3)
    parser.add_argument("--lock-at", type=float, default=5.0, help="when the database is write-locked (s in)")
    parser.add_argument("--lock-seconds", type=float, default=4.0, help="how long it stays locked")
    parser.add_argument("--code", type=Path, default=REPO, help="the kernelbot checkout to measure")
    parser.add_argument("--commands-only", action="store_true", help="skip the event-to-message measurement")
    args = parser.parse_args()
    command_latency(args.rate, args.seconds, lock_at=args.lock_at, lock_seconds=args.lock_seconds)
    if args.commands_only:
        return
    print(f"event recorded -> message in the fake Slack ({args.events} events over {args.channels} channels, "
          "one a second, round-robin)")
    for woken, name in ((True, "notifier woken on record"), (False, "baseline: notifier polling (0.5 s)")):
        lat = event_latency(args.events, args.channels, woken=woken)
        print(f"  {name:<34} median {statistics.median(lat) * 1e3:6.1f} ms, p99 {percentile(lat, 0.99) * 1e3:7.1f} "
              f"ms, max {max(lat) * 1e3:7.1f} ms")


if __name__ == "__main__":
    main()
