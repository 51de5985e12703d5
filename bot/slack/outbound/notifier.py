"""The notifier: the one way session events (and digests) reach Slack.

It reads the outbox - session events of sessions that live in a channel, not yet delivered - and shows each
in its thread through `thread_ops`, one worker per channel so a thread's messages keep their order. Posts are
paced per channel; a 429 pauses the channel for its Retry-After; a 5xx or a connection error backs the channel
off and the same events are tried again, so nothing is lost while Slack is down. Every post is recorded under
its key (`slack_messages`) right after Slack took it; a post whose recording a crash prevented is found again
by its metadata (or its files' names) before anything is posted for a retried event, so nothing is posted twice.
Edits only change what a message shows, so a batch sends the last edit of each message once, at its end.
A message may show a picture uploaded unshared just before it: its blocks name the upload's key and get its file
id here (`thread_ops.with_files`). When Slack refuses a session's channel for good (the bot was removed, the
channel archived), the events are skipped and the session's owner is told once, in a direct message.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session

from bot.slack.outbound.event_data import event_view, load_session
from bot.slack.outbound.sender import MAX_BACKOFF_SECONDS, SlackRejected, SlackSender, SlackUnavailable, content_hash
from bot.slack.outbound.thread_ops import Op, Show, Upload, ops_for, with_files, without_images
from bot.slack.views.session import undelivered_notice
from storage import outbox, sessions
from storage.logs import log_context
from storage.models import DigestRun, KernelSession, SessionEvent, now

log = logging.getLogger("kernelbot.notifier")
SURFACE = "slack"
SETTLED_AFTER_SECONDS = 300.0  # events older than this with a lower id than every pending one are never looked at
FALLBACK_ERRORS = ("invalid_blocks", "msg_blocks_too_long")
# Slack refuses the channel itself, for good: every later post there fails the same way until a person acts.
CHANNEL_ERRORS = frozenset({"not_in_channel", "channel_not_found", "is_archived"})
UNDELIVERED_KEY = "dm:undelivered"  # the direct message that told the owner, recorded in the session's scope


@dataclass
class _Place:
    """Where a batch posts: a scope (a session id or `digest-<id>`), its channel and thread, what is posted."""

    scope: str
    channel: str
    thread_ts: str | None
    posted: dict[str, tuple[str, str | None]]  # key -> (ts, content hash)
    since: float  # no post of this scope is older: where to look for a lost one
    # The root was posted: its ts starts the thread. Called in the transaction that records the root's post,
    # so a crash never leaves a recorded root without its thread (the events would then go to the channel).
    on_root: Callable[[Session, str], None] | None = None


@dataclass
class Notifier:
    engine: Engine
    sender: SlackSender
    poll_seconds: float = 0.5
    workers: int = 4
    batch: int = 200
    digest_ops: Callable[[DigestRun], list[Op]] | None = None  # how a digest shows (`digest`), when enabled
    stop: threading.Event = field(default_factory=threading.Event)
    wake: threading.Event = field(default_factory=threading.Event)
    delivered: int = 0
    _busy: set[str] = field(default_factory=set)
    _retry_at: dict[str, float] = field(default_factory=dict)
    _failures: dict[str, int] = field(default_factory=dict)
    _floor: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _pool: ThreadPoolExecutor | None = None

    def __post_init__(self) -> None:
        self.sender.stop = self.stop

    # -- the loop -------------------------------------------------------------------------------------------------
    def run(self) -> None:
        log.info("notifier: delivering session events to Slack")
        try:
            while not self.stop.is_set():
                try:
                    self.round()
                except Exception:  # noqa: BLE001 - a bad round (database away) must not end delivery for good
                    log.exception("notifier: a delivery round failed; trying again")
                    self.stop.wait(min(MAX_BACKOFF_SECONDS, 5.0))
                self.wake.wait(self.poll_seconds)
                self.wake.clear()
        finally:
            if self._pool:
                self._pool.shutdown(wait=True, cancel_futures=True)

    def notify(self) -> None:
        """Something was recorded: look now rather than at the next poll."""
        self.wake.set()

    def round(self) -> int:
        """Hand each channel with pending work to a worker (one per channel at a time); returns how many."""
        work = self._pending()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="notify")
        started = 0
        t = time.monotonic()
        for channel, items in work.items():
            with self._lock:
                if channel in self._busy or self._retry_at.get(channel, 0.0) > t:
                    continue
                self._busy.add(channel)
            self._pool.submit(self._deliver_channel, channel, items)
            started += 1
        return started

    def idle(self) -> bool:
        with self._lock:
            busy = bool(self._busy)
        return not busy and not self._pending()

    def drain(self, timeout: float = 30.0) -> bool:
        """Deliver until nothing is pending (tests, benchmarks); False if that did not happen in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.round()
            if self.idle():
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        self.stop.set()
        self.wake.set()
        if self._pool:
            self._pool.shutdown(wait=True, cancel_futures=True)

    # -- what is pending ------------------------------------------------------------------------------------------
    def _pending(self) -> dict[str, list[tuple[str, Any]]]:
        """channel -> [("event", (event, session_id)) | ("digest", run)], oldest first."""
        work: dict[str, list[tuple[str, Any]]] = {}
        with Session(self.engine) as s:
            rows = outbox.get_undelivered_events(s, surface=SURFACE, after_id=self._floor, limit=self.batch)
            for event, channel in rows:
                work.setdefault(channel, []).append(("event", event))
            if not rows:
                # Ids are handed out before commit, so only old events are surely settled below the floor.
                old = outbox.settled_below(s, created_before=now() - SETTLED_AFTER_SECONDS)
                self._floor = max(self._floor, old)
            if self.digest_ops is not None:
                for run in outbox.get_pending_digest_runs(s):
                    work.setdefault(run.channel, []).append(("digest", run))
        return work

    # -- one channel ----------------------------------------------------------------------------------------------
    def _deliver_channel(self, channel: str, items: list[tuple[str, Any]]) -> None:
        try:
            events = [item for kind, item in items if kind == "event"]
            by_session: dict[str, list[SessionEvent]] = {}
            for event in events:
                by_session.setdefault(event.session_id, []).append(event)
            for session_id, session_events in by_session.items():
                with log_context(session=session_id, channel=channel):
                    self._deliver_session(session_id, channel, session_events)
            for kind, run in items:
                if kind == "digest":
                    self._deliver_digest(run)
            with self._lock:
                self._failures.pop(channel, None)
        except SlackUnavailable as exc:
            with self._lock:
                failures = self._failures[channel] = self._failures.get(channel, 0) + 1
                delay = exc.retry_after or min(MAX_BACKOFF_SECONDS, 0.5 * 2 ** (failures - 1))
                self._retry_at[channel] = time.monotonic() + delay
            log.warning("notifier: channel %s: %s; trying again in %.1f s (attempt %d)", channel, exc, delay, failures)
        except Exception:  # noqa: BLE001 - logged with its traceback; the events stay pending and are retried
            log.exception("notifier: delivering to channel %s failed", channel)
            with self._lock:
                self._retry_at[channel] = time.monotonic() + 5.0
        finally:
            with self._lock:
                self._busy.discard(channel)
            self.wake.set()

    def _deliver_session(self, session_id: str, channel: str, events: list[SessionEvent]) -> None:
        attempts = self._start_attempts([e.id or 0 for e in events])
        with Session(self.engine) as s:
            data = load_session(s, session_id)
            place = _Place(scope=session_id, channel=channel, thread_ts=data.record.slack_thread_ts,
                           posted=outbox.get_posted(s, scope=session_id), since=data.record.created_at)

        def on_root(s: Session, ts: str) -> None:
            sessions.set_thread(s, session_id=session_id, thread_ts=ts)
            place.thread_ts = ts

        place.on_root = on_root if data.record.slack_thread_ts is None else None
        edits: dict[str, dict[str, Any]] = {}
        done: list[int] = []
        for event in events:
            with Session(self.engine) as s:
                data.posted = set(place.posted)
                view = event_view(s, data, event)
            try:
                for op in ops_for(view):
                    self._apply(op, place, edits, retried=attempts.get(event.id or 0, 1) > 1)
            except SlackRejected as exc:
                log.warning("notifier: Slack refused event %s of session %s (%s); it is skipped", event.id,
                            session_id, exc.error)
                self._settle([event.id or 0], status="failed", error=exc.error)
                if exc.error in CHANNEL_ERRORS:
                    self._tell_owner(place, data.record, exc.error)
                continue
            done.append(event.id or 0)
        self._flush_edits(place, edits)
        self._settle(done, status="delivered")
        self.delivered += len(done)

    def _deliver_digest(self, run: DigestRun) -> None:
        assert self.digest_ops is not None
        scope = f"digest-{run.id}"
        with Session(self.engine) as s, s.begin():
            attempts = outbox.start_digest_attempt(s, run_id=run.id)
            if attempts is None:
                return
            place = _Place(scope=scope, channel=run.channel, thread_ts=None, posted=outbox.get_posted(s, scope=scope),
                           since=run.created_at)
        edits: dict[str, dict[str, Any]] = {}
        try:
            for op in self.digest_ops(run):
                self._apply(op, place, edits, retried=attempts > 1, top_level=True)
            self._flush_edits(place, edits)
        except SlackRejected as exc:
            self._settle_digest(run.id or 0, "failed", exc.error)
            return
        self._settle_digest(run.id or 0, "posted", None)

    # -- one message ----------------------------------------------------------------------------------------------
    def _apply(self, op: Op, place: _Place, edits: dict[str, dict[str, Any]], *, retried: bool,
               top_level: bool = False) -> None:
        if isinstance(op, Show):  # the pictures it shows, by the ids of the files uploaded for them
            op = replace(op, payload=with_files(op.payload, {key: ts for key, (ts, _) in place.posted.items()}))
        if op.key in place.posted:
            if isinstance(op, Show):
                edits[op.key] = op.payload
            return
        root_post = isinstance(op, Show) and op.key == "root" and not op.in_thread
        thread = None if (top_level or root_post) else place.thread_ts
        found = None
        if retried and not (isinstance(op, Upload) and not op.shared):
            found = self.sender.find(channel=place.channel, thread_ts=thread, scope=place.scope, key=op.key,
                                     filenames=[f.filename for f in op.files] if isinstance(op, Upload) else (),
                                     oldest=place.since - 1.0)
        if isinstance(op, Upload):
            # An unshared upload leaves nothing in the channel to find after a crash: if one came between Slack
            # taking it and this record, it is uploaded again, and the first copy is an orphan no message shows
            # and only the bot can see - harmless.
            ts = found or self.sender.upload(channel=place.channel, thread_ts=thread, comment=op.comment,
                                             files=[(f.filename, f.content, f.title) for f in op.files],
                                             shared=op.shared)
            self._record(place, op.key, ts, None)
            return
        ts = found
        digest = content_hash(op.payload)
        if ts is None:
            ts = self._post(place, thread, op.key, op.payload)
        elif found:
            edits[op.key] = op.payload  # found after a crash: bring it up to date with the rest of the batch
            digest = None
        self._record(place, op.key, ts, digest, starts_thread=root_post)

    def _post(self, place: _Place, thread: str | None, key: str, payload: dict[str, Any]) -> str:
        """Post the message; when Slack refuses its blocks, post it without its pictures (one Slack is still
        processing, say), then as its text alone."""
        tries = [payload]
        if any(b.get("type") == "image" for b in payload.get("blocks") or []):
            tries.append(without_images(payload))
        tries.append({"text": payload["text"]})
        for i, attempt in enumerate(tries):
            try:
                return self.sender.post(channel=place.channel, thread_ts=thread, payload=attempt, scope=place.scope,
                                        key=key)
            except SlackRejected as exc:
                if exc.error not in FALLBACK_ERRORS or i == len(tries) - 1:
                    raise
                log.warning("notifier: %s refused the blocks of %s/%s; posting %s", exc.error, place.scope, key,
                            "them without pictures" if "blocks" in tries[i + 1] else "the text alone")
        raise AssertionError("unreachable: the last try returns or raises")

    def _tell_owner(self, place: _Place, record: KernelSession, error: str) -> None:
        """Tell the session's owner, in a direct message, that its thread no longer gets its updates and what to
        do; once per session, even across restarts (recorded under UNDELIVERED_KEY)."""
        owner = record.owner
        if not owner or UNDELIVERED_KEY in place.posted:
            return
        payload = undelivered_notice(session_id=record.id, task=record.task, target=record.target,
                                     channel=place.channel, error=error)
        try:
            ts = self.sender.post(channel=owner, thread_ts=None, payload=payload, scope=place.scope,
                                  key=UNDELIVERED_KEY)
        except (SlackRejected, SlackUnavailable) as exc:  # said at the next refusal, if there is one
            log.warning("notifier: could not tell %s that session %s's channel refuses its posts (%s)", owner,
                        place.scope, exc)
            return
        # A crash between the post and this record says it once more after the restart: better twice than never.
        self._record(place, UNDELIVERED_KEY, ts, None, channel=owner)

    def _flush_edits(self, place: _Place, edits: dict[str, dict[str, Any]]) -> None:
        for key, payload in edits.items():
            ts, shown = place.posted[key]
            digest = content_hash(payload)
            if digest == shown:
                continue
            try:
                self.sender.update(channel=place.channel, ts=ts, payload=payload)
            except SlackRejected as exc:
                log.warning("notifier: could not edit %s/%s (%s); left as it was", place.scope, key, exc.error)
                continue
            self._record(place, key, ts, digest)

    # -- recording ------------------------------------------------------------------------------------------------
    def _record(self, place: _Place, key: str, ts: str, digest: str | None, *, starts_thread: bool = False,
                channel: str | None = None) -> None:
        with Session(self.engine) as s, s.begin():
            outbox.record_message(s, scope=place.scope, key=key, channel=channel or place.channel, ts=ts,
                                  content_hash=digest)
            if starts_thread and place.on_root is not None:
                place.on_root(s, ts)
        place.posted[key] = (ts, digest)

    def _start_attempts(self, event_ids: list[int]) -> dict[int, int]:
        """Count this attempt before any call to Slack: a retried event is one that may have posted already."""
        with Session(self.engine) as s, s.begin():
            return outbox.start_attempts(s, event_ids=event_ids, surface=SURFACE)

    def _settle(self, event_ids: list[int], *, status: str, error: str | None = None) -> None:
        if not event_ids:
            return
        with Session(self.engine) as s, s.begin():
            outbox.settle_events(s, event_ids=event_ids, surface=SURFACE, status=status, error=error)

    def _settle_digest(self, run_id: int, status: str, error: str | None) -> None:
        with Session(self.engine) as s, s.begin():
            outbox.settle_digest_run(s, run_id=run_id, status=status, error=error)
