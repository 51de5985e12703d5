"""The runner fleet as it runs in production: real `kernelbot runner` processes sharing one queue, on SQLite and
on PostgreSQL, some of them killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, func
from sqlmodel import Session, col, select

from storage import queue
from storage.engine import make_engine
from storage.migrate import upgrade
from storage.models import Evaluation, Job, Runner
from tests.conftest import REPO
from tests.storage.conftest import fresh_database_url

LEASE_SECONDS = 2.0


@pytest.fixture(params=["sqlite", "postgresql"])
def fleet_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    for url in fresh_database_url(request.param, tmp_path):
        engine = make_engine(url)
        upgrade(engine)
        engine.dispose()
        yield url


def _env(url: str, home: Path) -> dict[str, str]:
    return {**os.environ, "KERNELBOT_HOME": str(home), "KERNELBOT_DATABASE_URL": url, "JAX_PLATFORMS": "cpu",
            "KERNELBOT_JOB_MODULES": "tests.support.job_kinds", "PYTHONPATH": str(REPO)}


def _start_runner(url: str, home: Path, name: str, *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "bot.cli", "runner", "--exit-when-idle", "--name", name,
           "--lease-seconds", str(LEASE_SECONDS), *extra]
    return subprocess.Popen(cmd, cwd=REPO, env=_env(url, home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _enqueue(url: str, kind: str, count: int, **kwargs: object) -> list[int]:
    engine = make_engine(url)
    with Session(engine) as s, s.begin():
        ids = [queue.enqueue(s, kind=kind, **kwargs).id for _ in range(count)]  # type: ignore[arg-type]
    engine.dispose()
    return [i for i in ids if i is not None]


def _wait_until_running(engine: Engine, job_id: int, *, seconds: float) -> None:
    """Until a runner holds the job (or `seconds` pass)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with Session(engine) as s:
            job = s.get(Job, job_id)
            if job is not None and job.status == "running":
                return
        time.sleep(0.05)


def _wait_all(procs: list[subprocess.Popen[str]], timeout: float = 240) -> list[str]:
    outputs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=timeout)
        outputs.append(out)
    return outputs


@pytest.mark.slow
def test_sigkilled_runner_loses_nothing(fleet_db: str, tmp_path: Path) -> None:
    ids = _enqueue(fleet_db, "fake_evaluate", 200, payload={"seconds": 0.03})
    runners = [_start_runner(fleet_db, tmp_path, f"r{i}") for i in range(3)]
    engine = make_engine(fleet_db)
    victim_job = None
    deadline = time.monotonic() + 120
    while victim_job is None and time.monotonic() < deadline:  # kill r0 while it holds a job
        with Session(engine) as s:
            row = s.exec(select(Job.id).join(Runner, col(Runner.id) == Job.runner_id)
                         .where(Runner.name == "r0", Job.status == "running")).first()
        if row is not None:
            os.kill(runners[0].pid, signal.SIGKILL)
            victim_job = row
        else:
            time.sleep(0.01)
    assert victim_job is not None, "r0 never held a job"
    _wait_all(runners[1:])
    runners[0].wait()
    assert runners[0].returncode == -signal.SIGKILL
    with Session(engine) as s:
        jobs = s.exec(select(Job).where(col(Job.id).in_(ids))).all()
        assert {j.status for j in jobs} == {"done"}
        per_job = dict(s.exec(select(Evaluation.job_id, func.count()).group_by(Evaluation.job_id)).all())
        assert len(per_job) == 200 and set(per_job.values()) == {1}  # exactly once, none lost
        victim = s.get(Job, victim_job)
        assert victim is not None and victim.status == "done"
    engine.dispose()


@pytest.mark.slow
def test_a_runner_killed_mid_job_is_seen_dead_and_its_job_returned_before_its_claim_runs_out(
        fleet_db: str, tmp_path: Path) -> None:
    """With claims of 10 minutes, the job comes back only because a runner finds the killed one gone (its process
    ended on this host) and returns the job: done once, by the other runner, the dead runner shown dead."""
    (job_id,) = _enqueue(fleet_db, "fake_evaluate", 1, payload={"seconds": 60.0})
    long_claims = ("--lease-seconds", "600")
    victim = _start_runner(fleet_db, tmp_path, "victim", *long_claims)
    engine = make_engine(fleet_db)
    _wait_until_running(engine, job_id, seconds=120)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    with Session(engine) as s, s.begin():  # the rest of the job is quick
        job = s.get(Job, job_id)
        assert job is not None
        job.payload = {"seconds": 0.01}
        s.add(job)
    (out,) = _wait_all([_start_runner(fleet_db, tmp_path, "survivor", *long_claims)], timeout=60)
    assert "runner victim is gone" in out, out
    with Session(engine) as s:
        job = s.get(Job, job_id)
        assert job is not None and job.status == "done" and job.attempts == 2
        assert "runner victim stopped answering" in (job.last_error or "")
        assert len(s.exec(select(Evaluation).where(Evaluation.job_id == job_id)).all()) == 1
        statuses = {r.name: r.status for r in s.exec(select(Runner)).all()}
        assert statuses == {"victim": "dead", "survivor": "stopped"}
    env = _env(fleet_db, tmp_path)
    shown = json.loads(subprocess.run([sys.executable, "-m", "bot.cli", "runners", "--all", "--json"], cwd=REPO,
                                      env=env, capture_output=True, text=True, check=True).stdout)
    assert {r["name"]: r["status"] for r in shown} == statuses
    engine.dispose()


@pytest.mark.slow
def test_job_that_kills_its_runner_fails_after_max_attempts(fleet_db: str, tmp_path: Path) -> None:
    (crash,) = _enqueue(fleet_db, "crash_runner", 1, max_attempts=2, priority=10)
    normal = _enqueue(fleet_db, "fake_evaluate", 20, payload={"seconds": 0.02})
    runners = [_start_runner(fleet_db, tmp_path, f"c{i}") for i in range(3)]
    _wait_all(runners)
    codes = sorted(r.returncode for r in runners)
    assert codes == [-signal.SIGKILL, -signal.SIGKILL, 0]  # two attempts, two runners; the third served on
    engine = make_engine(fleet_db)
    with Session(engine) as s:
        job = s.get(Job, crash)
        assert job is not None and job.status == "failed" and job.attempts == 2
        assert "stopped answering" in (job.last_error or "")
        assert {j.status for j in s.exec(select(Job).where(col(Job.id).in_(normal))).all()} == {"done"}
    engine.dispose()


@pytest.mark.slow
def test_failing_job_is_retried_then_failed_and_the_runner_serves_others(fleet_db: str, tmp_path: Path) -> None:
    (bad,) = _enqueue(fleet_db, "always_raise", 1, max_attempts=2, priority=10)
    good = _enqueue(fleet_db, "fake_evaluate", 5, payload={"seconds": 0.01})
    (runner,) = [_start_runner(fleet_db, tmp_path, "solo")]
    out = _wait_all([runner])[0]
    assert runner.returncode == 0, out
    engine = make_engine(fleet_db)
    with Session(engine) as s:
        job = s.get(Job, bad)
        assert job is not None and job.status == "failed" and job.attempts == 2
        assert "failed on all 2 attempts" in (job.last_error or "") and "this job always fails" in job.last_error
        assert {j.status for j in s.exec(select(Job).where(col(Job.id).in_(good))).all()} == {"done"}
    engine.dispose()


@pytest.mark.slow
def test_sigterm_finishes_the_running_job_and_deregisters(fleet_db: str, tmp_path: Path) -> None:
    (job_id,) = _enqueue(fleet_db, "noop", 1, payload={"seconds": 2.0})
    runner = _start_runner(fleet_db, tmp_path, "term")
    engine = make_engine(fleet_db)
    _wait_until_running(engine, job_id, seconds=60)
    runner.send_signal(signal.SIGTERM)
    out = _wait_all([runner])[0]
    assert runner.returncode == 0, out
    with Session(engine) as s:
        job = s.get(Job, job_id)
        assert job is not None and job.status == "done" and job.attempts == 1
        (registered,) = s.exec(select(Runner).where(Runner.name == "term")).all()
        assert registered.status == "stopped" and not registered.current_jobs
    engine.dispose()


@pytest.mark.slow
def test_sigterm_gives_back_a_job_that_outlasts_the_grace_period(fleet_db: str, tmp_path: Path) -> None:
    (job_id,) = _enqueue(fleet_db, "noop", 1, payload={"seconds": 30.0})
    runner = _start_runner(fleet_db, tmp_path, "short", "--grace-seconds", "0.5")
    engine = make_engine(fleet_db)
    _wait_until_running(engine, job_id, seconds=60)
    runner.send_signal(signal.SIGTERM)
    _wait_all([runner], timeout=60)
    assert runner.returncode == 0
    with Session(engine) as s:
        job = s.get(Job, job_id)
        assert job is not None and job.status == "queued" and job.attempts == 0 and job.runner_id is None
    engine.dispose()


def test_jobs_and_runners_json(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'kernelbot.db'}"
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    ids = _enqueue(url, "fake_evaluate", 2, payload={"seconds": 0.0})
    _wait_all([_start_runner(url, tmp_path, "lister")])
    env = _env(url, tmp_path)
    jobs = json.loads(subprocess.run([sys.executable, "-m", "bot.cli", "jobs", "--json"], cwd=REPO, env=env,
                                     capture_output=True, text=True, check=True).stdout)
    assert sorted(j["id"] for j in jobs) == sorted(ids)
    for j in jobs:
        assert {"id", "kind", "status", "attempts", "runner", "evaluation_ids"} <= set(j)
        assert j["status"] == "done" and len(j["evaluation_ids"]) == 1 and j["runner"]
    runners = json.loads(subprocess.run([sys.executable, "-m", "bot.cli", "runners", "--all", "--json"], cwd=REPO,
                                        env=env, capture_output=True, text=True, check=True).stdout)
    (runner,) = runners
    assert runner["name"] == "lister" and runner["status"] == "stopped"
    assert runner["hardware"]["platform"] == "cpu" and "tpu" not in runner["hardware"]  # no TPU here
    assert runner["heartbeat_age_seconds"] >= 0
