"""How fast the job queue moves on SQLite and on PostgreSQL, with 1, 2 and 4 runner processes.

For each database and runner count: a fresh database, migrated; --jobs no-op jobs (kind `noop`, 0 s, so the queue
itself is measured) enqueued in one transaction; then that many real `kernelbot runner --exit-when-idle --kind noop
--concurrency 1` processes, waited for until they exit. From the jobs table: jobs claimed and completed per second
(jobs / (last finished - first started), so process start-up is not counted) and the time from enqueue to claim
(started - created; median and p90). Since every job is enqueued before the runners start, that time is mostly the
backlog ahead of the job, plus the runners' start-up. A second figure: one runner already running and idle,
--idle-jobs jobs enqueued one at a time --idle-gap seconds apart, enqueue to claim of each: a runner that finds
nothing to claim looks again 0.5 s later, so this is mostly that poll interval.

PostgreSQL: a fresh database is created on the --postgres server for each measurement and dropped afterwards; without
a reachable server only SQLite is measured, and the output says so.

    .venv/bin/python benchmarks/queue_throughput.py [--jobs 500] [--runners 1,2,4] [--postgres URL]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlmodel import Session, select

from storage import queue
from storage.engine import make_engine, normalise_url
from storage.migrate import upgrade
from storage.models import Job, Runner

REPO = Path(__file__).resolve().parent.parent
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"


class BenchmarkFailed(SystemExit):
    pass


@contextmanager
def fresh_database(kind: str, server: str, scratch: Path) -> Iterator[str]:
    """The URL of an empty database of this kind: a new SQLite file, or a new database on the PostgreSQL server."""
    if kind == "sqlite":
        path = scratch / f"queue-{uuid.uuid4().hex[:8]}.db"
        yield f"sqlite:///{path}"
        return
    url = make_url(normalise_url(server))
    admin = create_engine(url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})
    name = f"kb_bench_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield url.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def postgres_unreachable(server: str) -> str | None:
    """Why the server cannot be used, or None when it can."""
    url = make_url(normalise_url(server))
    engine = create_engine(url, connect_args={"connect_timeout": 5})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    finally:
        engine.dispose()
    return None


def start_runner(url: str, home: Path, name: str, *, exit_when_idle: bool) -> tuple[subprocess.Popen[bytes], Path]:
    env = dict(os.environ, KERNELBOT_HOME=str(home), KERNELBOT_DATABASE_URL=url, JAX_PLATFORMS="cpu")
    command = [sys.executable, "-m", "bot.cli", "runner", "--kind", "noop", "--name", name, "--concurrency", "1"]
    if exit_when_idle:
        command.insert(4, "--exit-when-idle")
    log = home / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    return proc, log


def tail(log: Path, lines: int = 20) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def percentiles_ms(seconds: list[float]) -> tuple[float, float]:
    """Median and p90, in milliseconds."""
    ms = [1000 * s for s in seconds]
    p90 = statistics.quantiles(ms, n=10, method="inclusive")[8] if len(ms) > 1 else ms[0]
    return statistics.median(ms), p90


def done_jobs(url: str, expected: int) -> tuple[list[Job], list[Runner]]:
    """Every job, which must all be done, and the runners."""
    engine = make_engine(url)
    try:
        with Session(engine) as s:
            jobs = list(s.exec(select(Job)).all())
            runners = list(s.exec(select(Runner)).all())
    finally:
        engine.dispose()
    statuses = Counter(j.status for j in jobs)
    if len(jobs) != expected or statuses["done"] != expected:
        errors = Counter(j.last_error for j in jobs if j.last_error)
        raise BenchmarkFailed(f"expected {expected} done jobs, found {dict(statuses)} (errors: {dict(errors)})")
    return jobs, runners


def throughput_round(url: str, home: Path, jobs: int, runners: int, timeout: float) -> dict[str, object]:
    """Enqueue the jobs, run the runners to completion, and measure from the jobs table."""
    engine = make_engine(url)
    try:
        upgrade(engine)
        with Session(engine) as s, s.begin():
            for _ in range(jobs):
                queue.enqueue(s, kind="noop", payload={"seconds": 0})
    finally:
        engine.dispose()
    started = [start_runner(url, home, f"bench{i}", exit_when_idle=True) for i in range(runners)]
    procs = [p for p, _ in started]
    deadline = time.monotonic() + timeout
    try:
        for proc, log in started:
            try:
                code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise BenchmarkFailed(f"runner {log.stem} still running after {timeout:.0f} s; its log ends:\n"
                                      f"{tail(log)}") from None
            if code != 0:
                raise BenchmarkFailed(f"runner {log.stem} exited with {code}; its log ends:\n{tail(log)}")
    finally:
        stop_all(procs)
    rows, registered = done_jobs(url, jobs)
    first = min(j.started_at or 0.0 for j in rows)
    last = max(j.finished_at or 0.0 for j in rows)
    median, p90 = percentiles_ms([(j.started_at or 0.0) - j.created_at for j in rows])
    names = {r.id: r.name for r in registered}
    shares = Counter(names.get(j.runner_id or "", "?") for j in rows)
    all_up = max(r.started_at for r in registered)  # runners start one by one: jobs claimed before all were up
    early = sum(1 for j in rows if (j.started_at or 0.0) < all_up)
    return {"seconds": last - first, "rate": jobs / (last - first), "median": median, "p90": p90,
            "shares": "/".join(str(shares[f"bench{i}"]) for i in range(runners)), "early": early}


def idle_latency(url: str, home: Path, count: int, gap: float, timeout: float) -> tuple[float, float]:
    """One runner, started and idle; jobs enqueued one at a time; enqueue-to-claim median and p90 in ms."""
    engine = make_engine(url)
    upgrade(engine)
    proc, log = start_runner(url, home, "bench-idle", exit_when_idle=False)
    try:
        deadline = time.monotonic() + timeout
        while True:  # registered means started up; then give it a moment to reach its idle poll
            with Session(engine) as s:
                if s.exec(select(Runner).where(Runner.name == "bench-idle")).first() is not None:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise BenchmarkFailed(f"the idle runner did not start (exit {proc.poll()}); its log ends:\n"
                                      f"{tail(log)}")
            time.sleep(0.1)
        time.sleep(1.0)
        for _ in range(count):
            with Session(engine) as s, s.begin():
                queue.enqueue(s, kind="noop", payload={"seconds": 0})
            time.sleep(gap)
        while True:
            with Session(engine) as s:
                pending = s.exec(select(Job).where(Job.status != "done")).all()
            if not pending:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise BenchmarkFailed(f"{len(pending)} jobs not done (runner exit {proc.poll()}); its log ends:\n"
                                      f"{tail(log)}")
            time.sleep(0.1)
    finally:
        stop_all([proc])
        engine.dispose()
    rows, _ = done_jobs(url, count)
    return percentiles_ms([(j.started_at or 0.0) - j.created_at for j in rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=500, help="no-op jobs per measurement")
    parser.add_argument("--runners", default="1,2,4", help="runner process counts to measure")
    parser.add_argument("--postgres", default=DEFAULT_POSTGRES, help="PostgreSQL server (a database is created "
                        "and dropped on it)")
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument("--idle-jobs", type=int, default=50, help="jobs for the idle-runner latency")
    parser.add_argument("--idle-gap", type=float, default=0.1, help="seconds between those jobs")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one measurement may take")
    args = parser.parse_args()
    counts = [int(n) for n in args.runners.split(",")]
    kinds = args.databases.split(",")
    if "postgresql" in kinds:
        why = postgres_unreachable(args.postgres)
        if why is not None:
            server = make_url(normalise_url(args.postgres)).render_as_string(hide_password=True)
            print(f"PostgreSQL skipped: {server} is not reachable ({why})")
            kinds.remove("postgresql")
    began = time.perf_counter()
    shares: list[str] = []
    early: list[str] = []
    idle: dict[str, tuple[float, float]] = {}
    print(f"{'database':<10} {'runners':>7} {'jobs':>5} {'seconds':>8} {'jobs/s':>7} {'enqueue->claim median ms':>24} "
          f"{'p90 ms':>8}", flush=True)
    with tempfile.TemporaryDirectory(prefix="kb-queue-bench-") as tmp:
        scratch = Path(tmp)
        for kind in kinds:
            for runners in counts:
                home = scratch / f"{kind}-{runners}"
                home.mkdir()
                with fresh_database(kind, args.postgres, scratch) as url:
                    r = throughput_round(url, home, args.jobs, runners, args.timeout)
                print(f"{kind:<10} {runners:>7} {args.jobs:>5} {r['seconds']:>8.2f} {r['rate']:>7.1f} "
                      f"{r['median']:>24.0f} {r['p90']:>8.0f}", flush=True)
                shares.append(f"{kind} x{runners}: {r['shares']}")
                if runners > 1:
                    early.append(f"{kind} x{runners}: {r['early']}")
            home = scratch / f"{kind}-idle"
            home.mkdir()
            with fresh_database(kind, args.postgres, scratch) as url:
                idle[kind] = idle_latency(url, home, args.idle_jobs, args.idle_gap, args.timeout)
    print("enqueue->claim above: all jobs are enqueued before the runners start, so it is dominated by the backlog "
          "ahead of each job (and includes the runners' start-up), not by the queue's own latency.")
    for kind, (median, p90) in idle.items():
        print(f"{kind}: one idle runner (polls every 0.5 s when it finds no work), {args.idle_jobs} jobs enqueued "
              f"{args.idle_gap:g} s apart: enqueue->claim median {median:.0f} ms, p90 {p90:.0f} ms")
    print("jobs done per runner: " + "; ".join(shares))
    if early:
        print(f"of the {args.jobs}, claimed before the last runner had started up: " + "; ".join(early))
    print(f"total {time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main()
