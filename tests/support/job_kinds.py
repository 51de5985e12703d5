"""Job kinds for the runner-fleet tests, loaded by runners through KERNELBOT_JOB_MODULES."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from storage.models import Evaluation
from tpu_runner.jobs import JobContext, JobOutcome, job_kind


@job_kind("fake_evaluate")
def fake_evaluate(ctx: JobContext, payload: dict[str, Any]) -> JobOutcome:
    """Takes a little while and yields one evaluation, like `evaluate` without the compiler."""
    time.sleep(float(payload.get("seconds", 0.05)))
    return JobOutcome(result={"verdict": "ok"}, evaluations=[
        Evaluation(task="fake", target="v6e", verdict="ok", stage="done", runner_id=ctx.runner_id)])


@job_kind("crash_runner")
def crash_runner(ctx: JobContext, payload: dict[str, Any]) -> JobOutcome:
    """Kills the runner process that runs it, every time."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


@job_kind("always_raise")
def always_raise(ctx: JobContext, payload: dict[str, Any]) -> JobOutcome:
    raise RuntimeError("this job always fails")
