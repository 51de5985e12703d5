"""The runner daemon in-process: session events for session work, and refusals of bad configuration."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlmodel import Session, select

from storage import queue
from storage.engine import make_engine
from storage.migrate import upgrade
from storage.models import KernelSession, SessionEvent
from storage.settings import load_settings
from tests.support.job_kinds import JOB_KINDS as TEST_KINDS
from tpu_runner.daemon import RunnerConfig, RunnerDaemon
from tpu_runner.job_kinds import EVALUATION_KINDS, compose


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
