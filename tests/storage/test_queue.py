"""The job queue and the runner registry, on SQLite and on PostgreSQL: claiming, fencing, leases, retries,
cancellation, and several claimers at once.

Time moves forward by editing `lease_expires_at` / `run_after` in the database, never by sleeping.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import Engine, func, update
from sqlmodel import Session, col, select

from storage import queue
from storage.models import Evaluation, Job, Runner
from storage.runners import deregister_runner, get_runners, heartbeat_runner, register_runner

KIND = "evaluate"
LEASE = 60.0


# --- helpers: one transaction each, as the product code does ------------------------------------------------------


def _enqueue(engine: Engine, **kwargs: Any) -> int:
    kwargs.setdefault("kind", KIND)
    with Session(engine) as s, s.begin():
        job_id = queue.enqueue(s, **kwargs).id
    assert job_id is not None
    return job_id


def _claim(engine: Engine, *, runner_id: str = "r1", kinds: tuple[str, ...] = (KIND,),
           targets: tuple[str, ...] = ("v6e",), lease_seconds: float = LEASE, limit: int = 1) -> list[queue.Lease]:
    with Session(engine) as s, s.begin():
        return queue.claim(s, runner_id=runner_id, kinds=kinds, targets=targets, lease_seconds=lease_seconds,
                           limit=limit)


def _claim_one(engine: Engine, **kwargs: Any) -> queue.Lease:
    leases = _claim(engine, **kwargs)
    assert len(leases) == 1, leases
    return leases[0]


def _job(engine: Engine, job_id: int) -> Job:
    with Session(engine, expire_on_commit=False) as s, s.begin():
        job = s.get(Job, job_id)
    assert job is not None
    return job


def _set(engine: Engine, job_id: int, **values: Any) -> None:
    with Session(engine) as s, s.begin():
        s.execute(update(Job).where(col(Job.id) == job_id).values(**values))


def _expire_lease(engine: Engine, job_id: int) -> None:
    _set(engine, job_id, lease_expires_at=time.time() - 10)


def _complete(engine: Engine, lease: queue.Lease, *, result: dict[str, Any] | None = None,
              evaluations: list[Evaluation] | None = None) -> bool:
    with Session(engine) as s, s.begin():
        return queue.complete(s, job_id=lease.job_id, fence=lease.fence, result=result,
                              evaluations=evaluations or [])


def _heartbeat(engine: Engine, job_id: int, fence: int, lease_seconds: float = LEASE) -> bool:
    with Session(engine) as s, s.begin():
        return queue.heartbeat(s, job_id=job_id, fence=fence, lease_seconds=lease_seconds)


def _fail(engine: Engine, lease: queue.Lease, reason: str, **kwargs: Any) -> str | None:
    with Session(engine) as s, s.begin():
        return queue.fail(s, job_id=lease.job_id, fence=lease.fence, reason=reason, **kwargs)


def _evaluation(verdict: str = "ok") -> Evaluation:
    return Evaluation(task="matmul", target="v6e", verdict=verdict, stage="timing", speedup=1.5)


def _evaluations_of(engine: Engine, job_id: int) -> list[Evaluation]:
    with Session(engine, expire_on_commit=False) as s, s.begin():
        return list(s.exec(select(Evaluation).where(Evaluation.job_id == job_id)).all())


# --- enqueue ------------------------------------------------------------------------------------------------------


def test_enqueue_returns_a_queued_job(engine: Engine) -> None:
    with Session(engine) as s, s.begin():
        job = queue.enqueue(s, kind=KIND, payload={"task": "matmul"}, priority=3, target="v5e", max_attempts=5,
                            session_id="sess1")
        assert job.id is not None
        job_id = job.id
    stored = _job(engine, job_id)
    assert (stored.status, stored.kind, stored.priority, stored.target) == ("queued", KIND, 3, "v5e")
    assert (stored.attempts, stored.fence, stored.max_attempts) == (0, 0, 5)
    assert stored.payload == {"task": "matmul"}
    assert stored.session_id == "sess1"
    assert stored.runner_id is None and stored.lease_expires_at is None


def test_dedup_key_returns_the_live_job_until_it_is_done(engine: Engine) -> None:
    first = _enqueue(engine, dedup_key="matmul@v6e")
    assert _enqueue(engine, dedup_key="matmul@v6e") == first  # queued
    assert _enqueue(engine, dedup_key="other") != first  # another key is another job
    lease = _claim_one(engine)
    assert lease.job_id == first
    assert _enqueue(engine, dedup_key="matmul@v6e") == first  # running
    assert _complete(engine, lease)
    second = _enqueue(engine, dedup_key="matmul@v6e")  # done: a new job
    assert second != first
    assert _job(engine, second).status == "queued"
    assert _job(engine, first).status == "done"


# --- claim --------------------------------------------------------------------------------------------------------


def test_claim_takes_higher_priority_first_then_oldest(engine: Engine) -> None:
    low_old = _enqueue(engine, priority=0)
    high_old = _enqueue(engine, priority=5)
    high_new = _enqueue(engine, priority=5)
    low_new = _enqueue(engine, priority=0)
    urgent = _enqueue(engine, priority=9)
    order = [_claim_one(engine).job_id for _ in range(5)]
    assert order == [urgent, high_old, high_new, low_old, low_new]
    assert _claim(engine) == []


def test_claim_with_a_limit_returns_the_same_order(engine: Engine) -> None:
    a = _enqueue(engine, priority=1)
    b = _enqueue(engine, priority=2)
    c = _enqueue(engine, priority=1)
    assert [lease.job_id for lease in _claim(engine, limit=10)] == [b, a, c]


def test_claim_only_takes_the_kinds_served(engine: Engine) -> None:
    other = _enqueue(engine, kind="profile", priority=9)
    mine = _enqueue(engine, kind=KIND)
    leases = _claim(engine, kinds=(KIND,), limit=10)
    assert [lease.job_id for lease in leases] == [mine]
    assert leases[0].kind == KIND
    assert _job(engine, other).status == "queued"
    assert [lease.job_id for lease in _claim(engine, kinds=("profile",), limit=10)] == [other]


def test_claim_only_takes_the_targets_served(engine: Engine) -> None:
    v5e = _enqueue(engine, target="v5e")
    anywhere = _enqueue(engine, target=None)
    v6e = _enqueue(engine, target="v6e")
    leases = _claim(engine, targets=("v6e",), limit=10)
    assert sorted(lease.job_id for lease in leases) == [anywhere, v6e]
    assert _job(engine, v5e).status == "queued"
    assert [lease.job_id for lease in _claim(engine, runner_id="r2", targets=("v5e",), limit=10)] == [v5e]


def test_a_job_without_target_is_claimed_by_any_runner(engine: Engine) -> None:
    job_id = _enqueue(engine, target=None)
    assert _claim_one(engine, targets=("v4",)).job_id == job_id


def test_claim_respects_limit(engine: Engine) -> None:
    ids = [_enqueue(engine) for _ in range(5)]
    first = _claim(engine, limit=2)
    assert [lease.job_id for lease in first] == ids[:2]
    rest = _claim(engine, limit=10)
    assert [lease.job_id for lease in rest] == ids[2:]
    assert _claim(engine, limit=10) == []


def test_claim_carries_the_payload(engine: Engine) -> None:
    _enqueue(engine, payload={"task": "matmul", "sizes": [128, 256]})
    lease = _claim_one(engine)
    assert lease.payload == {"task": "matmul", "sizes": [128, 256]}


def test_each_claim_raises_the_fence_and_counts_an_attempt(engine: Engine) -> None:
    job_id = _enqueue(engine)
    before = time.time()
    first = _claim_one(engine, runner_id="r1", lease_seconds=100)
    assert (first.fence, first.attempts) == (1, 1)
    job = _job(engine, job_id)
    assert (job.status, job.runner_id, job.fence, job.attempts) == ("running", "r1", 1, 1)
    assert job.lease_expires_at is not None and before + 100 <= job.lease_expires_at <= time.time() + 100
    assert first.expires_at == pytest.approx(job.lease_expires_at)

    _expire_lease(engine, job_id)
    second = _claim_one(engine, runner_id="r2")
    assert (second.job_id, second.fence, second.attempts) == (job_id, 2, 2)
    job = _job(engine, job_id)
    assert (job.runner_id, job.fence, job.attempts) == ("r2", 2, 2)


def test_a_running_job_with_a_live_lease_is_not_claimed_again(engine: Engine) -> None:
    _enqueue(engine)
    _claim_one(engine, runner_id="r1")
    assert _claim(engine, runner_id="r2", limit=10) == []


# --- heartbeat ----------------------------------------------------------------------------------------------------


def test_heartbeat_with_the_current_fence_extends_the_lease(engine: Engine) -> None:
    job_id = _enqueue(engine)
    lease = _claim_one(engine, lease_seconds=5)
    before = _job(engine, job_id).lease_expires_at
    assert before is not None
    assert _heartbeat(engine, job_id, lease.fence, lease_seconds=600) is True
    after = _job(engine, job_id).lease_expires_at
    assert after is not None and after >= before + 590


def test_heartbeat_with_an_old_fence_is_refused(engine: Engine) -> None:
    job_id = _enqueue(engine)
    old = _claim_one(engine, runner_id="r1")
    _expire_lease(engine, job_id)
    new = _claim_one(engine, runner_id="r2", lease_seconds=30)
    lease_before = _job(engine, job_id).lease_expires_at
    assert _heartbeat(engine, job_id, old.fence, lease_seconds=3600) is False
    assert _job(engine, job_id).lease_expires_at == pytest.approx(lease_before)
    assert _heartbeat(engine, job_id, new.fence) is True


# --- complete -----------------------------------------------------------------------------------------------------


def test_complete_records_the_result_and_evaluations_exactly_once(engine: Engine) -> None:
    job_id = _enqueue(engine)
    lease = _claim_one(engine)
    assert _complete(engine, lease, result={"verdict": "ok"}, evaluations=[_evaluation()]) is True
    job = _job(engine, job_id)
    assert (job.status, job.result, job.lease_expires_at) == ("done", {"verdict": "ok"}, None)
    assert job.finished_at is not None
    evaluations = _evaluations_of(engine, job_id)
    assert [(e.job_id, e.verdict, e.speedup) for e in evaluations] == [(job_id, "ok", 1.5)]

    assert _complete(engine, lease, result={"verdict": "again"}, evaluations=[_evaluation("again")]) is False
    assert _job(engine, job_id).result == {"verdict": "ok"}
    assert len(_evaluations_of(engine, job_id)) == 1


def test_complete_without_result_stores_an_empty_result(engine: Engine) -> None:
    job_id = _enqueue(engine)
    assert _complete(engine, _claim_one(engine)) is True
    assert _job(engine, job_id).result == {}
    assert _evaluations_of(engine, job_id) == []


def test_an_expired_lease_is_taken_over_and_the_late_result_discarded(engine: Engine) -> None:
    job_id = _enqueue(engine)
    first = _claim_one(engine, runner_id="r1", lease_seconds=0.5)
    assert _claim(engine, runner_id="r2") == []  # still held
    _expire_lease(engine, job_id)
    second = _claim_one(engine, runner_id="r2")
    assert second.job_id == job_id and second.fence > first.fence

    assert _complete(engine, first, result={"by": "r1"}, evaluations=[_evaluation("late")]) is False
    assert _evaluations_of(engine, job_id) == []
    assert _job(engine, job_id).status == "running"

    assert _complete(engine, second, result={"by": "r2"}, evaluations=[_evaluation("ok")]) is True
    evaluations = _evaluations_of(engine, job_id)
    assert [e.verdict for e in evaluations] == ["ok"]
    job = _job(engine, job_id)
    assert (job.status, job.result, job.runner_id) == ("done", {"by": "r2"}, "r2")


# --- fail ---------------------------------------------------------------------------------------------------------


def test_fail_with_retry_backs_off_then_fails_after_max_attempts(engine: Engine) -> None:
    job_id = _enqueue(engine, max_attempts=3)
    reasons = ["compile error 1", "compile error 2", "compile error 3"]
    for attempt, reason in enumerate(reasons, start=1):
        lease = _claim_one(engine)
        assert lease.attempts == attempt
        before = time.time()
        status = _fail(engine, lease, reason, backoff_base=10.0)
        job = _job(engine, job_id)
        if attempt < 3:
            assert status == "queued"
            assert job.status == "queued" and job.last_error == reason
            assert job.lease_expires_at is None
            assert job.run_after >= before + 10.0 * 2 ** (attempt - 1)  # backoff doubles
            assert _claim(engine, limit=10) == []  # backing off
            _set(engine, job_id, run_after=time.time() - 1)
        else:
            assert status == "failed"
            assert job.status == "failed" and job.finished_at is not None
    job = _job(engine, job_id)
    assert job.attempts == 3
    assert job.last_error is not None
    assert "all 3 attempts" in job.last_error and "compile error 3" in job.last_error
    assert _claim(engine, limit=10) == []


def test_backoff_grows_and_is_capped() -> None:
    assert [queue.backoff_seconds(n, 2.0) for n in (1, 2, 3, 4)] == [2.0, 4.0, 8.0, 16.0]
    assert queue.backoff_seconds(30, 2.0) == queue.MAX_BACKOFF_SECONDS


def test_fail_without_retry_fails_at_once(engine: Engine) -> None:
    job_id = _enqueue(engine, max_attempts=5)
    lease = _claim_one(engine)
    assert _fail(engine, lease, "the kernel is not valid Pallas", retry=False) == "failed"
    job = _job(engine, job_id)
    assert (job.status, job.attempts, job.last_error) == ("failed", 1, "the kernel is not valid Pallas")
    assert job.finished_at is not None
    assert _claim(engine, limit=10) == []


def test_fail_with_a_stale_fence_records_nothing(engine: Engine) -> None:
    job_id = _enqueue(engine)
    old = _claim_one(engine, runner_id="r1")
    _expire_lease(engine, job_id)
    _claim_one(engine, runner_id="r2")
    assert _fail(engine, old, "late failure", retry=False) is None
    job = _job(engine, job_id)
    assert (job.status, job.runner_id, job.last_error) == ("running", "r2", None)


def test_an_expired_job_that_used_all_attempts_is_failed_by_the_next_claim(engine: Engine) -> None:
    job_id = _enqueue(engine, max_attempts=2)
    for _ in range(2):
        _claim_one(engine, runner_id="r-lost")
        _expire_lease(engine, job_id)
    assert _claim(engine, runner_id="r2", limit=10) == []
    job = _job(engine, job_id)
    assert (job.status, job.attempts) == ("failed", 2)
    assert job.finished_at is not None and job.lease_expires_at is None
    assert job.last_error is not None
    assert "stopped answering" in job.last_error and "r-lost" in job.last_error


# --- release and cancel -------------------------------------------------------------------------------------------


def test_release_requeues_without_counting_the_attempt(engine: Engine) -> None:
    job_id = _enqueue(engine)
    lease = _claim_one(engine, runner_id="r1")
    with Session(engine) as s, s.begin():
        assert queue.release(s, job_id=job_id, fence=lease.fence) is True
    job = _job(engine, job_id)
    assert (job.status, job.attempts, job.runner_id, job.lease_expires_at) == ("queued", 0, None, None)
    assert _complete(engine, lease, evaluations=[_evaluation()]) is False
    assert _evaluations_of(engine, job_id) == []
    again = _claim_one(engine, runner_id="r2")
    assert (again.job_id, again.attempts) == (job_id, 1)
    assert again.fence > lease.fence


def test_release_with_a_stale_fence_is_refused(engine: Engine) -> None:
    job_id = _enqueue(engine)
    old = _claim_one(engine, runner_id="r1")
    _expire_lease(engine, job_id)
    _claim_one(engine, runner_id="r2")
    with Session(engine) as s, s.begin():
        assert queue.release(s, job_id=job_id, fence=old.fence) is False
    assert _job(engine, job_id).status == "running"


def _cancel(engine: Engine, job_id: int) -> bool:
    with Session(engine) as s, s.begin():
        return queue.cancel(s, job_id=job_id)


def test_cancel_a_queued_job(engine: Engine) -> None:
    job_id = _enqueue(engine)
    assert _cancel(engine, job_id) is True
    job = _job(engine, job_id)
    assert job.status == "cancelled" and job.finished_at is not None
    assert _claim(engine, limit=10) == []


def test_cancel_a_running_job_the_holder_finds_out_at_its_heartbeat(engine: Engine) -> None:
    job_id = _enqueue(engine)
    lease = _claim_one(engine)
    assert _cancel(engine, job_id) is True
    assert _job(engine, job_id).status == "cancelled"
    assert _heartbeat(engine, job_id, lease.fence) is False
    assert _complete(engine, lease, evaluations=[_evaluation()]) is False
    assert _job(engine, job_id).status == "cancelled"
    assert _evaluations_of(engine, job_id) == []


def test_cancel_a_finished_job_is_refused(engine: Engine) -> None:
    job_id = _enqueue(engine)
    assert _complete(engine, _claim_one(engine))
    assert _cancel(engine, job_id) is False
    assert _job(engine, job_id).status == "done"


def test_cancel_an_unknown_job_raises(engine: Engine) -> None:
    with pytest.raises(queue.JobNotFound, match="424242"), Session(engine) as s, s.begin():
        queue.cancel(s, job_id=424242)


def test_cancel_racing_a_completion_does_not_overwrite_it(engine: Engine) -> None:
    """A completion racing a cancel must not both succeed: the cancel's conditional update holds the row (and on
    SQLite the database) until it commits, so the completion that follows is refused."""
    job_id = _enqueue(engine)
    lease = _claim_one(engine)
    completed: list[bool] = []
    with Session(engine) as s, s.begin():
        cancelled = queue.cancel(s, job_id=job_id)  # reads 'running'; flushed at commit
        holder = threading.Thread(target=lambda: completed.append(
            _complete(engine, lease, result={"verdict": "ok"}, evaluations=[_evaluation()])))
        holder.start()
        holder.join(timeout=1.0)  # PostgreSQL: commits now; SQLite: waits for our lock
    holder.join(timeout=30)
    assert completed, "the completion never finished"
    status = _job(engine, job_id).status
    evaluations = _evaluations_of(engine, job_id)
    assert cancelled is True
    assert completed == [False], f"both cancel and complete succeeded; the job ended {status!r}"
    assert status == "cancelled" and evaluations == []


# --- enqueue racing -----------------------------------------------------------------------------------------------


def test_concurrent_enqueues_with_one_dedup_key_give_one_job(engine: Engine) -> None:
    """Two enqueues of the same key at once: the second must return the first's job, not fail."""
    results: list[int] = []
    errors: list[BaseException] = []

    def second() -> None:
        try:
            results.append(_enqueue(engine, dedup_key="same"))
        except Exception as exc:  # reported by the assertion below
            errors.append(exc)

    with Session(engine) as s, s.begin():
        first = queue.enqueue(s, kind=KIND, dedup_key="same").id
        other = threading.Thread(target=second)
        other.start()
        other.join(timeout=1.0)  # both: blocked (PostgreSQL on the unique index, SQLite on the lock)
    other.join(timeout=30)
    assert errors == [], f"the second enqueue failed: {errors[0]!r}" if errors else ""
    assert results == [first]
    with Session(engine) as s, s.begin():
        assert s.exec(select(func.count()).select_from(Job)).one() == 1


# --- reads --------------------------------------------------------------------------------------------------------


def test_runnable_later_counts_queued_and_running_jobs_of_the_kinds_and_targets(engine: Engine) -> None:
    def count(kinds: tuple[str, ...] = (KIND,), targets: tuple[str, ...] = ("v6e",)) -> int:
        with Session(engine) as s, s.begin():
            return queue.runnable_later(s, kinds=kinds, targets=targets)

    assert count() == 0
    _enqueue(engine)  # queued, any target
    running = _enqueue(engine, target="v6e", priority=10)
    backing_off = _enqueue(engine, target="v6e")
    _enqueue(engine, target="v5e")
    _enqueue(engine, kind="profile")
    finished = _enqueue(engine, priority=20)
    cancelled = _enqueue(engine)
    assert _complete(engine, _claim_one(engine))  # takes `finished` (priority 20)
    assert _claim_one(engine).job_id == running
    _set(engine, backing_off, run_after=time.time() + 3600)
    assert _cancel(engine, cancelled)
    assert _job(engine, finished).status == "done"

    assert count() == 3  # queued untargeted, running v6e, backing-off v6e
    assert count(targets=("v5e",)) == 2  # queued untargeted, queued v5e
    assert count(kinds=("profile",)) == 1
    assert count(kinds=(KIND, "profile"), targets=("v6e", "v5e")) == 5
    assert count(kinds=("other",)) == 0


def test_get_jobs_newest_first_and_by_status(engine: Engine) -> None:
    ids = [_enqueue(engine) for _ in range(4)]
    assert _complete(engine, _claim_one(engine))  # ids[0] done
    _claim_one(engine)  # ids[1] running
    with Session(engine) as s, s.begin():
        assert [j.id for j in queue.get_jobs(s)] == ids[::-1]
        assert [j.id for j in queue.get_jobs(s, limit=2)] == [ids[3], ids[2]]
        assert [j.id for j in queue.get_jobs(s, status="queued")] == [ids[3], ids[2]]
        assert [j.id for j in queue.get_jobs(s, status="running")] == [ids[1]]
        assert [j.id for j in queue.get_jobs(s, status="done")] == [ids[0]]
        assert queue.get_jobs(s, status="failed") == []


def test_evaluation_ids_maps_jobs_to_their_evaluations(engine: Engine) -> None:
    with_eval = _enqueue(engine)
    without_eval = _enqueue(engine)
    assert _complete(engine, _claim_one(engine), evaluations=[_evaluation()])
    assert _complete(engine, _claim_one(engine))
    [evaluation] = _evaluations_of(engine, with_eval)
    with Session(engine) as s, s.begin():
        mapping = queue.evaluation_ids(s, job_ids=[with_eval, without_eval, 999])
        assert mapping == {with_eval: [evaluation.id], without_eval: [], 999: []}
        assert queue.evaluation_ids(s, job_ids=[]) == {}


# --- several claimers at once -------------------------------------------------------------------------------------


def test_concurrent_claimers_take_every_job_exactly_once(engine: Engine) -> None:
    """SQLite: BEGIN IMMEDIATE and the busy timeout queue the claimers; PostgreSQL: FOR UPDATE SKIP LOCKED."""
    jobs, threads = 200, 4
    with Session(engine) as s, s.begin():
        ids = {queue.enqueue(s, kind=KIND, payload={"n": n}).id for n in range(jobs)}
    claimed: dict[str, list[int]] = {f"r{i}": [] for i in range(threads)}
    refused: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def work(runner_id: str) -> None:
        try:
            start.wait()
            while True:
                leases = _claim(engine, runner_id=runner_id, limit=1)
                if not leases:
                    return
                claimed[runner_id].append(leases[0].job_id)
                if not _complete(engine, leases[0], result={"by": runner_id}):
                    refused.append(leases[0].job_id)
        except BaseException as exc:  # reported below
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(r,)) for r in claimed]
    began = time.monotonic()
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    assert not any(w.is_alive() for w in workers), "claimers still running after 60 s"
    assert errors == []
    assert refused == []
    everything = [job_id for taken in claimed.values() for job_id in taken]
    duplicates = [job_id for job_id, n in Counter(everything).items() if n > 1]
    assert duplicates == [], f"claimed by two threads: {duplicates}"
    assert set(everything) == ids
    assert time.monotonic() - began < 30
    with Session(engine) as s, s.begin():
        rows = s.exec(select(Job.status, Job.attempts, Job.fence, Job.runner_id, Job.result)).all()
    assert len(rows) == jobs
    assert {(status, attempts, fence) for status, attempts, fence, _, _ in rows} == {("done", 1, 1)}
    assert all(result == {"by": runner_id} for _, _, _, runner_id, result in rows)


# --- runners ------------------------------------------------------------------------------------------------------


def _register(engine: Engine, name: str) -> str:
    with Session(engine) as s, s.begin():
        return register_runner(s, name=name, host="tpu-host-1", pid=4242, hardware={"chip": "v6e", "count": 4},
                               targets=["v6e"], kinds=[KIND], concurrency=2).id


def _runner(engine: Engine, runner_id: str) -> Runner:
    with Session(engine, expire_on_commit=False) as s, s.begin():
        runner = s.get(Runner, runner_id)
    assert runner is not None
    return runner


def test_register_runner(engine: Engine) -> None:
    runner_id = _register(engine, "r-a")
    runner = _runner(engine, runner_id)
    assert (runner.name, runner.host, runner.pid, runner.status) == ("r-a", "tpu-host-1", 4242, "active")
    assert (runner.targets, runner.kinds, runner.concurrency) == (["v6e"], [KIND], 2)
    assert runner.hardware == {"chip": "v6e", "count": 4}
    assert runner.current_jobs == []
    assert runner_id != _register(engine, "r-b")


def test_heartbeat_runner_records_current_jobs_and_time(engine: Engine) -> None:
    runner_id = _register(engine, "r-a")
    registered = _runner(engine, runner_id).heartbeat_at
    time.sleep(0.02)
    with Session(engine) as s, s.begin():
        heartbeat_runner(s, runner_id=runner_id, current_jobs=[3, 5])
    runner = _runner(engine, runner_id)
    assert runner.current_jobs == [3, 5]
    assert runner.heartbeat_at > registered
    assert runner.status == "active"
    with Session(engine) as s, s.begin():
        heartbeat_runner(s, runner_id=runner_id, current_jobs=[], status="stopping")
    runner = _runner(engine, runner_id)
    assert (runner.current_jobs, runner.status) == ([], "stopping")


def test_heartbeat_of_an_unknown_runner_does_nothing(engine: Engine) -> None:
    with Session(engine) as s, s.begin():
        heartbeat_runner(s, runner_id="nobody", current_jobs=[1])
        assert get_runners(s, include_stopped=True) == []


def test_deregister_runner_stops_it_and_hides_it(engine: Engine) -> None:
    stays = _register(engine, "r-a")
    goes = _register(engine, "r-b")
    with Session(engine) as s, s.begin():
        heartbeat_runner(s, runner_id=goes, current_jobs=[7])
    with Session(engine) as s, s.begin():
        deregister_runner(s, runner_id=goes)
    runner = _runner(engine, goes)
    assert (runner.status, runner.current_jobs) == ("stopped", [])
    with Session(engine) as s, s.begin():
        assert [r.id for r in get_runners(s)] == [stays]
        assert {r.id for r in get_runners(s, include_stopped=True)} == {stays, goes}


def test_an_exhausted_job_does_not_take_the_place_of_a_ready_one(engine: Engine) -> None:
    dead = _enqueue(engine, max_attempts=1, priority=5)
    _claim_one(engine)
    _expire_lease(engine, dead)
    ready = _enqueue(engine)
    leases = _claim(engine, runner_id="r2", limit=1)
    assert [lease.job_id for lease in leases] == [ready]
    assert _job(engine, dead).status == "failed"
