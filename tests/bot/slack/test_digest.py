"""The digest: what it gathers from a real database, how it renders within Slack's limits, its chart, its
recording once per (channel, period) on SQLite and PostgreSQL, and `/kernel digest preview|now` through the
real Bolt app over signed HTTP, posted by the notifier to the fake Slack."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from matplotlib.image import imread
from slack_sdk import WebClient
from sqlalchemy import Engine
from sqlmodel import Session, select

from bot.slack.app import build_app
from bot.slack.outbound.digest import (
    build_digest,
    digest_chart,
    digest_ops,
    digest_sections,
    digest_text,
    gather_digest,
    period_start,
    record_digest,
)
from bot.slack.outbound.notifier import Notifier
from bot.slack.outbound.sender import SlackSender
from bot.slack.outbound.thread_ops import Show, Upload
from storage.connect import open_database
from storage.engine import make_engine
from storage.migrate import upgrade
from storage.models import Candidate, DigestRun, Evaluation, Job, KernelSession, Runner, SessionEvent, Step, now
from storage.settings import load_settings
from tests.fakes.slack_api import BLOCKS_TEXT_LIMIT, BOT_TOKEN, MAX_BLOCKS, SECTION_LIMIT, fake_slack
from tests.storage.conftest import fresh_database_url
from tests.support.slack_http import SECRET, command, served

HOUR = 3600.0


def everywhere(channel: str | None) -> bool:
    """A digest's audience that lets every session through (what the gathering tests read)."""
    return True


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    for url in fresh_database_url("sqlite", tmp_path):
        engine = make_engine(url)
        upgrade(engine)
        yield engine
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def any_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    for url in fresh_database_url(request.param, tmp_path):
        engine = make_engine(url)
        upgrade(engine)
        yield engine
        engine.dispose()


def _session(s: Session, sid: str, *, mode: str, task: str, owner: str, status: str = "active",
             at: float, thread: str | None = None) -> KernelSession:
    record = KernelSession(id=sid, mode=mode, task=task, target="v6e", owner=owner, status=status,
                           slack_channel="C1", slack_thread_ts=thread, created_at=at, updated_at=at)
    s.add(record)
    s.flush()
    return record


def _evaluated(s: Session, record: KernelSession, *, speedup: float, method: str, at: float,
               band: list[float] | None = None) -> int:
    candidate = Candidate(session_id=record.id, task=record.task, code="def computation(x): ...",
                          content_hash=f"h{speedup}{at}", created_at=at)
    s.add(candidate)
    s.flush()
    assert candidate.id is not None
    result = {"performance": {"speedup": speedup, "method": method, "band": band}} if band else None
    s.add(Evaluation(candidate_id=candidate.id, task=record.task, target="v6e", verdict="ok", stage="performance",
                     speedup=speedup, method=method, result=result, created_at=at))
    return candidate.id


def seed(engine: Engine, until: float) -> None:
    """A day of activity: what falls in the hour before `until` and what does not."""
    inside, before = until - 600, until - 5 * HOUR
    with Session(engine) as s, s.begin():
        # A search that finished in the period with its best kernel x1.80 measured (a faster non-best candidate
        # of the same session does not count); an Auto session whose best kernel is older than the period.
        search = _session(s, "search1", mode="search", task="softmax", owner="U1", status="done", at=before,
                          thread="1796000001.000100")
        _evaluated(s, search, speedup=3.0, method="estimated", at=inside)
        search.best_candidate_id = _evaluated(s, search, speedup=1.8, method="measured", at=inside)
        old = _session(s, "auto1", mode="auto", task="layer_norm", owner="U2", status="done", at=before)
        old.best_candidate_id = _evaluated(s, old, speedup=2.5, method="estimated", at=before)
        estimated = _session(s, "auto2", mode="auto", task="rms_norm", owner="U2", status="done", at=before)
        estimated.best_candidate_id = _evaluated(s, estimated, speedup=1.2, method="estimated", at=inside + 60)
        s.add(SessionEvent(session_id="search1", kind="search_finished", created_at=inside,
                           payload={"evaluations": 7, "best_speedup": 1.8, "best_candidate_id": 2}))
        s.add(SessionEvent(session_id="auto1", kind="search_finished", created_at=before,
                           payload={"evaluations": 3, "best_speedup": 2.5}))
        # A HITL session whose plan waits for its owner's approval.
        waiting = _session(s, "hitl1", mode="hitl", task="gelu", owner="U3", status="awaiting", at=inside,
                           thread="1796000002.000200")
        s.add(Step(session_id=waiting.id, index=1, kind="plan", status="done", outputs={"plan": "tile rows"}))
        # Failures: a job that gave up in the period, one that gave up before it; a session that failed.
        s.add(Job(kind="search_node", status="failed", session_id="search1", attempts=3, finished_at=inside,
                  last_error="failed on all 3 attempts; last: compile: scoped VMEM OOM <16 MiB> & more"))
        s.add(Job(kind="auto_session", status="failed", finished_at=before, last_error="old failure"))
        _session(s, "auto3", mode="auto", task="matmul", owner="U4", status="failed", at=inside + 30)
        # The queue and the fleet: two waiting, one running; one runner heard from, one silent, one stopped.
        s.add_all([Job(kind="search_node", status="queued"), Job(kind="search_node", status="queued"),
                   Job(kind="eval", status="running"), Job(kind="eval", status="done", finished_at=inside)])
        s.add_all([Runner(name="tpu-a", host="host-a", pid=1, heartbeat_at=until - 10),
                   Runner(name="tpu-b", host="host-b", pid=2, heartbeat_at=until - 500),
                   Runner(name="tpu-c", host="host-c", pid=3, status="stopped", heartbeat_at=until - 9000)])


def test_the_digest_gathers_the_periods_kernels_searches_waits_failures_and_fleet(sqlite_engine: Engine) -> None:
    until = now()
    seed(sqlite_engine, until)
    with Session(sqlite_engine) as s:
        payload = gather_digest(s, since=until - HOUR, until=until, shown=everywhere)
    assert json.loads(json.dumps(payload)) == payload  # JSON-able as stored
    bests = payload["new_bests"]
    assert bests["count"] == 2
    assert [(i["session"], i["task"], i["speedup"], i["method"], i["owner"]) for i in bests["items"]] == [
        ("search1", "softmax", 1.8, "measured", "U1"), ("auto2", "rms_norm", 1.2, "estimated", "U2")]
    assert bests["items"][0]["thread_ts"] == "1796000001.000100" and bests["items"][0]["channel"] == "C1"
    searches = payload["searches"]
    assert searches["count"] == 1
    assert (searches["items"][0]["session"], searches["items"][0]["evaluations"],
            searches["items"][0]["best_speedup"]) == ("search1", 7, 1.8)
    assert [(i["session"], i["owner"], i["waiting_for"]) for i in payload["awaiting"]["items"]] == [
        ("hitl1", "U3", "await_approval")]
    jobs = payload["failed_jobs"]
    assert jobs["count"] == 1 and jobs["items"][0]["kind"] == "search_node"
    assert jobs["items"][0]["session"] == "search1" and "scoped VMEM OOM" in jobs["items"][0]["reason"]
    assert [(i["session"], i["task"]) for i in payload["failed_sessions"]["items"]] == [("auto3", "matmul")]
    fleet = payload["fleet"]
    assert (fleet["active"], fleet["queued"], fleet["running"]) == (1, 2, 1)
    assert [(r["name"], r["silent_seconds"]) for r in fleet["stale"]] == [("tpu-b", 500)]

    message = build_digest(payload)
    text = json.dumps(message["blocks"])
    assert message["text"] == ("Kernel digest: 2 new best kernel(s), 1 search(es) finished, 1 waiting for a "
                               "decision, 2 failure(s)")
    assert "x1.80 measured" in text and "x1.20 estimated" in text and "x3.00" not in text
    assert "https://slack.com/archives/C1/p1796000001000100" in text  # the link to the search's thread
    assert "waits for <@U3> to approve the plan" in text
    assert "&lt;16 MiB&gt; &amp; more" in text  # people's text cannot break the mrkdwn
    assert "1 silent for over 120 s: tpu-b on host-b (500 s)" in text and "2 waiting, 1 running" in text


def test_the_digest_leaves_out_what_its_audience_may_not_see_and_counts_only_the_rest(sqlite_engine: Engine) -> None:
    until = now()
    seed(sqlite_engine, until)
    with Session(sqlite_engine) as s, s.begin():  # a session of a terminal, and its failed job
        _session(s, "term1", mode="auto", task="gelu", owner="U5", status="failed", at=until - 300).slack_channel = None
        s.add(Job(kind="auto_session", status="failed", session_id="term1", finished_at=until - 300,
                  last_error="terminal failure"))
    with Session(sqlite_engine) as s:
        payload = gather_digest(s, since=until - HOUR, until=until, shown=lambda channel: channel != "C1")
    for key in ("new_bests", "searches", "awaiting"):
        assert payload[key] == {"count": 0, "items": []}, key
    assert [i["session"] for i in payload["failed_sessions"]["items"]] == ["term1"]
    jobs = payload["failed_jobs"]  # search1's job stays out with its session; a terminal's job shows
    assert jobs["count"] == 1 and [i["session"] for i in jobs["items"]] == ["term1"]
    assert "scoped VMEM OOM" not in json.dumps(payload) and payload["fleet"]["queued"] == 2


def test_a_quiet_period_says_so_and_warns_when_work_waits_for_no_runner(sqlite_engine: Engine) -> None:
    until = now()
    with Session(sqlite_engine) as s, s.begin():
        s.add(Job(kind="search_node", status="queued"))
    with Session(sqlite_engine) as s:
        payload = gather_digest(s, since=until - HOUR, until=until, shown=everywhere)
    text = json.dumps(build_digest(payload)["blocks"])
    assert "A quiet period" in text and "Nothing will run until a runner starts" in text
    assert digest_chart(payload) is None
    assert [type(op) for op in digest_ops(DigestRun(id=4, channel="C1", period="p", payload=payload))] == [Show]


def _crowded_payload(n: int) -> dict:
    item = {"session": "s" * 12, "mode": "search", "task": "t" * 200, "target": "v6e", "owner": "U" * 11,
            "channel": "C1", "thread_ts": "1796000001.000100"}
    return {
        "since": 1796000000.0, "until": 1796086400.0,
        "new_bests": {"count": n, "items": [{**item, "task": f"task{i}", "speedup": 1.0 + i / 10,
                                             "method": "measured"} for i in range(49, -1, -1)]},
        "searches": {"count": n, "items": [{**item, "evaluations": i, "best_speedup": None} for i in range(50)]},
        "awaiting": {"count": n, "items": [{**item, "waiting_for": "await_decision", "since": 1796000000.0}
                                           for _ in range(50)]},
        "failed_jobs": {"count": n, "items": [{"job": i, "kind": "search_node", "session": "s" * 12,
                                               "reason": "x" * 5000} for i in range(50)]},
        "failed_sessions": {"count": n, "items": [item] * 50},
        "fleet": {"active": 3, "queued": 999, "running": 17, "stale_after": 120,
                  "stale": [{"name": "r" * 100, "host": "h" * 100, "silent_seconds": 999}] * 40},
    }


def test_a_crowded_digest_stays_within_slacks_limits_and_the_fake_slack_takes_it() -> None:
    message = build_digest(_crowded_payload(5000))
    blocks = message["blocks"]
    sections = [b["text"]["text"] for b in blocks if b["type"] == "section"]
    assert len(blocks) <= MAX_BLOCKS and all(len(t) <= SECTION_LIMIT for t in sections)
    assert sum(len(t) for t in sections) <= BLOCKS_TEXT_LIMIT
    assert len(sections) == 6 and all("more_" in t for t in sections[:5])  # each list says what it left out
    assert "*New best kernels (5000)*" in sections[0] and "task49" in sections[0]  # fastest first
    assert "and 30 more" in sections[5]
    preview = digest_text(_crowded_payload(5000))  # the ephemeral preview: shorter lists, the same counts
    assert len(preview) < 4500 and "*Failed jobs (5000)*" in preview and preview.count("more_") == 5
    with fake_slack() as fake:
        client = WebClient(token=BOT_TOKEN, base_url=fake.base_url, retry_handlers=[])
        response = client.chat_postMessage(channel="C1", text=message["text"], blocks=blocks)
        assert response["ok"] and fake.messages["C1"][0].blocks == blocks


def test_the_chart_is_a_png_of_the_best_speedup_per_task() -> None:
    payload = _crowded_payload(50)
    chart = digest_chart(payload)
    assert chart is not None and chart[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = imread(io.BytesIO(chart), format="png")
    assert pixels.shape[0] > 300 and pixels.shape[1] == 700  # 7 in wide at 100 dpi; taller for 25 tasks
    ops = digest_ops(DigestRun(id=12, channel="C1", period="p", payload=payload))
    assert isinstance(ops[0], Show) and ops[0].key == "digest" and not ops[0].in_thread
    assert ops[0].payload == build_digest(payload)
    assert isinstance(ops[1], Upload) and ops[1].key == "file:digest_12.png" and ops[1].filename == "digest_12.png"
    assert ops[1].content[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_estimates_likely_range_is_in_the_digest_and_a_range_holding_1_is_no_clear_gain(
        sqlite_engine: Engine) -> None:
    until = now()
    inside = until - 600
    with Session(sqlite_engine) as s, s.begin():
        unclear = _session(s, "search2", mode="search", task="softmax", owner="U1", status="done", at=inside)
        unclear.best_candidate_id = _evaluated(s, unclear, speedup=1.04, method="estimated", at=inside,
                                               band=[0.9, 1.2])
        clear = _session(s, "auto4", mode="auto", task="gelu", owner="U2", status="done", at=inside)
        clear.best_candidate_id = _evaluated(s, clear, speedup=2.0, method="estimated", at=inside, band=[1.6, 2.5])
        s.add(SessionEvent(session_id="search2", kind="search_finished", created_at=inside, payload={
            "evaluations": 5, "best_speedup": 1.04, "best_method": "estimated", "best_band": [0.9, 1.2]}))
    with Session(sqlite_engine) as s:
        payload = gather_digest(s, since=until - HOUR, until=until, shown=everywhere)
    assert [i["band"] for i in payload["new_bests"]["items"]] == [[1.6, 2.5], [0.9, 1.2]]  # ranked by the estimate
    new_bests, searches = digest_sections(payload)[:2]
    assert "*gelu* (v6e) x2.00 estimated, likely x1.60-x2.50;" in new_bests
    assert "*softmax* (v6e) x1.04 estimated, likely x0.90-x1.20: no clear gain;" in new_bests
    assert "`search2`: 5 evaluation(s), best x1.04 estimated, likely x0.90-x1.20: no clear gain" in searches
    assert new_bests.count("no clear gain") == 1
    chart = digest_chart(payload)  # the ranges drawn as whiskers
    assert chart is not None and chart[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_period_is_recorded_once_even_when_two_processes_race(any_engine: Engine) -> None:
    until = now()
    assert record_digest(any_engine, channel="C9", period="2026-11-30T09:00:00+00:00", since=until - HOUR,
                         until=until, shown=everywhere)
    assert not record_digest(any_engine, channel="C9", period="2026-11-30T09:00:00+00:00", since=until - HOUR,
                             until=until, shown=everywhere)
    barrier, results = threading.Barrier(4), []

    def racer() -> None:
        barrier.wait()
        results.append(record_digest(any_engine, channel="C9", period="2026-12-01T09:00:00+00:00",
                                     since=until, until=until + HOUR, shown=everywhere))

    threads = [threading.Thread(target=racer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) == [False, False, False, True]
    with Session(any_engine) as s:
        rows = s.exec(select(DigestRun).order_by(DigestRun.id)).all()
        assert [(r.channel, r.period, r.status) for r in rows] == [
            ("C9", "2026-11-30T09:00:00+00:00", "pending"), ("C9", "2026-12-01T09:00:00+00:00", "pending")]
        assert rows[0].payload["until"] == until and rows[1].payload["since"] == until
    # The next period starts where the last scheduled one ended; a manual digest does not move it.
    assert record_digest(any_engine, channel="C9", period="manual-2026-12-01T12:00:00+00:00",
                         since=until, until=until + 2 * HOUR, shown=everywhere)
    with Session(any_engine) as s:
        assert period_start(s, channel="C9", until=until + 3 * HOUR) == until + HOUR
        assert period_start(s, channel="C8", until=until) == until - 24 * HOUR


def _wait(condition, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_digest_preview_and_now_through_the_slack_app_and_the_notifier(tmp_path: Path) -> None:
    with fake_slack() as fake:
        settings = load_settings({"KERNELBOT_HOME": str(tmp_path), "SLACK_BOT_TOKEN": BOT_TOKEN,
                                  "SLACK_SIGNING_SECRET": SECRET, "KERNELBOT_SLACK_API_URL": fake.base_url})
        engine = open_database(settings)
        seed(engine, now())
        client = WebClient(token=BOT_TOKEN, base_url=fake.base_url, retry_handlers=[], timeout=5)
        notifier = Notifier(engine, SlackSender(client), poll_seconds=5.0, digest_ops=digest_ops)
        worker = threading.Thread(target=notifier.run, daemon=True)
        worker.start()
        try:
            with served(build_app(settings, engine, notify=notifier.notify)) as url:
                status, body = command(url, "digest preview", fake=fake)
                assert status == 200 and body["response_type"] == "ephemeral"
                preview = body["text"]
                assert "*New best kernels (3)*" in preview and "x1.80 measured" in preview  # the last 24 h
                assert "waits for <@U3> to approve the plan" in preview and "nothing was posted" in preview
                plain = command(url, "digest", fake=fake)[1]["text"]  # where digests go, with what to type
                assert plain.startswith("No channel gets the daily digest (at `0 9 * * *` (UTC), next ")
                assert "`/kernel digest subscribe` sends it to this channel" in plain
                with Session(engine) as s:
                    assert s.exec(select(DigestRun)).all() == []

                reply = command(url, "digest now", fake=fake, channel="C5")[1]["text"]
                assert "is being posted in this channel (`manual-" in reply
                # notify() woke the notifier: posted well before its 5 s poll.
                assert _wait(lambda: any("Kernel digest" in m.text for m in fake.messages.get("C5", [])), 4.0)
                posted = [m for m in fake.messages["C5"] if m.thread_ts is None]
                assert "Kernel digest: 3 new best kernel(s)" in posted[0].text
                assert "x1.80 measured" in json.dumps(posted[0].blocks)
                assert _wait(lambda: any(f.get("name", "").startswith("digest_") and f["content"]
                                         for f in fake.files.values()))

                def settled() -> DigestRun | None:  # the notifier records the run after its last upload returns
                    with Session(engine) as s:
                        run = s.exec(select(DigestRun)).one()
                        return run if run.status != "pending" else None

                assert _wait(lambda: settled() is not None)
                with Session(engine) as s:
                    run = s.exec(select(DigestRun)).one()
                    assert run.channel == "C5" and run.period.startswith("manual-") and run.status == "posted"
                    assert run.payload["new_bests"]["count"] == 3
                png = next(f for f in fake.files.values() if f["name"] == f"digest_{run.id}.png")
                assert png["content"][:8] == b"\x89PNG\r\n\x1a\n"
                assert "not a digest command" in command(url, "digest later", fake=fake)[1]["text"]
        finally:
            notifier.close()
            worker.join(10)
