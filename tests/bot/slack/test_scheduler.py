"""The scheduler: cron lines as crontab means them, periods keyed by the scheduled time, digests recorded once per
period by two schedulers on one database, recurring searches fired once per fire by a compare-and-set (two
callers racing on SQLite and PostgreSQL), picked up and dropped as rows come and go; and `/kernel schedule`
through the real Bolt app over signed HTTP."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from bot.slack.app import build_app
from bot.slack.scheduler import (
    CronError,
    KernelScheduler,
    due_fires,
    fire_schedule,
    latest_fire,
    next_fires,
    parse_cron,
    period_key,
    record_due_digests,
)
from bot.task_suites import REPO_TASKS
from storage.connect import open_database
from storage.engine import make_engine
from storage.migrate import upgrade
from storage.models import DigestRun, Job, KernelSession, Schedule, now
from storage.settings import Settings, load_settings
from tests.fakes.slack_api import BOT_TOKEN, fake_slack
from tests.storage.conftest import fresh_database_url
from tests.support.slack_http import SECRET, command, served


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    for url in fresh_database_url(request.param, tmp_path):
        engine = make_engine(url)
        upgrade(engine)
        engine.dispose()
        yield url


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    yield eng
    eng.dispose()


def _schedule(engine: Engine, *, cron: str, name: str = "nightly", created_at: float | None = None) -> int:
    with Session(engine) as s, s.begin():
        row = Schedule(name=name, kind="search", cron=cron, channel="C3", created_at=created_at or now(),
                       payload={"task": "softmax", "task_dir": str(REPO_TASKS / "softmax"), "strategy": "beam",
                                "budget": 3, "brain": "offline", "target": "v5e", "owner": "U7"})
        s.add(row)
        s.flush()
        assert row.id is not None
        return row.id


def _wait(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


# -- cron lines -------------------------------------------------------------------------------------------------
def test_cron_lines_read_as_crontab_reads_them() -> None:
    start = datetime(2026, 11, 30, 0, 0, tzinfo=UTC)  # a Monday
    weekdays = next_fires(parse_cron("0 9 * * 1-5"), start, 6)
    assert [f.strftime("%a %H:%M") for f in weekdays] == ["Mon 09:00", "Tue 09:00", "Wed 09:00", "Thu 09:00",
                                                          "Fri 09:00", "Mon 09:00"]
    assert {f.strftime("%a") for f in next_fires(parse_cron("30 2 * * 0,7"), start, 3)} == {"Sun"}
    assert [f.strftime("%a") for f in next_fires(parse_cron("0 0 * * */2"), start, 4)] == ["Tue", "Thu", "Sat",
                                                                                           "Sun"]
    assert [f.strftime("%a") for f in next_fires(parse_cron("0 0 * * sat"), start, 1)] == ["Sat"]
    seconds = next_fires(parse_cron("*/20 * * * * *"), start, 3)  # six fields: seconds first
    assert [f.strftime("%H:%M:%S") for f in seconds] == ["00:00:00", "00:00:20", "00:00:40"]
    paris = next_fires(parse_cron("0 9 * * *", "Europe/Paris"), start, 1)[0]
    assert paris.astimezone(UTC).strftime("%H:%M") == "08:00"  # 09:00 in Paris in winter


@pytest.mark.parametrize("cron, message", [
    ("0 25 * * *", "the hour field `25` is not valid"),
    ("0 2 * *", "has 4 field(s); a cron line has 5"),
    ("61 * * * *", "the minute field `61`"),
    ("0 0 * * 8", "the weekday `8` is out of range"),
    ("0 0 * * 5-1", "goes backwards"),
    ("0 0 31 2 *", "never fires"),
    ("0 0 * * * * *", "has 7 field(s)"),
    ("0 0 1 * 1", "restricts both the day of the month and the weekday"),
])
def test_a_bad_cron_line_is_refused_with_the_field_named(cron: str, message: str) -> None:
    with pytest.raises(CronError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_cron(cron)
    with pytest.raises(CronError, match="`Mars/Olympus` is not a time zone"):
        parse_cron("0 2 * * *", "Mars/Olympus")


def test_the_period_is_the_scheduled_time_whenever_the_fire_runs() -> None:
    trigger = parse_cron("0 9 * * *", "Europe/Paris")
    fire = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    keys = {period_key(latest_fire(trigger, fire + timedelta(seconds=late)))  # type: ignore[arg-type]
            for late in (0, 0.4, 3, 250)}
    assert keys == {"2026-11-30T08:00:00+00:00"}
    assert latest_fire(trigger, fire - timedelta(seconds=1)) is None  # the day before is out of the look-back
    per_second = parse_cron("*/3 * * * * *")
    at = datetime(2026, 11, 30, 8, 0, 7, 500000, tzinfo=UTC)
    assert period_key(latest_fire(per_second, at)) == "2026-11-30T08:00:06+00:00"  # type: ignore[arg-type]


# -- recurring searches -----------------------------------------------------------------------------------------
def test_two_callers_racing_on_one_fire_start_one_search(engine: Engine) -> None:
    schedule_id = _schedule(engine, cron="0 2 * * *")
    fire_at = datetime(2026, 11, 30, 2, 0, tzinfo=UTC).timestamp()
    barrier, results = threading.Barrier(2), []

    def caller() -> None:
        barrier.wait()
        results.append(fire_schedule(engine, schedule_id=schedule_id, fire_at=fire_at))

    threads = [threading.Thread(target=caller) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    started = [r for r in results if r is not None]
    assert len(results) == 2 and len(started) == 1
    with Session(engine) as s:
        searches = s.exec(select(KernelSession)).all()
        assert [(r.id, r.mode, r.task, r.target, r.owner, r.slack_channel) for r in searches] == [
            (started[0], "search", "softmax", "v5e", "U7", "C3")]
        assert searches[0].budget["search"]["budget"] == 3 and searches[0].budget["brain"] == "offline"
        assert s.exec(select(Job).where(Job.session_id == started[0])).all()  # its first expansions are queued
        assert s.get(Schedule, schedule_id).last_run_at == fire_at
    # The same fire again, or an older one, starts nothing; the next one starts a second search.
    assert fire_schedule(engine, schedule_id=schedule_id, fire_at=fire_at) is None
    assert fire_schedule(engine, schedule_id=schedule_id, fire_at=fire_at - 86400) is None
    assert fire_schedule(engine, schedule_id=schedule_id, fire_at=fire_at + 86400) is not None
    assert fire_schedule(engine, schedule_id=schedule_id + 100, fire_at=fire_at) is None  # no such schedule
    with Session(engine) as s:
        assert len(s.exec(select(KernelSession)).all()) == 2


def _settings(tmp_path: Path, url: str, **env: str) -> Settings:
    return load_settings({"KERNELBOT_HOME": str(tmp_path / "home"), "KERNELBOT_DATABASE_URL": url, **env})


def test_two_schedulers_on_one_database_record_each_digest_period_once(tmp_path: Path, db_url: str,
                                                                      engine: Engine) -> None:
    settings = _settings(tmp_path, db_url, KERNELBOT_DIGEST_CHANNELS="C7, C8",
                         KERNELBOT_DIGEST_CRON="* * * * * *")
    schedulers = [KernelScheduler(settings, engine), KernelScheduler(settings, make_engine(db_url))]
    for scheduler in schedulers:
        scheduler.start()
    started = time.time()
    time.sleep(3.2)
    for scheduler in schedulers:
        scheduler.stop()
    with Session(engine) as s:
        runs = s.exec(select(DigestRun).order_by(col(DigestRun.channel), col(DigestRun.period))).all()
    for channel in ("C7", "C8"):
        mine = [r for r in runs if r.channel == channel]
        periods = [datetime.fromisoformat(r.period) for r in mine]
        assert 3 <= len(mine) <= 5  # one per second (and the catch-up of the second before the start)
        assert all((b - a) == timedelta(seconds=1) for a, b in zip(periods, periods[1:], strict=False))
        assert all(r.payload["until"] == p.timestamp() for r, p in zip(mine, periods, strict=True))
        # Each period starts where the previous one ended; the first covers the day before.
        assert mine[0].payload["since"] == mine[0].payload["until"] - 86400
        assert all(b.payload["since"] == a.payload["until"] for a, b in zip(mine, mine[1:], strict=False))
        assert periods[0].timestamp() >= started - 2 and all(r.status == "pending" for r in mine)


def test_schedules_are_picked_up_fired_once_and_dropped_as_rows_come_and_go(tmp_path: Path, db_url: str,
                                                                           engine: Engine) -> None:
    settings = _settings(tmp_path, db_url)
    schedulers = [KernelScheduler(settings, engine, sync_seconds=0.5),
                  KernelScheduler(settings, make_engine(db_url), sync_seconds=0.5)]
    for scheduler in schedulers:
        scheduler.start()
    try:
        # Added while the schedulers run (by another `serve`, say), every 2 seconds.
        schedule_id = _schedule(engine, cron="*/2 * * * * *")
        assert _wait(lambda: len(_searches(engine)) >= 2, 15.0)
        with Session(engine) as s, s.begin():
            s.delete(s.get(Schedule, schedule_id))
        time.sleep(1.2)  # the next sync drops it
        count = len(_searches(engine))
        time.sleep(2.5)
        assert len(_searches(engine)) == count  # no fire after the row went
    finally:
        for scheduler in schedulers:
            scheduler.stop()
    created = sorted(r.created_at for r in _searches(engine))
    # One search per fire although two schedulers fired each: fires are 2 s apart.
    assert all(b - a > 1.0 for a, b in zip(created, created[1:], strict=False)), created


def _searches(engine: Engine) -> list[KernelSession]:
    with Session(engine) as s:
        return list(s.exec(select(KernelSession).where(KernelSession.mode == "search")).all())


# -- /kernel schedule -------------------------------------------------------------------------------------------
def test_schedule_add_list_remove_through_the_slack_app(tmp_path: Path) -> None:
    with fake_slack() as fake:
        settings = load_settings({"KERNELBOT_HOME": str(tmp_path), "SLACK_BOT_TOKEN": BOT_TOKEN,
                                  "SLACK_SIGNING_SECRET": SECRET, "KERNELBOT_SLACK_API_URL": fake.base_url,
                                  "KERNELBOT_TIMEZONE": "Europe/Paris"})
        engine = open_database(settings)
        with served(build_app(settings, engine)) as url:
            def reply(text: str, user: str = "U1") -> str:
                status, body = command(url, text, fake=fake, user=user, channel="C2")
                assert status == 200 and body["response_type"] == "ephemeral"
                return body["text"]

            assert "No recurring search is scheduled" in reply("schedule")
            added = reply('schedule add softmax "0 2 * * *" --budget 8 --target v5e')
            assert added.startswith("Scheduled #1: a beam search of *softmax* (8 evaluations, v5e, offline brain) "
                                    "at `0 2 * * *` (Europe/Paris)")
            with Session(engine) as s:
                row = s.exec(select(Schedule)).one()
            assert (row.kind, row.cron, row.timezone, row.channel, row.enabled) == (
                "search", "0 2 * * *", "Europe/Paris", "C2", True)
            assert row.payload == {"task": "softmax", "task_dir": str((REPO_TASKS / "softmax").resolve()),
                                   "strategy": "beam", "budget": 8, "brain": "offline", "target": "v5e",
                                   "owner": "U1"}
            assert "already scheduled at `0 2 * * *` in this channel (#1)" in reply(
                "schedule add softmax '0 2 * * *'")
            assert "Scheduled #" in reply("schedule add layer_norm '0 3 * * 1-5' --strategy parallel")

            assert "the hour field `25` is not valid" in reply('schedule add softmax "0 25 * * *"')
            assert "has 4 field(s)" in reply('schedule add softmax "0 2 * *"')
            assert "No task `nosuch`" in reply('schedule add nosuch "0 2 * * *"') and "`softmax`" in reply(
                'schedule add nosuch "0 2 * * *"')
            assert "at most every 10 minutes" in reply('schedule add softmax "*/5 * * * *"')
            assert "needs a seed kernel" in reply('schedule add softmax "0 4 * * *" --strategy tune')
            assert "needs a task and a quoted cron" in reply("schedule add softmax")
            assert 'add TASK "CRON"' in reply("schedule add softmax 0 2 * * *")  # unquoted: the usage says how
            assert "not something schedules do" in reply("schedule pause 1")

            listed = reply("schedule list")
            assert "#1 beam search of *softmax* (8 evaluations, v5e, offline brain) at `0 2 * * *`" in listed
            assert "#2 parallel search of *layer_norm*" in listed and "by <@U1> in <#C2>" in listed

            assert "No schedule #99" in reply("schedule remove 99")
            assert "`abc` is not a schedule id" in reply("schedule remove abc")
            assert "may remove this schedule; nothing was changed" in reply("schedule remove 1", user="U2")
            assert reply("schedule remove #1") == "Removed schedule #1 (the *softmax* search at `0 2 * * *`)."
            listed = reply("schedule list")
            assert "#1 " not in listed and "#2 parallel search" in listed
        with Session(engine) as s:
            assert [r.id for r in s.exec(select(Schedule)).all()] == [2]


def test_a_bad_digest_cron_is_logged_and_the_schedules_still_run(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                                 ) -> None:
    for url in fresh_database_url("sqlite", tmp_path):
        engine = make_engine(url)
        upgrade(engine)
        settings = _settings(tmp_path, url, KERNELBOT_DIGEST_CHANNELS="C7", KERNELBOT_DIGEST_CRON="0 25 * * *")
        scheduler = KernelScheduler(settings, engine)
        with caplog.at_level("ERROR", logger="kernelbot.scheduler"):
            scheduler.start()
        try:
            jobs = [job.id for job in scheduler.scheduler.get_jobs()]
        finally:
            scheduler.stop()
        assert jobs == ["sync-schedules", "recover-sessions"]
        assert "KERNELBOT_DIGEST_CRON `0 25 * * *`: the hour field `25` is not valid" in caplog.text
        engine.dispose()


def test_a_new_leader_records_every_period_the_dead_one_missed_but_a_first_start_no_backlog() -> None:
    trigger = parse_cron("*/3 * * * * *", "UTC")
    now = datetime(2026, 12, 1, 9, 0, 10, tzinfo=UTC)
    last_end = datetime(2026, 12, 1, 9, 0, 0, tzinfo=UTC).timestamp()
    assert [f.second for f in due_fires(trigger, now=now, last_end=last_end)] == [3, 6, 9]
    assert [f.second for f in due_fires(trigger, now=now, last_end=None)] == [9]
    assert due_fires(trigger, now=now, last_end=now.timestamp()) == []
    daily = parse_cron("0 9 * * *", "UTC")
    assert due_fires(daily, now=now, last_end=last_end - 86400) == [datetime(2026, 12, 1, 9, 0, tzinfo=UTC)]


def test_a_late_fire_records_every_period_it_overtook(engine: Engine) -> None:
    """A busy host runs the fire of 09:00:06 at 09:00:10, coalesced with that of :09: both periods are recorded,
    each once, and the periods stay consecutive (the two-server test saw a gap before this)."""
    trigger = parse_cron("*/3 * * * * *", "UTC")
    at = lambda second: datetime(2026, 12, 1, 9, 0, second, 200000, tzinfo=UTC)  # noqa: E731
    assert record_due_digests(engine, channel="C7", trigger=trigger, now=at(4)) == ["2026-12-01T09:00:03+00:00"]
    assert record_due_digests(engine, channel="C7", trigger=trigger, now=at(10)) == [
        "2026-12-01T09:00:06+00:00", "2026-12-01T09:00:09+00:00"]
    assert record_due_digests(engine, channel="C7", trigger=trigger, now=at(11)) == []  # nothing new is due
    with Session(engine) as s:
        runs = s.exec(select(DigestRun).order_by(col(DigestRun.period))).all()
    assert [datetime.fromisoformat(r.period).second for r in runs] == [3, 6, 9]
    assert all(b.payload["since"] == a.payload["until"] for a, b in zip(runs, runs[1:], strict=False))
