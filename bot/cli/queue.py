"""`kernelbot db upgrade | runner | enqueue-eval | jobs | job | cancel | runners`: the queue and the runner fleet."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Annotated

import typer
from sqlmodel import Session

from bot.cli import render
from bot.cli.common import AsJson, Target, console, err_console, get_settings, run_command
from storage.settings import Settings
from tpu_runner.hardware import CHIPS, get_chip

_app = typer.Typer()
_db = typer.Typer(help="The database: schema migrations.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    for command in _app.registered_commands:
        app.registered_commands.append(command)
    app.add_typer(_db, name="db")


@_db.command("upgrade")
def db_upgrade_command() -> None:
    """Apply the schema migrations to the configured database (KERNELBOT_DATABASE_URL, else local SQLite)."""

    def run() -> int:
        from storage.engine import make_engine
        from storage.migrate import current_revision, head_revision, upgrade

        settings = get_settings()
        settings.home.mkdir(parents=True, exist_ok=True)
        engine = make_engine(settings.database)
        before = current_revision(engine)
        upgrade(engine)
        console.print(f"database {engine.url.render_as_string(hide_password=True)}: {before or 'empty'} -> "
                      f"{head_revision()}")
        return 0

    run_command(run)


@_app.command("runner")
def runner_command(
    target: Annotated[list[str] | None, typer.Option("--target", help="Targets served (repeatable; default all).")]
    = None,
    concurrency: Annotated[int, typer.Option("--concurrency", help="Jobs run at once.")] = 1,
    name: Annotated[str | None, typer.Option("--name", help="Shown in `kernelbot runners`.")] = None,
    exit_when_idle: Annotated[bool, typer.Option("--exit-when-idle", help="Exit once no work is left.")] = False,
    lease_seconds: Annotated[float, typer.Option("--lease-seconds", help="How long a claim lasts without a "
                                                 "heartbeat; another runner takes a job over after that.")] = 60.0,
    kind: Annotated[list[str] | None, typer.Option("--kind", help="Job kinds served (repeatable; default all).")]
    = None,
    grace_seconds: Annotated[float, typer.Option("--grace-seconds", help="On SIGTERM, how long running jobs may "
                                                 "take to finish before they are given back.")] = 30.0,
) -> None:
    """The TPU runner daemon: claims jobs from the shared queue, runs them, records results. SIGTERM stops it
    cleanly (running jobs finish or are given back)."""

    def run() -> int:
        import logging
        import socket

        from agents.commands import recover_stranded
        from agents.session_jobs import runner_kinds
        from storage.connect import open_database
        from storage.logs import configure_logging
        from tpu_runner.runner import RunnerConfig, RunnerDaemon, describe_host, install_signal_handlers

        settings = get_settings()
        targets = tuple(get_chip(t).name for t in (target or list(CHIPS)))
        job_kinds = runner_kinds(settings.job_modules)  # what this runner serves, composed here
        configure_logging(settings, default_level="info")
        engine = open_database(settings)
        config = RunnerConfig(name=name or f"{socket.gethostname()}-{os.getpid()}", targets=targets,
                              concurrency=concurrency, kinds=tuple(kind or ()), lease_seconds=lease_seconds,
                              exit_when_idle=exit_when_idle, grace_seconds=grace_seconds)
        daemon = RunnerDaemon(engine=engine, settings=settings, config=config, hardware=describe_host(settings),
                              job_kinds=job_kinds)

        if settings.host_target:
            console.print(chip_line(settings), soft_wrap=True)
        for session_id in recover_stranded(engine):  # sessions a crash left without their job
            console.print(f"session {session_id} had work to do and no live job: queued it again")
        install_signal_handlers(daemon)
        code = daemon.run()
        if daemon.abandoned:
            # Jobs given back on shutdown may still be running in their threads; they must not hold the exit.
            logging.shutdown()
            os._exit(code)
        return code

    run_command(run)


def chip_line(settings: Settings) -> str:
    """What a runner starting on a TPU host says of the chip: whether it measures there, and who holds it now."""
    from tpu_runner.hardware import chip as host_chip

    assert settings.host_target is not None
    spec = get_chip(settings.host_target)
    if not settings.use_tpu:
        return f"TPU {spec.name} ({spec.device_kind}) on this host is not used (KERNELBOT_TPU=off): times are estimated"
    holders = host_chip.holders()
    now = f"held now by {', '.join(h.describe() for h in holders)}; " if holders else ""
    return (f"TPU {spec.name} ({spec.device_kind}) on this host: {spec.name} candidates are checked and timed on it, "
            f"one process at a time ({now}other runners and evaluations on this host take turns with this one)")


@_app.command("enqueue-eval")
def enqueue_eval_command(
    task: Annotated[Path, typer.Option("--task", help="Task directory.")],
    kernel: Annotated[Path, typer.Option("--kernel", help="Candidate module.")],
    target: Target = None,
    allow_pure_jax: Annotated[bool, typer.Option("--allow-pure-jax")] = False,
    priority: Annotated[int, typer.Option("--priority")] = 0,
) -> None:
    """Queue an evaluation for the runners and print its job id."""

    def run() -> int:
        from storage import queue
        from storage.blobs import pack_files
        from storage.connect import open_database
        from tpu_runner.evaluation import KernelFileError
        from tpu_runner.tasks import load_task

        settings = get_settings()
        task_obj = load_task(task)  # refuse a broken task now rather than on a runner
        if not kernel.is_file():
            raise KernelFileError(f"cannot read the kernel file {kernel}: no such file")
        chip = get_chip(target or settings.default_target)
        engine = open_database(settings)
        with Session(engine) as s, s.begin():
            # The files travel with the job: any runner runs it, whatever becomes of them here.
            job = queue.enqueue(s, kind="evaluate", target=chip.name, priority=priority, payload={
                "task_dir": str(task_obj.path), "kernel_path": str(kernel.resolve()), "target": chip.name,
                "allow_pure_jax": allow_pure_jax, "task": pack_files(s, task_obj.path),
                "kernel": pack_files(s, kernel.resolve())})
            job_id = job.id
        print(job_id)
        return 0

    run_command(run)


@_app.command("jobs")
def jobs_command(
    status: Annotated[str | None, typer.Option("--status", help="Only jobs in this status.")] = None,
    limit: Annotated[int, typer.Option("--limit")] = 50,
    as_json: AsJson = False,
) -> None:
    """List jobs, newest first."""

    def run() -> int:
        from storage import queue
        from storage.connect import open_database

        engine = open_database(get_settings())
        with Session(engine) as s:
            jobs = queue.get_jobs(s, limit=limit, status=status)
            evals = queue.evaluation_ids(s, job_ids=[j.id for j in jobs if j.id is not None])
            names = _runner_names(s)
            rows = [render.job_row(j, evals.get(j.id or 0, []), names) for j in jobs]
        if as_json:
            print(json.dumps(rows, indent=1))
        else:
            console.print(render.jobs_table(rows))
        return 0

    run_command(run, as_json=as_json)


def _runner_names(s: Session) -> dict[str, str]:
    from storage.runners import get_runners

    return {r.id: r.name for r in get_runners(s, include_stopped=True)}


@_app.command("job")
def job_command(
    job_id: Annotated[int, typer.Argument(help="The job's id (`kernelbot jobs` lists them).")],
    files: Annotated[Path | None, typer.Option("--files", help="Write the job's result, kernel, profile, chart and "
                                               "traces into this folder (from the database: any host).")] = None,
    as_json: AsJson = False,
) -> None:
    """One job: its status, runner, whole outcome, its evaluation's message and where its files are."""

    def run() -> int:
        from storage import queue
        from storage.blobs import fetch_files
        from storage.connect import open_database
        from storage.models import Evaluation, Job

        engine = open_database(get_settings())
        with Session(engine) as s:
            job = s.get(Job, job_id)
            if job is None:
                raise queue.JobNotFound(f"no job {job_id}")
            ids = queue.evaluation_ids(s, job_ids=[job_id]).get(job_id, [])
            row = render.job_row(job, ids, _runner_names(s))
            evaluations = [{"id": e.id, "verdict": e.verdict, "result": e.result, "artifacts_dir": e.artifacts_dir}
                           for e in (s.get(Evaluation, i) for i in ids) if e is not None]
            fetched = fetch_files(s, (job.result or {}).get("files") or {}, files) if files else []
        if files and not fetched:
            err_console.print(f"job {job_id} kept no files (not finished, not an evaluation, or queued before jobs "
                              "kept their files)")
        if as_json:
            print(json.dumps({**row, "evaluations": evaluations, "fetched": [str(p) for p in fetched]}, indent=1))
        else:
            console.print(render.job_detail(row, evaluations), soft_wrap=True, highlight=False)
            for path in fetched:
                console.print(f"  fetched: {path}", soft_wrap=True, highlight=False)
        return 0

    run_command(run, as_json=as_json)


@_app.command("cancel")
def cancel_command(
    job_id: Annotated[int, typer.Argument(help="The job's id (`kernelbot jobs` lists them).")],
) -> None:
    """Cancel a queued or running job (a runner holding it discards its result at its next heartbeat)."""

    def run() -> int:
        from storage import queue
        from storage.connect import open_database
        from storage.models import Job

        engine = open_database(get_settings())
        with Session(engine) as s, s.begin():
            cancelled = queue.cancel(s, job_id=job_id)
            job = s.get(Job, job_id)
            status = job.status if job else "gone"
        if cancelled:
            console.print(f"cancelled job {job_id}")
            return 0
        err_console.print(f"job {job_id} is {status}: only queued and running jobs can be cancelled")
        return 1

    run_command(run)


@_app.command("runners")
def runners_command(
    all_runners: Annotated[bool, typer.Option("--all", help="Include stopped runners.")] = False,
    as_json: AsJson = False,
) -> None:
    """List runners with their hardware, heartbeat age and current jobs."""

    def run() -> int:
        from storage.connect import open_database
        from storage.runners import get_runners

        engine = open_database(get_settings())
        with Session(engine) as s:
            at = time.time()
            rows = [render.runner_row(r, at=at) for r in get_runners(s, include_stopped=all_runners)]
        if as_json:
            print(json.dumps(rows, indent=1))
        else:
            console.print(render.runners_table(rows))
            if not rows:
                err_console.print("no runners; start one with `kernelbot runner`")
        return 0

    run_command(run, as_json=as_json)
