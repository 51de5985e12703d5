"""The evaluation pipeline, parent side: static check here, every other stage in a sandboxed child.

The parent never imports candidate code. It turns the child's report - or the way the child ended
(timeout, memory limit, crash) - into one EvalResult, renders the profile chart and keeps the artifacts.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storage.settings import Settings
from tpu_runner.chart import render_profile_chart
from tpu_runner.hardware import get_chip
from tpu_runner.result import (
    VERDICT_FOR_STAGE,
    Correctness,
    CorrectnessCase,
    EvalError,
    EvalResult,
    Performance,
    failure,
)
from tpu_runner.sandbox import ChildOutcome, Gate, SparePool, child_environment
from tpu_runner.static_check import StaticViolation, check_source
from tpu_runner.tasks import Task, TaskError, load_task


class KernelFileError(ValueError):
    """The candidate file cannot be read."""


@dataclass(frozen=True)
class EvalRequest:
    task_dir: Path
    kernel_path: Path
    target: str
    allow_pure_jax: bool = False
    measure: bool = False  # time on this host's backend even without a TPU of the target (used by tests)


def detect_host() -> str:
    """'tpu' where this machine has TPU chips (their device files), else 'cpu'."""
    dev = Path("/dev")
    has_tpu = any(dev.glob("accel[0-9]*")) or any((dev / "vfio").glob("[0-9]*")) if dev.is_dir() else False
    return "tpu" if has_tpu else "cpu"


def _new_eval_id(task: Task) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{task.task_id}-{uuid.uuid4().hex[:6]}"


# How libtpu's fatal log lines start: a failed internal check, or the static profiler refusing the program.
LIBTPU_ABORT_SIGNS = ("Check failed", "LLO_CHECK", "Static LLO profiling of")


def _libtpu_checks(outcome: ChildOutcome) -> list[str]:
    """The internal checks libtpu names when it aborts the process (none if it did not abort)."""
    if outcome.signal_name != "SIGABRT":
        return []
    return list(dict.fromkeys(line for line in outcome.stderr_tail.splitlines()
                              if any(sign in line for sign in LIBTPU_ABORT_SIGNS)))


def _reference_crash(outcome: ChildOutcome, task: Task, target: str) -> TaskError | None:
    """libtpu aborting while it compiles the task's reference (after the candidate compiled): no candidate of this
    task can be evaluated on this target, whatever it is, so the task is refused rather than the candidate."""
    checks = _libtpu_checks(outcome)
    if outcome.stage != "reference" or not checks:
        return None
    return TaskError(f"libtpu aborted while compiling the reference of task {task.task_id} for {target} (an "
                     "internal check failed on the reference's program, not on the candidate's), so no candidate "
                     "can be compared with it on this target. Try another target, or write the reference's "
                     "computation another way (e.g. other block-friendly shapes):\n" + "\n".join(checks)[-2000:])


def _outcome_error(outcome: ChildOutcome, limits_wall: int, memory_mib: int) -> tuple[str, EvalError]:
    stage = {"reference": "compile"}.get(outcome.stage or "", outcome.stage or "")
    stage = stage if stage in ("lower", "compile", "correctness", "performance", "profile") else "lower"
    if outcome.timed_out:
        return stage, EvalError("timeout", f"the evaluation did not finish within {limits_wall} s (it was in the "
                                f"{stage} stage); a kernel that hangs or a grid far too large for this check")
    if outcome.memory_exceeded:
        return stage, EvalError("memory_limit", f"the evaluation used more than {memory_mib} MiB of memory in the "
                                f"{stage} stage and was stopped")
    sig = outcome.signal_name
    checks = _libtpu_checks(outcome)
    if stage in ("lower", "compile") and checks:
        # libtpu aborts the process when an internal check fails on the candidate's program.
        return stage, EvalError("compiler_crash", "libtpu aborted while compiling this candidate (an internal check "
                                "failed, or its static profiler refused the program); rewrite the construct it "
                                "names:\n" + "\n".join(checks)[-2000:])
    kind = {"SIGXCPU": "cpu_time_limit", "SIGXFSZ": "output_limit"}.get(sig or "", "crashed")
    tail = "\n".join(outcome.stderr_tail.strip().splitlines()[-25:])
    how = f"killed by {sig}" if sig else f"exited with status {outcome.returncode}"
    return stage, EvalError(kind, f"the evaluation process {how} in the {stage} stage without a result.\n{tail}")


def _from_child(report: dict[str, Any], *, task: Task, target: str, host: str) -> EvalResult:
    corr = report.get("correctness")
    correctness = None
    if corr:
        corr = dict(corr)
        corr["cases"] = [CorrectnessCase(**c) for c in corr.get("cases", [])]
        correctness = Correctness(**corr)
    extra: dict[str, Any] = {"correctness": correctness, "notes": list(report.get("notes", [])),
                             "timings": dict(report.get("timings", {})), "ir_hash": report.get("ir_hash")}
    if report.get("error"):
        err = report["error"]
        error = EvalError(err["kind"], err["detail"], err.get("line"), err.get("stage"))
        return failure(task=task.task_id, target=target, host=host, stage=report["stage"], error=error,  # type: ignore[arg-type]
                       verdict=report.get("verdict"), **extra)
    perf = Performance(**report["performance"])
    assert correctness is not None
    verdict = "ok" if correctness.status == "passed" else "unverified"
    message = (f"{verdict}: x{perf.speedup:.2f} vs reference ({perf.method}: {perf.candidate:.4g} ms vs "
               f"{perf.reference:.4g} ms on {target}), {perf.roofline_fraction or 0:.0%} of roofline")
    if verdict == "unverified":
        message += "; correctness was not checked: " + "; ".join(correctness.notes)[:300]
    if perf.flags:
        message += f"; flagged: {', '.join(f.split(':')[0] for f in perf.flags)}"
    return EvalResult(task=task.task_id, target=target, host=host, verdict=verdict, stage="done",  # type: ignore[arg-type]
                      message=message, performance=perf, profile=report.get("profile"), **extra)


IrGate = Callable[[str], str | None]  # normalised IR digest -> None to go on, or what it duplicates to stop


def evaluate(request: EvalRequest, settings: Settings, *, eval_id: str | None = None,
             on_stage: Callable[[str], None] | None = None, spares: SparePool | None = None,
             ir_gate: IrGate | None = None) -> EvalResult:
    """Evaluate one candidate. Raises TaskError / KernelFileError / UnknownTarget for bad input.

    With `ir_gate`, the child stops after lowering when the gate says the program was evaluated already
    (verdict `duplicate`), before the expensive stages."""
    started = time.perf_counter()
    task = load_task(request.task_dir)
    chip = get_chip(request.target)
    host = detect_host()
    try:
        source = request.kernel_path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise KernelFileError(f"cannot read the kernel file {request.kernel_path}: {exc}") from None
    settings.ensure_dirs()
    eval_id = eval_id or _new_eval_id(task)
    artifacts = settings.artifacts_dir / eval_id
    artifacts.mkdir(parents=True, exist_ok=True)
    kernel_copy = artifacts / "candidate.py"
    kernel_copy.write_text(source)
    artifact_map = {"candidate": str(kernel_copy)}
    allow_pure_jax = request.allow_pure_jax or task.allow_pure_jax

    try:
        check_source(source, expected_params=task.param_count, allow_pure_jax=allow_pure_jax,
                     filename=str(kernel_copy))
        if on_stage:
            on_stage("static")
    except StaticViolation as violation:
        result = failure(task=task.task_id, target=chip.name, host=host, stage="static", error=violation.error)  # type: ignore[arg-type]
        return _finish(result, artifacts, artifact_map, started)

    workdir = artifacts / "work"
    workdir.mkdir(parents=True, exist_ok=True)

    def env_for(scratch: Path) -> dict[str, str]:
        return child_environment(workdir=scratch, llo_dump_dir=scratch / "llo_dump", on_tpu=host == "tpu",
                                 target_accelerator=f"{chip.name}-1", static_profile=settings.static_profile)

    pool = spares or SparePool(root=settings.home / "sandbox", limits=settings.limits, keep=0)
    child = pool.acquire(f"{chip.name}-{settings.static_profile}-{host}", env_for)
    child_request = {
        "task_dir": str(task.path), "kernel_path": str(kernel_copy), "target": chip.name, "host": host,
        "allow_pure_jax": allow_pure_jax, "artifacts_dir": str(artifacts), "workdir": str(workdir),
        "cache_dir": str(settings.cache_dir), "llo_dump_dir": str(child.llo_dump_dir),
        "interpret_grid_steps": settings.limits.interpret_grid_steps, "measure": request.measure,
        "static_profile": settings.static_profile, "ir_gate": ir_gate is not None,
    }
    request_path = workdir / "request.json"
    request_path.write_text(json.dumps(child_request, indent=1))
    gate = None
    if ir_gate is not None:
        def answer(digest: str) -> str:
            duplicate_of = ir_gate(digest)
            return "go" if duplicate_of is None else f"stop {duplicate_of}"
        gate = Gate(workdir / "ir_hash", answer)
    outcome = child.run([str(request_path)], stage_file=workdir / "stage", limits=settings.limits,
                        on_stage=on_stage, gate=gate)
    for log in ("stdout.txt", "stderr.txt"):
        if (child.scratch / log).is_file():
            shutil.move(child.scratch / log, workdir / log)
    shutil.rmtree(child.scratch, ignore_errors=True)
    report_path = workdir / "child_result.json"
    if outcome.returncode == 0 and report_path.is_file() and not (outcome.timed_out or outcome.memory_exceeded):
        report = json.loads(report_path.read_text())
        if "task_error" in report:
            raise TaskError(report["task_error"])
        result = _from_child(report, task=task, target=chip.name, host=host)
    else:
        if (crash := _reference_crash(outcome, task, chip.name)) is not None:
            raise crash
        stage, error = _outcome_error(outcome, settings.limits.wall_seconds, settings.limits.memory_mib)
        verdict = {"timeout": "timeout", "compiler_crash": VERDICT_FOR_STAGE[stage]}.get(error.kind, "crashed")
        result = failure(task=task.task_id, target=chip.name, host=host, stage=stage, error=error, verdict=verdict)  # type: ignore[arg-type]
    result.timings["child_wall"] = outcome.wall_seconds
    result.timings["peak_rss_mib"] = outcome.peak_rss_mib
    (workdir / "stderr.txt").exists() and artifact_map.setdefault("log", str(workdir / "stderr.txt"))
    if result.profile:
        (artifacts / "profile.txt").write_text(result.profile["summary"] + "\n")
        artifact_map["profile_summary"] = str(artifacts / "profile.txt")
        chart = render_profile_chart(result.profile, artifacts / "profile.png",
                                     title=f"{task.task_id} on {chip.name} ({result.profile['method']})")
        artifact_map["profile_chart"] = str(chart)
    for ir in sorted(artifacts.glob("candidate.config*.stablehlo.mlir")):
        artifact_map[ir.stem.replace(".", "_")] = str(ir)
    if (artifacts / "llo").is_dir():
        artifact_map["static_profiles"] = str(artifacts / "llo")
    return _finish(result, artifacts, artifact_map, started)


def _finish(result: EvalResult, artifacts: Path, artifact_map: dict[str, str], started: float) -> EvalResult:
    result.artifacts = {**artifact_map, "result": str(artifacts / "result.json")}
    total = time.perf_counter() - started
    stage_seconds = sum(v for k, v in result.timings.items() if k in ("lower", "compile", "reference",
                                                                      "correctness", "performance", "profile"))
    result.timings["total"] = total
    result.timings["overhead"] = max(0.0, total - stage_seconds)
    (artifacts / "result.json").write_text(json.dumps(result.to_json(), indent=1, default=float))
    return result


def evaluate_many(requests: Iterable[EvalRequest], settings: Settings, *, workers: int | None = None,
                  warm_spares: bool = True, on_done: Callable[[EvalRequest, EvalResult | Exception], None] | None = None
                  ) -> list[EvalResult | Exception]:
    """Evaluate candidates in parallel, one sandboxed child each, up to `workers` at a time.

    With `warm_spares`, the next children are started while earlier ones run, so an evaluation does not wait
    for Python and JAX to start (each child still serves one candidate)."""
    items = list(requests)
    workers = workers or settings.eval_workers
    spares = SparePool(root=settings.home / "sandbox", limits=settings.limits, keep=0)  # set per evaluation below
    waiting = [len(items)]
    lock = threading.Lock()

    def one(req: EvalRequest) -> EvalResult | Exception:
        with lock:  # no more spares than evaluations still to start: unused ones are wasted start-ups
            waiting[0] -= 1
            spares.keep = min(workers, waiting[0]) if warm_spares else 0
        try:
            outcome: EvalResult | Exception = evaluate(req, settings, spares=spares)
        except (TaskError, KernelFileError, ValueError) as exc:
            outcome = exc
        if on_done:
            on_done(req, outcome)
        return outcome

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(one, items))
    finally:
        spares.close()
