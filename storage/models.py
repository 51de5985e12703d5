"""Everything kernelbot keeps: sessions and their steps, candidates, evaluations, human decisions, session events
with their delivery per surface, the job queue, runners, schedules, digest runs and the channels' digest
subscriptions, and the Slack messages posted and deliveries received.

Times are UNIX seconds (float, UTC): the queue does arithmetic on them and every database compares them alike.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from sqlalchemy import JSON, Column, Index, LargeBinary, Text, UniqueConstraint, text
from sqlmodel import Field, SQLModel

JOB_STATUSES = ("queued", "running", "done", "failed", "cancelled")
SESSION_MODES = ("hitl", "auto", "search")
SESSION_STATUSES = ("active", "awaiting", "done", "failed", "cancelled")  # awaiting: a person answers next


def now() -> float:
    return time.time()


def new_id() -> str:
    return uuid.uuid4().hex[:12]


def _json(**kwargs: Any) -> Any:
    return Field(default=None, sa_column=Column(JSON, **kwargs))


class Job(SQLModel, table=True):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_claim", "status", "kind", "priority", "id"),
        # At most one live job per de-duplication key.
        Index("ux_jobs_dedup_live", "dedup_key", unique=True,
              sqlite_where=text("status IN ('queued', 'running')"),
              postgresql_where=text("status IN ('queued', 'running')")),
    )

    id: int | None = Field(default=None, primary_key=True)
    kind: str = Field(index=True)  # a handler in the runners' JobKinds (tpu_runner.jobs.contract)
    payload: dict[str, Any] | None = _json()
    status: str = Field(default="queued")  # one of JOB_STATUSES
    priority: int = 0
    dedup_key: str | None = None
    target: str | None = None  # a runner must serve this target to claim the job; None: any runner
    attempts: int = 0
    max_attempts: int = 3
    fence: int = 0  # raised on every claim; only the current holder's fence may complete or fail the job
    runner_id: str | None = Field(default=None, index=True)
    lease_expires_at: float | None = None
    run_after: float = Field(default_factory=now)
    last_error: str | None = Field(default=None, sa_column=Column(Text))
    result: dict[str, Any] | None = _json()
    session_id: str | None = Field(default=None, index=True)
    created_at: float = Field(default_factory=now)
    started_at: float | None = None
    finished_at: float | None = None


class Runner(SQLModel, table=True):
    __tablename__ = "runners"

    id: str = Field(default_factory=new_id, primary_key=True)
    name: str = Field(index=True)
    host: str
    pid: int
    hardware: dict[str, Any] | None = _json()
    targets: list[str] | None = _json()
    kinds: list[str] | None = _json()
    concurrency: int = 1
    status: str = "active"  # active | stopping | stopped
    started_at: float = Field(default_factory=now)
    heartbeat_at: float = Field(default_factory=now)
    current_jobs: list[int] | None = _json()


class Candidate(SQLModel, table=True):
    __tablename__ = "candidates"
    # A search session evaluates each normalised lowered program once (NULLs - unhashed candidates - are distinct).
    __table_args__ = (Index("ux_candidates_session_ir", "session_id", "ir_hash", unique=True),)

    id: int | None = Field(default=None, primary_key=True)
    session_id: str | None = Field(default=None, index=True)
    parent_id: int | None = Field(default=None, foreign_key="candidates.id")
    task: str
    code: str = Field(sa_column=Column(Text, nullable=False))
    plan: str | None = Field(default=None, sa_column=Column(Text))
    strategy: str | None = None
    content_hash: str = Field(index=True)
    ir_hash: str | None = Field(default=None, index=True)
    duplicate_of: int | None = None  # the candidate of this session that lowers to the same program
    meta: dict[str, Any] | None = _json()  # search bookkeeping: trajectory, depth, params, generation error
    created_at: float = Field(default_factory=now)


class Evaluation(SQLModel, table=True):
    __tablename__ = "evaluations"
    __table_args__ = (UniqueConstraint("job_id", name="ux_evaluations_job"),)  # one evaluation per job

    id: int | None = Field(default=None, primary_key=True)
    job_id: int | None = Field(default=None, foreign_key="jobs.id")
    candidate_id: int | None = Field(default=None, foreign_key="candidates.id", index=True)
    task: str
    target: str
    verdict: str = Field(index=True)
    stage: str
    speedup: float | None = None
    method: str | None = None  # measured | estimated
    result: dict[str, Any] | None = _json()
    artifacts_dir: str | None = None
    runner_id: str | None = None
    created_at: float = Field(default_factory=now)

    @property
    def error_kind(self) -> str | None:
        """The kind of error the evaluator reported (`vmem_oom`, `timeout`, ...), None where it reported none."""
        return ((self.result or {}).get("error") or {}).get("kind")


class KernelSession(SQLModel, table=True):
    __tablename__ = "sessions"

    id: str = Field(default_factory=new_id, primary_key=True)
    mode: str  # one of SESSION_MODES; a hand-off or hand-back switches hitl and auto
    status: str = "active"  # one of SESSION_STATUSES
    task: str
    task_dir: str | None = None  # where runners find the task (reference.py + kernel_task.yaml)
    target: str = "v6e"
    owner: str | None = None
    slack_channel: str | None = None
    slack_thread_ts: str | None = Field(default=None, index=True)  # the thread the session lives in
    budget: dict[str, Any] | None = _json()
    best_candidate_id: int | None = None
    created_at: float = Field(default_factory=now)
    updated_at: float = Field(default_factory=now)


class Step(SQLModel, table=True):
    __tablename__ = "steps"

    id: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(foreign_key="sessions.id", index=True)
    index: int
    kind: str  # an Auto action (agents.auto_decide.ACTIONS), or decision: a person's
    status: str = "pending"  # steps are recorded once finished, as done (storage.sessions.add_step)
    inputs: dict[str, Any] | None = _json()
    outputs: dict[str, Any] | None = _json()
    created_at: float = Field(default_factory=now)
    updated_at: float = Field(default_factory=now)


class Decision(SQLModel, table=True):
    __tablename__ = "decisions"

    id: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(foreign_key="sessions.id", index=True)
    step_id: int | None = Field(default=None, foreign_key="steps.id")
    actor: str
    action: str  # approve | redirect | iterate | finish | cancel | handoff | handback | adopt | search
    text: str | None = Field(default=None, sa_column=Column(Text))
    created_at: float = Field(default_factory=now)


class SessionEvent(SQLModel, table=True):
    __tablename__ = "session_events"

    id: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(foreign_key="sessions.id", index=True)
    # session_started | task_described | step | progress | decision | auto_paused | auto_finished | hitl_paused |
    # hitl_finished | search_finished | session_recovered (agents), job_done | job_failed (the runner's daemon)
    kind: str
    payload: dict[str, Any] | None = _json()
    created_at: float = Field(default_factory=now)


class EventDelivery(SQLModel, table=True):
    __tablename__ = "event_deliveries"
    __table_args__ = (UniqueConstraint("event_id", "surface", name="ux_event_deliveries_surface"),)

    id: int | None = Field(default=None, primary_key=True)
    event_id: int = Field(foreign_key="session_events.id", index=True)
    surface: str  # slack (the terminal follows a session's events without deliveries)
    status: str = "pending"  # pending | delivered | failed
    attempts: int = 0
    external_ref: str | None = None  # e.g. the Slack message ts
    delivered_at: float | None = None
    last_error: str | None = Field(default=None, sa_column=Column(Text))


class Schedule(SQLModel, table=True):
    __tablename__ = "schedules"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(unique=True)
    kind: str  # search: a recurring search (digests: settings and DigestSubscription; recorded as DigestRun)
    cron: str
    timezone: str = "UTC"
    payload: dict[str, Any] | None = _json()
    channel: str | None = None
    enabled: bool = True
    created_at: float = Field(default_factory=now)
    last_run_at: float | None = None


class DigestRun(SQLModel, table=True):
    __tablename__ = "digest_runs"
    __table_args__ = (UniqueConstraint("channel", "period", name="ux_digest_runs_period"),)

    id: int | None = Field(default=None, primary_key=True)
    channel: str
    period: str  # the scheduled time that closes the period, e.g. "2026-11-30T09:00+00:00"
    status: str = "pending"  # pending | posted | failed
    payload: dict[str, Any] | None = _json()  # what the digest says, gathered when it was due
    attempts: int = 0
    last_error: str | None = Field(default=None, sa_column=Column(Text))
    created_at: float = Field(default_factory=now)
    posted_at: float | None = None


class DigestSubscription(SQLModel, table=True):
    """A channel's choice about the daily digest, over KERNELBOT_DIGEST_CHANNELS (the default): subscribed, or
    unsubscribed (kept, so an unsubscribe of a listed channel holds); who chose and when."""

    __tablename__ = "digest_subscriptions"

    channel: str = Field(primary_key=True)
    subscribed: bool = True
    changed_by: str | None = None  # the Slack user id of who subscribed or unsubscribed
    changed_at: float = Field(default_factory=now)


class Blob(SQLModel, table=True):
    """Bytes by their sha256: the files jobs carry (storage.blobs), each stored once."""

    __tablename__ = "blobs"

    digest: str = Field(primary_key=True)
    content: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    size: int
    created_at: float = Field(default_factory=now)


class SlackMessage(SQLModel, table=True):
    """A message kernelbot posted, under a key unique in its scope (a session id, or `digest-<id>`): what lets
    the notifier edit a message later, and never post the same thing twice."""

    __tablename__ = "slack_messages"
    __table_args__ = (UniqueConstraint("scope", "key", name="ux_slack_messages_key"),)

    id: int | None = Field(default=None, primary_key=True)
    scope: str = Field(index=True)
    key: str  # root | card:<step> | progress:<step> | auto | file:<name> | event:<id>:<part> | ...
    channel: str
    ts: str
    content_hash: str | None = None  # of what the message shows now: an edit that changes nothing is not sent
    created_at: float = Field(default_factory=now)
    updated_at: float = Field(default_factory=now)


class SlackInbox(SQLModel, table=True):
    """Inbound Slack deliveries already handled: Slack retries events, and a retry must change nothing."""

    __tablename__ = "slack_inbox"

    key: str = Field(primary_key=True)  # the Events API event_id, or channel:ts of a message
    created_at: float = Field(default_factory=now)


class TunedParams(SQLModel, table=True):
    """The best tunable parameters a search found for a task on a chip under a JAX version: what the next search of
    the same (task, chip, JAX) starts from. Kept only while no later search finds a clearly faster kernel."""

    __tablename__ = "tuned_params"
    __table_args__ = (UniqueConstraint("task_digest", "target", "jax_version", name="ux_tuned_params_key"),)

    id: int | None = Field(default=None, primary_key=True)
    task: str
    task_digest: str
    target: str
    jax_version: str
    params: dict[str, Any] | None = _json()
    speedup: float
    method: str  # measured | estimated
    band: list[float] | None = _json()
    session_id: str | None = None  # the search that found them
    candidate_id: int | None = None
    updated_at: float = Field(default_factory=now)
