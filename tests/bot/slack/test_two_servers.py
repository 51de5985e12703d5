"""Two real `kernelbot serve --http` processes on one PostgreSQL database and one fake Slack, digests every 3
seconds: each period is recorded once and posted once, whoever leads; when the leader is killed (SIGKILL, no
goodbye), the other process takes the lead and the digests keep coming, still once each."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlmodel import Session, col, select

from storage.engine import make_engine
from storage.migrate import upgrade
from storage.models import DigestRun
from tests.fakes.slack_api import BOT_TOKEN, FakeSlack, fake_slack
from tests.storage.conftest import fresh_database_url
from tests.support.slack_http import SECRET, command, free_port, wait_for_port

PERIOD = timedelta(seconds=3)
SETTLE = 2 * PERIOD  # a period due this long ago must be posted: room for a busy 2-core host, not a latency test


def _serve(home: Path, url: str, fake: FakeSlack, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERNELBOT_", "SLACK_", "ANTHROPIC_"))}
    env.update({"KERNELBOT_HOME": str(home), "KERNELBOT_DATABASE_URL": url, "SLACK_BOT_TOKEN": BOT_TOKEN,
                "SLACK_SIGNING_SECRET": SECRET, "KERNELBOT_SLACK_API_URL": fake.base_url,
                "KERNELBOT_DIGEST_CHANNELS": "C9", "KERNELBOT_DIGEST_CRON": "*/3 * * * * *",
                "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"})
    kernelbot = str(Path(sys.executable).parent / "kernelbot")
    with log.open("wb") as out:
        return subprocess.Popen([kernelbot, "serve", "--http", "--host", "127.0.0.1", "--port", str(port)],
                                env=env, stdout=out, stderr=subprocess.STDOUT)


def _digest_messages(fake: FakeSlack) -> Counter[str]:
    """How many times each digest run (its notifier scope `digest-<id>`) was posted in C9."""
    with fake.lock:
        messages = list(fake.messages.get("C9", []))
    return Counter((m.metadata or {}).get("event_payload", {}).get("scope", "?") for m in messages)


def _runs(url: str) -> list[DigestRun]:
    engine = make_engine(url)
    try:
        with Session(engine) as s:
            return list(s.exec(select(DigestRun).order_by(col(DigestRun.period))).all())
    finally:
        engine.dispose()


def _check_once_each(fake: FakeSlack, url: str, *, settled_before: datetime) -> list[DigestRun]:
    """Every recorded period is one row; every one due a while ago was posted, exactly once; nothing else."""
    runs = _runs(url)
    posted = _digest_messages(fake)
    assert all(scope.startswith("digest-") for scope in posted), posted  # only digests were posted
    assert max(posted.values()) == 1, posted  # no run posted twice
    assert set(posted) <= {f"digest-{r.id}" for r in runs}, (posted, runs)
    periods = [datetime.fromisoformat(r.period) for r in runs]
    assert len(set(periods)) == len(periods) and all(r.channel == "C9" for r in runs)
    for run, period in zip(runs, periods, strict=True):
        if period < settled_before:
            assert run.status == "posted" and posted[f"digest-{run.id}"] == 1, (run, posted)
    return runs


def _leader(logs: list[Path]) -> int:
    leading = [i for i, log in enumerate(logs) if "this process leads" in log.read_text(errors="replace")]
    assert len(leading) == 1, [log.read_text(errors="replace")[-2000:] for log in logs]
    return leading[0]


def _wait_for(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s")


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    for url in fresh_database_url("postgresql", tmp_path):
        engine = make_engine(url)
        upgrade(engine)  # an operator's `kernelbot db upgrade`
        engine.dispose()
        yield url


def _posted_after(url: str, moment: datetime) -> int:
    return len([r for r in _runs(url) if r.status == "posted" and datetime.fromisoformat(r.period) > moment])


@pytest.mark.slow
def test_two_servers_post_each_digest_once_and_the_survivor_takes_over(tmp_path: Path, pg_url: str) -> None:
    with fake_slack() as fake:
        ports = [free_port(), free_port()]
        logs = [tmp_path / "serve0.log", tmp_path / "serve1.log"]
        procs = [_serve(tmp_path / f"home{i}", pg_url, fake, ports[i], logs[i]) for i in range(2)]
        try:
            for port in ports:
                wait_for_port(port, timeout=40)
            for port in ports:  # both answer Slack, leader or not
                status, body = command(f"http://127.0.0.1:{port}/slack/events", "digest preview", fake=fake)
                assert status == 200 and "Kernel digest" in body["text"], body
            started = datetime.now().astimezone()
            time.sleep(10)
            before = _check_once_each(fake, pg_url, settled_before=datetime.now().astimezone() - SETTLE)
            periods = [datetime.fromisoformat(r.period) for r in before]
            assert len([p for p in periods if p >= started]) >= 3
            assert all(b - a == PERIOD for a, b in zip(periods, periods[1:], strict=False)), periods
            assert all(p.second % 3 == 0 for p in periods)  # the trigger's times, not "now"

            leader = _leader(logs)
            procs[leader].send_signal(signal.SIGKILL)
            procs[leader].wait(10)
            killed = datetime.now().astimezone()
            survivor = procs[1 - leader]
            # The survivor asks for the lock every 5 s: it leads within that, then fires every 3 s.
            _wait_for(lambda: _posted_after(pg_url, killed + PERIOD) >= 2, 20)
            assert survivor.poll() is None and "this process leads" in logs[1 - leader].read_text()
            after = _check_once_each(fake, pg_url, settled_before=datetime.now().astimezone() - SETTLE)
            assert len(after) > len(before)
            new = [datetime.fromisoformat(r.period) for r in after if datetime.fromisoformat(r.period) > killed]
            assert all(b - a == PERIOD for a, b in zip(new, new[1:], strict=False)), new
            assert all(json.dumps(r.payload) and r.payload["since"] < r.payload["until"] for r in after)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
