"""Running queue-driven sessions on this machine: the embedded default, where the terminal command brings its
own runner. The runner is the real daemon (the same one `kernelbot runner` starts), serving the session's jobs
until the session is over."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from sqlalchemy import Engine
from sqlmodel import Session, col, select

from agents.session_jobs import runner_kinds
from storage import sessions
from storage.errors import KernelbotError
from storage.models import Job
from storage.settings import Settings
from tpu_runner.runner import RunnerConfig, RunnerDaemon, describe_host


class SessionStopped(KernelbotError, RuntimeError):
    """A session run here whose runner gave up on it; the message is the runner's reason."""
    next_step = "fix what the reason names, then `kernelbot optimize` again (`kernelbot jobs` shows the job)"


def run_until_settled(engine: Engine, settings: Settings, session_id: str, *, kinds: tuple[str, ...],
                      workers: int, on_poll: Callable[[], None] | None = None, poll_seconds: float = 1.0) -> str:
    """Serve the session's jobs with an in-process runner until the session is no longer active; returns its
    final status. Ctrl-C stops the runner cleanly and leaves the session resumable."""
    with Session(engine) as s:
        target = sessions.get_session(s, session_id=session_id).target
    daemon = RunnerDaemon(engine=engine, settings=settings, hardware=describe_host(settings),
                          job_kinds=runner_kinds(settings.job_modules),
                          config=RunnerConfig(name=f"local-{session_id}", targets=(target,), concurrency=workers,
                                              kinds=kinds, poll_seconds=0.2, grace_seconds=5.0,
                                              lease_seconds=10.0))  # a crashed local run resumes soon
    thread = threading.Thread(target=daemon.run, name="local-runner", daemon=True)
    thread.start()
    try:
        while True:
            with Session(engine) as s:
                status = sessions.get_session(s, session_id=session_id).status
                # A decision queues the next job before the session looks busy again: wait for it too.
                pending = s.exec(select(Job.id).where(Job.session_id == session_id,
                                                      col(Job.status).in_(("queued", "running")))).first()
            if on_poll:
                on_poll()
            if (status != "active" and pending is None) or not thread.is_alive():
                return status
            time.sleep(poll_seconds)
    finally:
        daemon.request_stop()
        thread.join(timeout=60)
