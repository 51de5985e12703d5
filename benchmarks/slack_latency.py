"""How fast the Slack bot answers and delivers, against the tests' fake Slack (real Bolt app, real slack_sdk).

1. Slash-command ack latency at a steady rate over HTTP: signed `/kernel` requests sent on a fixed schedule
   (--rate per second for --seconds; each request on its own thread, so a slow answer does not delay the next
   send), a mix of help, list, status, tasks and `new softmax` (which records a session and queues its job). The
   figure: the time from sending to the full answer, median and p99. Baseline in the same run: the same app behind
   Bolt's own development server (`App.start`, one request at a time) instead of kernelbot's threaded server.
2. Event to message: session events recorded in the database (--events, one a second, round-robin over
   --channels channels), each
   one timed from its commit to the moment the fake Slack stores its message. With the notifier woken when an
   event is recorded (what `serve` does for decisions taken in Slack) and, as the baseline, polling only (what
   it does for events recorded by runners in other processes; it polls every 0.5 s).

    .venv/bin/python benchmarks/slack_latency.py [--rate 20] [--seconds 15] [--events 60] [--channels 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from slack_bolt.app.app import SlackAppDevelopmentServer
from slack_sdk import WebClient
from sqlmodel import Session

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bot.slack.app import build_app  # noqa: E402
from bot.slack.outbound.notifier import Notifier  # noqa: E402
from bot.slack.outbound.sender import ChannelPacer, SlackSender  # noqa: E402
from storage import sessions  # noqa: E402
from storage.connect import open_database  # noqa: E402
from storage.settings import load_settings  # noqa: E402
from tests.fakes.slack_api import BOT_TOKEN, FakeSlack, Message, fake_slack  # noqa: E402
from tests.support.slack_http import SECRET, command, free_port, served, wait_for_port  # noqa: E402

MIX = ("help", "list", "status", "tasks", "new softmax --brain offline")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def steady_load(url: str, fake: FakeSlack, *, rate: float, seconds: float) -> tuple[list[float], int]:
    """Send at fixed times; returns each request's latency (s) and how many failed."""
    latencies: list[float] = []
    failures = [0]
    lock = threading.Lock()
    threads = []
    start = time.perf_counter() + 0.2
    total = int(rate * seconds)

    def one(i: int) -> None:
        sent = time.perf_counter()
        status, body = command(url, MIX[i % len(MIX)], fake=fake, user=f"U{i % 7}", channel=f"C{i % 3}", timeout=30,
                               answer_timeout=30)
        took = time.perf_counter() - sent
        with lock:
            if status == 200 and body.get("text"):
                latencies.append(took)
            else:
                failures[0] += 1

    for i in range(total):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        thread = threading.Thread(target=one, args=(i,), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(timeout=60)
    return latencies, failures[0]


def report_acks(name: str, latencies: list[float], failures: int) -> None:
    print(f"  {name:<34} {len(latencies):4d} answered, {failures} failed: median "
          f"{statistics.median(latencies) * 1e3:6.1f} ms, p99 {percentile(latencies, 0.99) * 1e3:7.1f} ms, "
          f"max {max(latencies) * 1e3:7.1f} ms")


def ack_latency(rate: float, seconds: float) -> None:
    print(f"slash-command acks at {rate:g} requests/s for {seconds:g} s (mix: {', '.join(MIX)})")
    with fake_slack() as fake, tempfile.TemporaryDirectory() as home:
        settings = load_settings({"KERNELBOT_HOME": home, "SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_SIGNING_SECRET": SECRET,
                                  "KERNELBOT_SLACK_API_URL": fake.base_url})
        engine = open_database(settings)
        app = build_app(settings, engine)
        command_url = None
        with served(app) as url:
            command(url, "help", fake=fake)  # warm-up: the first request imports what the listeners need
            command_url = url
            report_acks("kernelbot's threaded server", *steady_load(command_url, fake, rate=rate, seconds=seconds))
        port = free_port()
        baseline = SlackAppDevelopmentServer(port=port, path="/slack/events", app=app,
                                             http_server_logger_enabled=False)
        threading.Thread(target=baseline._server.serve_forever, daemon=True).start()
        wait_for_port(port)
        report_acks("baseline: Bolt's development server",
                    *steady_load(f"http://127.0.0.1:{port}/slack/events", fake, rate=rate, seconds=seconds))
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
    args = parser.parse_args()
    ack_latency(args.rate, args.seconds)
    print(f"event recorded -> message in the fake Slack ({args.events} events over {args.channels} channels, "
          "one a second, round-robin)")
    for woken, name in ((True, "notifier woken on record"), (False, "baseline: notifier polling (0.5 s)")):
        lat = event_latency(args.events, args.channels, woken=woken)
        print(f"  {name:<34} median {statistics.median(lat) * 1e3:6.1f} ms, p99 {percentile(lat, 0.99) * 1e3:7.1f} "
              f"ms, max {max(lat) * 1e3:7.1f} ms")


if __name__ == "__main__":
    main()
