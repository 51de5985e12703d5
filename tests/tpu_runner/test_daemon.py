"""The runner daemon in-process: session events for session work, and refusals of bad configuration."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlmodel import Session, select

from storage import queue
from storage.engine import make_engine
from storage.migrate import upgrade
from storage.models import Job, KernelSession, SessionEvent
from storage.runners import register_runner
from storage.settings import load_settings
from tests.support.job_kinds import JOB_KINDS as TEST_KINDS
from tpu_runner.jobs import JobContext, JobRejected, compose
from tpu_runner.runner import (
    EVALUATION_KINDS,
    RunnerConfig,
    RunnerDaemon,
    production_check_job,
    production_check_wanted,
)


def _daemon(tmp_path: Path, **config: object) -> RunnerDaemon:
    engine = make_engine(f"sqlite:///{tmp_path / 'kernelbot.db'}")
    upgrade(engine)
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path)})
    options = {"name": "inproc", "targets": ("v6e",), "exit_when_idle": True, "poll_seconds": 0.05,
               "backoff_base": 0.01, **config}
    return RunnerDaemon(engine=engine, settings=settings, config=RunnerConfig(**options),  # type: ignore[arg-type]
                        job_kinds=compose(EVALUATION_KINDS, TEST_KINDS))


def test_session_jobs_become_session_events(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path)
    with Session(daemon.engine) as s, s.begin():
        s.add(KernelSession(id="sess1", mode="auto", task="softmax"))
        s.flush()
        done = queue.enqueue(s, kind="fake_evaluate", payload={"seconds": 0.0}, session_id="sess1").id
        failed = queue.enqueue(s, kind="always_raise", max_attempts=1, session_id="sess1").id
    assert daemon.run() == 0
    with Session(daemon.engine) as s:
        events = {e.kind: e.payload for e in s.exec(select(SessionEvent).where(SessionEvent.session_id == "sess1"))}
    assert events["job_done"]["job_id"] == done and events["job_done"]["evaluation_ids"]
    assert events["job_failed"]["job_id"] == failed and "this job always fails" in events["job_failed"]["reason"]


def test_unknown_job_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown job kinds"):
        _daemon(tmp_path, kinds=("no_such_kind",)).run()


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(ValueError, match="concurrency=0"):
        RunnerConfig(name="x", targets=("v6e",), concurrency=0)


def test_only_a_runner_on_the_targets_chip_takes_production_checks(tmp_path: Path) -> None:
    cpu = _daemon(tmp_path)
    assert "production_check" not in cpu.kinds() and cpu.routes() == [(cpu.kinds(), ["v6e"])]
    with pytest.raises(ValueError, match=r"need a TPU of one of this runner's targets \['v6e'\]"):
        _daemon(tmp_path, kinds=("production_check",)).run()
    on_chip = _daemon(tmp_path, targets=("v5e", "v6e"))
    on_chip.settings = replace(on_chip.settings, host_target="v6e", use_tpu=True)
    general = [k for k in on_chip.kinds() if k != "production_check"]
    assert on_chip.routes() == [(general, ["v5e", "v6e"]), (["production_check"], ["v6e"])]
    on_chip.settings = replace(on_chip.settings, use_tpu=False)  # KERNELBOT_TPU=off: estimates, no chip work
    assert "production_check" not in on_chip.kinds()


def test_a_production_check_is_queued_only_when_the_fleet_has_that_chip(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path)
    with Session(daemon.engine) as s, s.begin():
        alone = queue.enqueue(s, kind="wants_chip_check").id
    assert daemon.run() == 0
    with Session(daemon.engine) as s, s.begin():
        job = s.get(Job, alone)
        assert job is not None and job.result["follow_ups"] == [
            "production_check not queued: no active runner of the fleet is on a TPU v6e"]
        assert not s.exec(select(Job).where(Job.kind == "production_check")).all()
        stale = register_runner(s, name="old-v6e", host="h", pid=1, hardware={"tpu": "v6e", "measures": True},
                                targets=["v6e"], kinds=["production_check"], concurrency=1)
        stale.heartbeat_at -= 3600  # silent for an hour: not counted on
        register_runner(s, name="v5e-host", host="h", pid=2, hardware={"tpu": "v5e", "measures": True},
                        targets=["v5e", "v6e"], kinds=["production_check"], concurrency=1)
        register_runner(s, name="v6e-host", host="h", pid=3, hardware={"tpu": "v6e", "measures": True},
                        targets=["v6e"], kinds=["evaluate", "production_check"], concurrency=1)
        routed = queue.enqueue(s, kind="wants_chip_check").id
    assert _daemon(tmp_path).run() == 0
    with Session(daemon.engine) as s:
        job = s.get(Job, routed)
        assert job is not None and job.result["follow_ups"] == [
            "production_check queued for the TPU v6e runners (v6e-host)"]
        (check,) = s.exec(select(Job).where(Job.kind == "production_check")).all()
        assert check.status == "queued" and check.target == "v6e" and check.payload["after_job"] == routed


def test_a_production_check_claimed_off_the_chip_is_refused_not_estimated(tmp_path: Path) -> None:
    daemon = _daemon(tmp_path)
    ctx = JobContext(settings=daemon.settings, runner_id="r", job_id=1)
    with pytest.raises(JobRejected, match="needs a TPU v6e on its runner's host"):
        production_check_job(ctx, {"task_dir": "t", "kernel_path": "k", "target": "v6e", "after_job": 1})


def test_an_unverified_result_off_the_chip_wants_a_production_check() -> None:
    def result(verdict: str, host: str) -> SimpleNamespace:
        return SimpleNamespace(verdict=verdict, host=host)

    assert production_check_wanted(result("unverified", "cpu"))
    assert not production_check_wanted(result("unverified", "tpu"))  # it was the chip that could not tell
    assert not production_check_wanted(result("ok", "cpu")) and not production_check_wanted(result("incorrect", "cpu"))
