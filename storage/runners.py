"""Runner registrations: who is serving, on what hardware, how recently it was heard from, what it holds."""

from __future__ import annotations

import os
from typing import Any

from sqlmodel import Session, col, select

from storage.models import Runner, now


def register_runner(session: Session, *, name: str, host: str, pid: int, hardware: dict[str, Any],
                    targets: list[str], kinds: list[str], concurrency: int) -> Runner:
    runner = Runner(name=name, host=host, pid=pid, hardware=hardware, targets=targets, kinds=kinds,
                    concurrency=concurrency, current_jobs=[])
    session.add(runner)
    session.flush()
    return runner


def heartbeat_runner(session: Session, *, runner_id: str, current_jobs: list[int], status: str = "active") -> None:
    runner = session.get(Runner, runner_id)
    if runner is None:
        return
    runner.heartbeat_at, runner.current_jobs, runner.status = now(), list(current_jobs), status
    session.add(runner)


def deregister_runner(session: Session, *, runner_id: str) -> None:
    heartbeat_runner(session, runner_id=runner_id, current_jobs=[], status="stopped")


def get_runners(session: Session, *, include_stopped: bool = False) -> list[Runner]:
    query = select(Runner).order_by(col(Runner.started_at).desc())
    if not include_stopped:
        query = query.where(Runner.status != "stopped")
    return list(session.exec(query).all())


def get_active_runners(session: Session) -> list[Runner]:
    """The runners registered as active, by name (one silent for long is still listed: callers judge staleness)."""
    return list(session.exec(select(Runner).where(Runner.status == "active").order_by(col(Runner.name))).all())


def chip_runners(session: Session, *, target: str, kind: str, fresh_seconds: float = 300.0) -> list[Runner]:
    """Active runners heard from within `fresh_seconds` that serve `kind` on a TPU of `target` on their own host
    (their hardware says they measure there)."""
    since = now() - fresh_seconds
    return [r for r in get_active_runners(session)
            if r.heartbeat_at >= since and kind in (r.kinds or [])
            and (r.hardware or {}).get("tpu") == target and (r.hardware or {}).get("measures")]


DEAD_AFTER_SECONDS = 45.0  # three missed heartbeats (runners beat every 15 s at most)


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's live process
        return False
    return False


def dead_runners(session: Session, *, host: str, dead_after: float = DEAD_AFTER_SECONDS) -> list[Runner]:
    """Active runners that are gone: silent for longer than `dead_after`, or on this `host` with no process."""
    since = now() - dead_after
    return [r for r in get_active_runners(session)
            if r.heartbeat_at < since or (r.host == host and _pid_gone(r.pid))]


def mark_dead(session: Session, runner: Runner) -> None:
    runner.status, runner.current_jobs = "dead", []
    session.add(runner)
