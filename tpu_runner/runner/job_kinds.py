"""The evaluator's job kinds (`EVALUATION_KINDS`: evaluate, production_check, noop), written to the job-kind
contract (`tpu_runner.jobs.contract`) that every package's kinds and the daemon share."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tpu_runner.jobs import FollowUp, JobContext, JobKinds, JobOutcome, JobRejected, evaluation_record, job_result

EVALUATION_KINDS = JobKinds()  # this package's own: evaluate, production_check, noop
# Kinds only a runner on a TPU of the job's target may take: what they decide needs the chip itself.
ON_CHIP_KINDS = frozenset({"production_check"})


def production_check_wanted(result: Any) -> bool:
    """An `unverified` result not judged on a TPU: a check at the production shapes on the chip decides it (a
    kernel that failed only at derived shapes, one with no smaller configuration to check, one interpret mode
    cannot simulate, an estimate faster than physics)."""
    return result.verdict == "unverified" and result.host != "tpu"


def _carried(ctx: JobContext, payload: dict[str, Any]) -> tuple[Path, Path]:
    """The task and kernel a job names: the files it carries, unpacked on this runner (once per content), or - a job
    queued before jobs carried their files - the paths it was given."""
    if not (payload.get("task") and payload.get("kernel")) or ctx.engine is None:
        return Path(payload["task_dir"]), Path(payload["kernel_path"])
    from sqlmodel import Session

    from storage.blobs import unpack_files

    root = ctx.settings.home / "jobs"
    with Session(ctx.engine) as s:
        return unpack_files(s, payload["task"], root), unpack_files(s, payload["kernel"], root)


def _keep_files(ctx: JobContext, result: Any) -> dict[str, dict[str, str]]:
    """The evaluation's result, kernel, profile and traces stored with the job, for `kernelbot job ID --files`
    anywhere (the runner's own disk is not the team's)."""
    if ctx.engine is None or not result.artifacts:
        return {}
    from sqlmodel import Session

    from storage.blobs import keep_files

    with Session(ctx.engine) as s, s.begin():
        return keep_files(s, result.artifacts)


def _evaluate(ctx: JobContext, payload: dict[str, Any]) -> Any:
    from storage.blobs import BlobError
    from tpu_runner.evaluation import EvalRequest, KernelFileError
    from tpu_runner.evaluation.evaluate import evaluate
    from tpu_runner.hardware import UnknownTarget
    from tpu_runner.tasks import TaskError

    try:
        task_dir, kernel_path = _carried(ctx, payload)
        request = EvalRequest(task_dir, kernel_path, payload.get("target") or ctx.settings.default_target,
                              bool(payload.get("allow_pure_jax", False)))
        return evaluate(request, ctx.settings, eval_id=f"job{ctx.job_id}-{int(time.time())}", spares=ctx.spares)
    except (KeyError, TaskError, KernelFileError, UnknownTarget, BlobError) as exc:
        raise JobRejected(f"{type(exc).__name__}: {exc}") from exc


@EVALUATION_KINDS.kind("evaluate")
def evaluate_job(ctx: JobContext, payload: dict[str, Any]) -> JobOutcome:
    """payload: task_dir, kernel_path, target, allow_pure_jax. An `unverified` result judged off the chip is
    followed by a production check on a TPU runner of the target, when the fleet has one."""
    result = _evaluate(ctx, payload)
    files = _keep_files(ctx, result)
    then = []
    if production_check_wanted(result):
        then.append(FollowUp(kind="production_check", payload={**payload, "target": result.target,
                                                               "after_job": ctx.job_id},
                             target=result.target, dedup_key=f"production-check-{ctx.job_id}", needs_chip=True))
    return JobOutcome(result=job_result(result, files=files), evaluations=[evaluation_record(result, ctx.runner_id)],
                      then=then)


@EVALUATION_KINDS.kind("production_check")
def production_check_job(ctx: JobContext, payload: dict[str, Any]) -> JobOutcome:
    """payload: an `evaluate` job's, plus after_job (the job whose unverified result this decides). Checked at the
    production shapes and timed on this runner's chip; its verdict is the kernel's."""
    target = payload.get("target") or ctx.settings.default_target
    if not ctx.settings.on_chip(target):
        raise JobRejected(f"a production check needs a TPU {target} on its runner's host, and this one has none")
    result = _evaluate(ctx, payload)
    after = payload.get("after_job")
    result.notes.append(f"production check on the chip of job {after}'s unverified result: this verdict decides it")
    return JobOutcome(result=job_result(result, decides_job=after, files=_keep_files(ctx, result)),
                      evaluations=[evaluation_record(result, ctx.runner_id)])


@EVALUATION_KINDS.kind("noop")
def noop_job(ctx: JobContext, payload: dict[str, Any]) -> JobOutcome:
    """Does nothing (for `seconds`): measures the queue itself."""
    time.sleep(float(payload.get("seconds", 0.0)))
    return JobOutcome(result={"slept": payload.get("seconds", 0.0)})
