"""The TPU runner daemon: registers itself, claims jobs it can serve, runs them, heartbeats its leases,
records results; on SIGTERM it stops claiming, lets running jobs finish (or gives them back) and deregisters.
A runner killed outright loses nothing: its leases expire and another runner takes the jobs over."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import traceback
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session

from storage import queue
from storage.logs import log_context
from storage.models import SessionEvent
from storage.runners import (
    DEAD_AFTER_SECONDS,
    chip_runners,
    dead_runners,
    deregister_runner,
    heartbeat_runner,
    mark_dead,
    register_runner,
)
from storage.sessions import set_session_status
from storage.settings import Settings
from tpu_runner.candidate import SparePool
from tpu_runner.hardware import get_chip
from tpu_runner.jobs import FollowUp, JobContext, JobHandler, JobRejected
from tpu_runner.runner.job_kinds import EVALUATION_KINDS, ON_CHIP_KINDS
from tpu_runner.sandbox import kill_running_children

log = logging.getLogger("kernelbot.runner")


@dataclass(frozen=True)
class RunnerConfig:
    name: str
    targets: tuple[str, ...]
    concurrency: int = 1
    kinds: tuple[str, ...] = ()  # empty: every registered kind
    lease_seconds: float = 60.0
    poll_seconds: float = 0.5
    grace_seconds: float = 30.0  # on SIGTERM, how long running jobs may take to finish before they are given back
    exit_when_idle: bool = False
    backoff_base: float = 2.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency={self.concurrency} must be at least 1")
        if self.lease_seconds < 1:
            raise ValueError(f"lease_seconds={self.lease_seconds} must be at least 1")

    @property
    def heartbeat_seconds(self) -> float:
        # Often enough that three missed beats (storage.runners.DEAD_AFTER_SECONDS) mean the runner is gone.
        return min(self.lease_seconds / 4, DEAD_AFTER_SECONDS / 3)


@dataclass
class _Held:
    lease: queue.Lease
    future: Future[None]
    lost: bool = False


@dataclass
class RunnerDaemon:
    engine: Engine
    settings: Settings
    config: RunnerConfig
    hardware: dict[str, Any] = field(default_factory=dict)
    # The kinds this process serves, composed where it starts (default: the evaluator's own).
    job_kinds: Mapping[str, JobHandler] = field(default_factory=lambda: dict(EVALUATION_KINDS))
    runner_id: str = ""
    stopping: threading.Event = field(default_factory=threading.Event)
    wake: threading.Event = field(default_factory=threading.Event)  # a job finished or a stop was asked for
    completed: int = 0
    abandoned: int = 0  # jobs given back while their threads still ran

    def chip_targets(self) -> list[str]:
        """The targets this runner checks and times on its host's own TPU."""
        return [t for t in self.config.targets if self.settings.on_chip(t)]

    def kinds(self) -> list[str]:
        """What it serves: the kinds asked for (default every kind it knows, those that need a chip only when it
        has one)."""
        if self.config.kinds:
            return list(self.config.kinds)
        return sorted(k for k in self.job_kinds if k not in ON_CHIP_KINDS or self.chip_targets())

    def routes(self) -> list[tuple[list[str], list[str]]]:
        """(kinds, targets) it claims: every kind for its targets, the on-chip kinds for its chip's target only."""
        general = [k for k in self.kinds() if k not in ON_CHIP_KINDS]
        on_chip = [k for k in self.kinds() if k in ON_CHIP_KINDS]
        routes = [(general, list(self.config.targets))] if general else []
        return routes + ([(on_chip, self.chip_targets())] if on_chip else [])

    def request_stop(self, *_: Any) -> None:
        if not self.stopping.is_set():
            log.info("runner %s: stopping - no new jobs; running ones may finish", self.runner_id)
        self.stopping.set()
        self.wake.set()

    def run(self) -> int:
        unknown = sorted(set(self.config.kinds) - set(self.job_kinds))
        if unknown:
            raise ValueError(f"unknown job kinds {unknown}; this runner serves: {sorted(self.job_kinds)}")
        chipless = sorted(set(self.config.kinds) & ON_CHIP_KINDS) if not self.chip_targets() else []
        if chipless:
            raise ValueError(f"{chipless} need a TPU of one of this runner's targets {list(self.config.targets)} on "
                             "its own host, and this host has none")
        with Session(self.engine) as s, s.begin():
            runner = register_runner(s, name=self.config.name, host=socket.gethostname(), pid=os.getpid(),
                                     hardware=self.hardware, targets=list(self.config.targets), kinds=self.kinds(),
                                     concurrency=self.config.concurrency)
            self.runner_id = runner.id
        log.info("runner %s (%s) serving %s for %s", self.runner_id, self.config.name, self.kinds(),
                 list(self.config.targets))
        spares = SparePool(root=self.settings.sandbox_dir, limits=self.settings.limits,
                           keep=min(self.config.concurrency, 1))
        held: dict[int, _Held] = {}
        pool = ThreadPoolExecutor(max_workers=self.config.concurrency, thread_name_prefix="job")
        last_beat = 0.0
        try:
            while True:
                for job_id in [j for j, h in held.items() if h.future.done()]:
                    del held[job_id]
                if time.monotonic() - last_beat >= self.config.heartbeat_seconds:
                    self._heartbeat(held)
                    last_beat = time.monotonic()
                if self.stopping.is_set():
                    break
                claimed = self._claim(held, pool, spares)
                if not claimed and not held and self.config.exit_when_idle and not self._work_may_come():
                    log.info("runner %s: idle, exiting (%d jobs done)", self.runner_id, self.completed)
                    break
                if not claimed:
                    self.wake.wait(self.config.poll_seconds)
                    self.wake.clear()
            self._drain(held)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            spares.close()
            with Session(self.engine) as s, s.begin():
                deregister_runner(s, runner_id=self.runner_id)
        return 0

    def _work_may_come(self) -> bool:
        with Session(self.engine) as s:
            return any(queue.runnable_later(s, kinds=kinds, targets=targets) for kinds, targets in self.routes())

    def _claim(self, held: dict[int, _Held], pool: ThreadPoolExecutor, spares: SparePool) -> int:
        free = self.config.concurrency - len(held)
        if free <= 0:
            return 0
        leases: list[queue.Lease] = []
        with Session(self.engine) as s, s.begin():
            for kinds, targets in self.routes():
                if len(leases) < free:
                    leases += queue.claim(s, runner_id=self.runner_id, kinds=kinds, targets=targets,
                                          lease_seconds=self.config.lease_seconds, limit=free - len(leases))
        for lease in leases:
            log.info("runner %s: job %d (%s) attempt %d", self.runner_id, lease.job_id, lease.kind, lease.attempts)
            held[lease.job_id] = _Held(lease, pool.submit(self._run_job, lease, spares))
        return len(leases)

    def _heartbeat(self, held: dict[int, _Held]) -> None:
        with Session(self.engine) as s, s.begin():
            for h in held.values():
                if h.lost:
                    continue
                if not queue.heartbeat(s, job_id=h.lease.job_id, fence=h.lease.fence,
                                       lease_seconds=self.config.lease_seconds):
                    h.lost = True
                    log.warning("runner %s: lost the lease on job %d (expired, cancelled or taken over); its "
                                "result will be discarded", self.runner_id, h.lease.job_id)
            status = "stopping" if self.stopping.is_set() else "active"
            heartbeat_runner(s, runner_id=self.runner_id, current_jobs=sorted(held), status=status)
            self._reap(s)

    def _reap(self, s: Session) -> None:
        """Runners that are gone (silent, or their process ended on this host): marked dead, their jobs returned
        to the queue now rather than when their claims run out."""
        for runner in dead_runners(s, host=socket.gethostname()):
            if runner.id == self.runner_id:
                continue
            silent = time.time() - runner.heartbeat_at
            why = (f"runner {runner.name} stopped answering (pid {runner.pid} on {runner.host}, last heard "
                   f"{silent:.0f} s before); its unfinished attempt's files, if any, are in artifacts/job<id>-*")
            returned = queue.return_jobs_of(s, runner_id=runner.id, why=why)
            mark_dead(s, runner)
            log.warning("runner %s: runner %s is gone (%s); returned its jobs %s to the queue", self.runner_id,
                        runner.name, why, returned)

    def _run_job(self, lease: queue.Lease, spares: SparePool) -> None:
        try:
            with log_context(job=lease.job_id, kind=lease.kind, session=lease.session_id):
                self._run_handler(lease, spares)
        finally:
            self.wake.set()  # a slot is free: claim the next job now rather than at the next poll

    def _run_handler(self, lease: queue.Lease, spares: SparePool) -> None:
        handler = self.job_kinds[lease.kind]
        ctx = JobContext(settings=self.settings, runner_id=self.runner_id, job_id=lease.job_id, spares=spares,
                         engine=self.engine)
        try:
            outcome = handler(ctx, lease.payload)
        except JobRejected as exc:
            self._record_failure(lease, str(exc), retry=False)
            return
        except Exception as exc:
            log.exception("runner %s: job %d raised", self.runner_id, lease.job_id)
            detail = "".join(traceback.format_exception_only(exc)).strip()
            self._record_failure(lease, detail, retry=True)
            return
        with Session(self.engine) as s, s.begin():
            follows, result = self._routed(s, outcome.then, outcome.result)
            recorded = queue.complete(s, job_id=lease.job_id, fence=lease.fence, result=result,
                                      evaluations=outcome.evaluations)
            if recorded:
                for follow in follows:
                    queue.enqueue(s, kind=follow.kind, payload=follow.payload, target=follow.target,
                                  dedup_key=follow.dedup_key, session_id=follow.session_id)
            if recorded and lease.session_id:
                s.add(SessionEvent(session_id=lease.session_id, kind="job_done", payload={
                    "job_id": lease.job_id, "kind": lease.kind, "result": outcome.result,
                    "evaluation_ids": [e.id for e in outcome.evaluations]}))
        if recorded:
            self.completed += 1
        else:
            log.warning("runner %s: job %d finished after its lease was lost; result discarded", self.runner_id,
                        lease.job_id)

    @staticmethod
    def _routed(s: Session, then: list[FollowUp], result: dict[str, Any]) -> tuple[list[FollowUp], dict[str, Any]]:
        """The follow-ups to queue, and the result saying where each one that needs a chip went (or that none of
        the fleet's runners has that chip)."""
        queued, said = [], []
        for follow in then:
            if not follow.needs_chip:
                queued.append(follow)
                continue
            runners = chip_runners(s, target=follow.target or "", kind=follow.kind)
            if runners:
                queued.append(follow)
                said.append(f"{follow.kind} queued for the TPU {follow.target} runners "
                            f"({', '.join(r.name for r in runners)})")
            else:
                said.append(f"{follow.kind} not queued: no active runner of the fleet is on a TPU {follow.target}")
        return queued, ({**result, "follow_ups": said} if said else result)

    def _record_failure(self, lease: queue.Lease, reason: str, *, retry: bool) -> None:
        with Session(self.engine) as s, s.begin():
            status = queue.fail(s, job_id=lease.job_id, fence=lease.fence, reason=reason, retry=retry,
                                backoff_base=self.config.backoff_base)
            if status == "failed" and lease.session_id:
                s.add(SessionEvent(session_id=lease.session_id, kind="job_failed", payload={
                    "job_id": lease.job_id, "kind": lease.kind, "reason": reason}))
                if lease.payload.get("fails_session"):
                    set_session_status(s, session_id=lease.session_id, status="failed")
        log.warning("runner %s: job %d failed (%s): %s", self.runner_id, lease.job_id, status or "lease lost", reason)

    def _drain(self, held: dict[int, _Held]) -> None:
        """Let running jobs finish within the grace period (still heartbeating), then give the rest back."""
        deadline = time.monotonic() + self.config.grace_seconds
        while any(not h.future.done() for h in held.values()) and time.monotonic() < deadline:
            self._heartbeat({j: h for j, h in held.items() if not h.future.done()})
            time.sleep(min(self.config.poll_seconds, self.config.heartbeat_seconds))
        unfinished = [h for h in held.values() if not h.future.done()]
        if not unfinished:
            return
        with Session(self.engine) as s, s.begin():
            for h in unfinished:
                queue.release(s, job_id=h.lease.job_id, fence=h.lease.fence)
        self.abandoned = len(unfinished)
        killed = kill_running_children()
        log.info("runner %s: gave back %d unfinished jobs (stopped %d evaluations)", self.runner_id, len(unfinished),
                 killed)


def describe_host(settings: Settings) -> dict[str, Any]:
    """The host, from its TPU runtime's variables and device files, without opening the chip: it has one holder
    at a time, and the runner's sandboxed children are the ones that run on it."""
    chip = get_chip(settings.host_target) if settings.host_target else None
    described: dict[str, Any] = {"platform": "tpu" if chip else "cpu", "cpus": os.cpu_count(),
                                 "host": socket.gethostname()}
    if chip is not None:
        described.update(tpu=chip.name, device_kind=chip.device_kind, measures=settings.on_chip(chip.name))
    return described


def install_signal_handlers(daemon: RunnerDaemon) -> None:
    signal.signal(signal.SIGTERM, daemon.request_stop)
    signal.signal(signal.SIGINT, daemon.request_stop)
