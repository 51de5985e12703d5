"""Job kinds for the runner-fleet tests, loaded by runners through KERNELBOT_JOB_MODULES (`JOB_KINDS`)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from storage.models import Evaluation
from tpu_runner.jobs import FollowUp, JobContext, JobKinds, JobOutcome

JOB_KINDS = JobKinds()


@JOB_KINDS.kind("fake_evaluate")
def fake_evaluate(ctx: JobContext, payload: dict[str, Any]) -> JobOutcome:
    """Takes a little while and yields one evaluation, like `evaluate` without the compiler."""
    time.sleep(float(payload.get("seconds", 0.05)))
    return JobOutcome(result={"verdict": "ok"}, evaluations=[
        Evaluation(task="fake", target="v6e", verdict="ok", stage="done", runner_id=ctx.runner_id)])


@JOB_KINDS.kind("crash_runner")
def crash_runner(ctx: JobContext, payload: dict[str, Any]) -> JobOutcome:
    """Kills the runner process that runs it, every time."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


@JOB_KINDS.kind("always_raise")
def always_raise(ctx: JobContext, payload: dict[str, Any]) -> JobOutcome:
    raise RuntimeError("this job always fails")


@JOB_KINDS.kind("wants_chip_check")
def wants_chip_check(ctx: JobContext, payload: dict[str, Any]) -> JobOutcome:
    """Ends `unverified` and asks for a production check on a TPU v6e, as `evaluate` does off the chip."""
    return JobOutcome(result={"verdict": "unverified"}, then=[FollowUp(
        kind="production_check", payload={"after_job": ctx.job_id, "target": "v6e"}, target="v6e",
        needs_chip=True)])
