"""The scheduler of `kernelbot serve`: the daily digest of each digest channel (KERNELBOT_DIGEST_CHANNELS with the
channels' subscriptions over them, read at each digest time, so a `/kernel digest subscribe` needs no restart),
and the recurring searches people scheduled with `/kernel schedule add` (rows of `schedules`, re-read every few
seconds, so a schedule any `serve` process added or removed is picked up).

Only the leader runs it, but nothing here relies on that: every fire is keyed by its *scheduled* time, computed
from the cron trigger (never from "now"), so two processes firing the same moment do the same thing once -
a digest is a row unique per (channel, period), and a schedule is claimed by a compare-and-set on its
`last_run_at` in the transaction that starts its search. A process that starts (a new leader after a crash)
catches up on a fire of the last few minutes that nobody recorded.
"""

from __future__ import annotations

import logging
import re
import threading
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger
from sqlalchemy import Engine
from sqlmodel import Session

from agents.commands import recover_stranded
from agents.search import start_search
from agents.search_decide import SearchConfig
from bot.slack.outbound.digest import last_scheduled_end, period_start, record_digest
from bot.slack.visibility import ChannelDirectory, audience
from storage import digests, schedules
from storage.errors import KernelbotError
from storage.settings import Settings
from tpu_runner.tasks import load_task

log = logging.getLogger("kernelbot.scheduler")
SYNC_SECONDS = 15.0  # how often the schedules table is re-read
GRACE_SECONDS = 300  # a fire may run this late (a busy process, a new leader) and still count
LOOKBACK = timedelta(seconds=GRACE_SECONDS + 60)
SEARCH_KIND = "search"

_FIELDS = ("second", "minute", "hour", "day", "month", "day_of_week")
_LABELS = {"second": "second", "minute": "minute", "hour": "hour", "day": "day-of-month", "month": "month",
           "day_of_week": "weekday"}
_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")  # crontab numbering: 0 (and 7) is Sunday
_EXAMPLE = '`"0 2 * * *"` (every day at 02:00)'


class CronError(KernelbotError, ValueError):
    """A cron line kernelbot cannot use; the message names the field and gives an example."""
    next_step = ('write five fields - minute hour day month weekday - e.g. "0 2 * * *", and an IANA time zone '
                 "such as UTC")


# -- cron lines -------------------------------------------------------------------------------------------------
def _weekday_numbers(item: str, expr: str) -> list[int]:
    base, _, step_text = item.partition("/")
    step = 1
    if step_text:
        if not step_text.isdigit() or int(step_text) < 1:
            raise CronError(f"`{expr}`: the weekday step `/{step_text}` must be a positive whole number")
        step = int(step_text)
    if base == "*":
        first, last = 0, 6
    elif "-" in base:
        a, _, b = base.partition("-")
        if not (a.isdigit() and b.isdigit()):
            raise CronError(f"`{expr}`: the weekday `{item}` is neither 0-7 nor sun-sat")
        first, last = int(a), int(b)
    elif base.isdigit():
        first = int(base)
        last = 6 if step_text else first
    else:
        raise CronError(f"`{expr}`: the weekday `{item}` is neither 0-7 nor sun-sat")
    if first > 7 or last > 7:
        raise CronError(f"`{expr}`: the weekday `{item}` is out of range: weekdays are 0-7 (0 and 7 are Sunday) "
                        "or sun-sat")
    if first > last:
        raise CronError(f"`{expr}`: the weekday range `{item}` goes backwards; write it low-high, e.g. `1-5`")
    return [day % 7 for day in range(first, last + 1, step)]


def crontab_weekdays(value: str, expr: str = "") -> str:
    """A crontab weekday field (0 or 7 is Sunday) as APScheduler 3 reads it (where 0 is Monday): by names."""
    if value == "*" or re.fullmatch(r"[a-zA-Z,\-]+", value):
        return value.lower()
    names: list[str] = []
    for item in value.split(","):
        if re.search(r"[a-zA-Z]", item):
            names.append(item.lower())
            continue
        for day in _weekday_numbers(item, expr or value):
            if _WEEKDAYS[day] not in names:
                names.append(_WEEKDAYS[day])
    return ",".join(names)


def cron_fields(expr: str) -> dict[str, str]:
    """minute hour day month weekday (or seconds first, 6 fields) -> APScheduler's CronTrigger fields."""
    parts = expr.split()
    if len(parts) == 5:
        parts = ["0", *parts]
    elif len(parts) != 6:
        raise CronError(f"`{expr}` has {len(parts)} field(s); a cron line has 5 - minute hour day month weekday - "
                        f"or 6 with seconds first, e.g. {_EXAMPLE}")
    fields = dict(zip(_FIELDS, parts, strict=True))
    if fields["day"] != "*" and fields["day_of_week"] != "*":
        # crontab fires when either matches, APScheduler only when both do: refuse rather than guess.
        raise CronError(f"`{expr}` restricts both the day of the month and the weekday, which cron and kernelbot "
                        "read differently; keep one of them `*`")
    fields["day_of_week"] = crontab_weekdays(fields["day_of_week"], expr)
    return fields


def parse_cron(expr: str, timezone: str = "UTC") -> CronTrigger:
    """The trigger of a cron line in a time zone; CronError names what is wrong."""
    try:
        tz = zoneinfo.ZoneInfo(timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise CronError(f"`{timezone}` is not a time zone; use an IANA name such as Europe/Paris or UTC") from None
    fields = cron_fields(expr)
    for name, value in fields.items():
        try:
            CronTrigger(**{name: value}, timezone=tz)
        except ValueError as exc:
            raise CronError(f"`{expr}`: the {_LABELS[name]} field `{value}` is not valid ({exc}); e.g. "
                            f"{_EXAMPLE}") from None
    try:
        trigger = CronTrigger(**fields, timezone=tz)
    except ValueError as exc:
        raise CronError(f"`{expr}` is not a valid cron line ({exc}); e.g. {_EXAMPLE}") from None
    if trigger.get_next_fire_time(None, datetime.now(tz)) is None:
        raise CronError(f"`{expr}` never fires (no such date); e.g. {_EXAMPLE}")
    return trigger


def next_fires(trigger: CronTrigger, after: datetime, count: int) -> list[datetime]:
    fires: list[datetime] = []
    fire = trigger.get_next_fire_time(None, after)
    while fire is not None and len(fires) < count:
        fires.append(fire)
        fire = trigger.get_next_fire_time(fire, fire)
    return fires


def shortest_gap(trigger: CronTrigger, after: datetime, fires: int = 60) -> float | None:
    """The shortest time in seconds between two of the next fires (None if it fires at most once)."""
    times = next_fires(trigger, after, fires)
    gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)]
    return min(gaps) if gaps else None


def latest_fire(trigger: CronTrigger, at: datetime, lookback: timedelta = LOOKBACK) -> datetime | None:
    """The trigger's last scheduled time at or before `at` (within `lookback`): what a fire running at `at` is
    for. Every process computes the same value for the same fire, whenever it runs it."""
    fire = trigger.get_next_fire_time(None, at - lookback)
    latest = None
    while fire is not None and fire <= at:
        latest = fire
        fire = trigger.get_next_fire_time(fire, fire)
    return latest


def due_fires(trigger: CronTrigger, *, now: datetime, last_end: float | None,
              grace: float = GRACE_SECONDS) -> list[datetime]:
    """The scheduled times of the last `grace` seconds still to record: every one after the channel's last
    recorded digest (a leader that died, or a fire that ran late and was coalesced with the next, missed them),
    or only the latest when the channel never had a digest (a first start does not post a backlog)."""
    fires: list[datetime] = []
    fire = trigger.get_next_fire_time(None, now - timedelta(seconds=grace))
    while fire is not None and fire <= now:
        if last_end is None or fire.timestamp() > last_end:
            fires.append(fire)
        fire = trigger.get_next_fire_time(fire, fire)
    return fires if last_end is not None else fires[-1:]


def period_key(fire: datetime) -> str:
    """A digest's period: its scheduled time, in UTC, to the second (the same string in every process)."""
    return fire.astimezone(UTC).isoformat(timespec="seconds")


# -- one fire ---------------------------------------------------------------------------------------------------
def fire_digest(engine: Engine, *, channel: str, fire: datetime, visibility: ChannelDirectory | None = None) -> bool:
    """Record the digest the fire at `fire` closes (pending, for the notifier); False if it is recorded already.
    It shows the sessions `channel` may be shown, as `visibility` tells (without it: only its own and a
    terminal's)."""
    until = fire.timestamp()
    with Session(engine) as s:
        since = period_start(s, channel=channel, until=until)
    recorded = record_digest(engine, channel=channel, period=period_key(fire), since=since, until=until,
                             shown=audience(visibility, where=channel))
    if recorded:
        log.info("scheduler: recorded the digest of %s for %s", channel, period_key(fire))
    return recorded


def record_due_digests(engine: Engine, *, channel: str, trigger: CronTrigger, now: datetime,
                       visibility: ChannelDirectory | None = None) -> list[str]:
    """Record every period of the channel due by `now` and not recorded yet; returns the periods this call
    recorded. Each fire does this rather than record only the latest scheduled time: a fire that runs late
    (a busy host) stands for every period it overtook, and a new leader for those a dead one left."""
    with Session(engine) as s:
        last_end = last_scheduled_end(s, channel=channel)
    return [period_key(fire) for fire in due_fires(trigger, now=now, last_end=last_end)
            if fire_digest(engine, channel=channel, fire=fire, visibility=visibility)]


def fire_schedule(engine: Engine, *, schedule_id: int, fire_at: float) -> str | None:
    """Start the schedule's search for the fire at `fire_at` (UNIX seconds), once however many processes try:
    returns the new session's id, or None when this fire was already claimed (or the schedule is gone).
    The claim and the search commit together: a search that cannot start leaves the fire unclaimed."""
    with Session(engine) as s, s.begin():
        schedule = schedules.claim_schedule(s, schedule_id=schedule_id, fire_at=fire_at)
        if schedule is None:
            return None
        p = dict(schedule.payload or {})
        task = load_task(Path(str(p["task_dir"])))
        config = SearchConfig(strategy=str(p.get("strategy") or "beam"), budget=int(p.get("budget") or 12))
        session_id = start_search(s, task=task, target=str(p.get("target") or "v6e"), config=config,
                                  seed_code=None, brain=str(p.get("brain") or "offline"), owner=p.get("owner"),
                                  slack_channel=schedule.channel)
    log.info("scheduler: schedule #%d started search %s", schedule_id, session_id)
    return session_id


# -- the scheduler ----------------------------------------------------------------------------------------------
RECOVER_SECONDS = 60.0  # how often serve looks for sessions left without their job


@dataclass
class KernelScheduler:
    settings: Settings
    engine: Engine
    sync_seconds: float = SYNC_SECONDS
    visibility: ChannelDirectory | None = None  # what digests may show of other channels (None: nothing)
    scheduler: BackgroundScheduler = field(init=False)
    _known: dict[int, tuple[str, str]] = field(default_factory=dict)  # schedule id -> (cron, timezone) scheduled
    _broken: set[tuple[int, str, str]] = field(default_factory=set)  # rows whose cron was refused (logged once)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.scheduler = BackgroundScheduler(
            timezone=zoneinfo.ZoneInfo(self.settings.timezone),
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": GRACE_SECONDS})

    def start(self) -> None:
        self.scheduler.start()
        self._add_digests()
        self.scheduler.add_job(self.sync, "interval", seconds=self.sync_seconds, id="sync-schedules",
                               next_run_time=datetime.now(UTC))
        self.scheduler.add_job(self.recover, "interval", seconds=RECOVER_SECONDS, id="recover-sessions",
                               next_run_time=datetime.now(UTC))

    def recover(self) -> None:
        """Sessions left with work and no live job (a crash, a lost job) get their job back."""
        try:
            for session_id in recover_stranded(self.engine):
                log.warning("session %s had work to do and no live job; queued it again", session_id)
        except Exception:  # noqa: BLE001 - a sweep that fails now runs again at its next interval
            log.exception("recovering stranded sessions failed")

    def stop(self) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)

    def _catch_up(self, trigger: CronTrigger, *, after: float) -> dict[str, Any]:
        """Fire now for a scheduled time of the last few minutes (after `after`) that may have gone unrecorded."""
        now = datetime.now(UTC)
        missed = latest_fire(trigger, now, timedelta(seconds=GRACE_SECONDS))
        return {"next_run_time": now} if missed is not None and missed.timestamp() > after else {}

    # -- digests ----------------------------------------------------------------------------------------------------
    def _add_digests(self) -> None:
        try:
            trigger = parse_cron(self.settings.digest_cron, self.settings.timezone)
        except CronError as exc:
            log.error("scheduler: KERNELBOT_DIGEST_CRON %s; no digest will be posted until it is fixed", exc)
            return
        self._record_due_digests(trigger)  # what a dead leader left unrecorded
        self.scheduler.add_job(self._record_due_digests, trigger, args=(trigger,), id="digests", replace_existing=True)
        log.info("scheduler: digests at `%s` (%s) for the subscribed channels, now %s", self.settings.digest_cron,
                 self.settings.timezone, ", ".join(self.digest_channels()) or "none")

    def digest_channels(self) -> list[str]:
        """Where digests go now: KERNELBOT_DIGEST_CHANNELS with the channels' subscriptions over them."""
        with Session(self.engine) as s:
            return digests.get_digest_channels(s, defaults=self.settings.digest_channels)

    def _record_due_digests(self, trigger: CronTrigger) -> None:
        try:
            channels = self.digest_channels()
        except Exception:  # noqa: BLE001 - a database hiccup must not end the scheduler; the next fire catches up
            log.exception("scheduler: could not read where digests go")
            return
        for channel in channels:
            try:
                record_due_digests(self.engine, channel=channel, trigger=trigger, now=datetime.now(UTC),
                                   visibility=self.visibility)
            except Exception:  # noqa: BLE001 - one channel's failure must not keep the others' digests
                log.exception("scheduler: could not record the digests of %s", channel)

    # -- recurring searches -----------------------------------------------------------------------------------------
    def sync(self) -> None:
        """Make the scheduled jobs match the enabled search schedules in the database."""
        try:
            with Session(self.engine) as s:
                rows = schedules.get_schedules(s, kind=SEARCH_KIND, enabled_only=True)
        except Exception:  # noqa: BLE001 - the database may be away for a while; the next sync tries again
            log.exception("scheduler: could not read the schedules")
            return
        with self._lock:
            wanted = {r.id: r for r in rows if r.id is not None}
            for schedule_id in list(self._known):
                if schedule_id not in wanted:
                    self._known.pop(schedule_id)
                    if self.scheduler.get_job(f"schedule:{schedule_id}"):
                        self.scheduler.remove_job(f"schedule:{schedule_id}")
                    log.info("scheduler: schedule #%d removed", schedule_id)
            for schedule_id, row in wanted.items():
                if self._known.get(schedule_id) == (row.cron, row.timezone):
                    continue
                try:
                    trigger = parse_cron(row.cron, row.timezone)
                except CronError as exc:
                    if (schedule_id, row.cron, row.timezone) not in self._broken:
                        self._broken.add((schedule_id, row.cron, row.timezone))
                        log.error("scheduler: schedule #%d is skipped: %s; remove it with `/kernel schedule "
                                  "remove %d`", schedule_id, exc, schedule_id)
                    continue
                after = max(row.last_run_at or 0.0, row.created_at)
                self.scheduler.add_job(self._search, trigger, args=(schedule_id, trigger), id=f"schedule:{schedule_id}",
                                       replace_existing=True, **self._catch_up(trigger, after=after))
                self._known[schedule_id] = (row.cron, row.timezone)
                log.info("scheduler: schedule #%d at `%s` (%s)", schedule_id, row.cron, row.timezone)

    def _search(self, schedule_id: int, trigger: CronTrigger) -> None:
        fire = latest_fire(trigger, datetime.now(UTC))
        if fire is None:
            return
        try:
            fire_schedule(self.engine, schedule_id=schedule_id, fire_at=fire.timestamp())
        except Exception:  # noqa: BLE001 - one schedule's failure (its task gone) must not stop the others
            log.exception("scheduler: schedule #%d could not start its search for %s; `/kernel schedule list` "
                          "shows it, `/kernel schedule remove %d` removes it", schedule_id, period_key(fire),
                          schedule_id)


def start_scheduler(settings: Settings, engine: Engine, *, visibility: ChannelDirectory | None = None
                    ) -> Callable[[], None]:
    """Start the digests and the recurring searches in the background; returns the function that stops them.
    `visibility` lets each channel's digest show public channels' sessions besides its own."""
    scheduler = KernelScheduler(settings, engine, visibility=visibility)
    scheduler.start()
    return scheduler.stop
