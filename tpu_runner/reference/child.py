"""The reference's child: `python -m tpu_runner.sandbox.entry LIMITS tpu_runner.reference.child`, then the request.

Runs task code only - never a candidate's - in the same kind of sandbox as a candidate (a reference pasted in
Slack is code from a person). It describes the task's production configurations and exports the reference's
programs for the compile servers, and computes the reference's outputs on evaluator-owned inputs: on this host's
TPU when asked (`on_chip`, the chip's lock held), else as XLA computes them on a TPU (`numerics.as_on_tpu`); and
in float64, on the CPU. Writes `reference_report.json` beside the
request and the arrays under `out_dir`; the evaluator caches both.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import numpy as np

from tpu_runner.analysis.jaxpr_walk import inline_body
from tpu_runner.analysis.liveness import read_fractions
from tpu_runner.checking import (
    OutputSet,
    as_on_tpu,
    case_truth,
    perturbed_truth,
    reference_cost,
    run_reference_case,
    save_outputs,
    with_kept_values,
)
from tpu_runner.hardware import chip
from tpu_runner.reports import (
    ExportedTask,
    OutputJob,
    ReferenceReport,
    ReferenceRequest,
    classify_text,
    timed,
    write_json,
)
from tpu_runner.tasks import (
    CASES_BY_NAME,
    TaskError,
    abstract_configurations,
    config_from_json,
    config_to_json,
    drawn_ahead,
    import_reference,
    input_bounds,
    load_task,
    with_input_bounds,
)


def used_inputs(closed: Any) -> list[bool]:
    """Which inputs the program reads at all (looking through nested calls, which take every argument): an
    input it ignores is no compulsory traffic for the roofline."""
    jaxpr = getattr(closed, "jaxpr", closed)
    read: set[Any] = {v for v in jaxpr.outvars if not hasattr(v, "val")}
    for eqn in jaxpr.eqns:
        inner = inline_body(eqn)
        if inner is not None:
            read |= {v for v, used in zip(eqn.invars, used_inputs(inner), strict=True)
                     if used and not hasattr(v, "val")}
        else:
            read |= {v for v in eqn.invars if not hasattr(v, "val")}
    return [v in read for v in jaxpr.invars]


def _stage(workdir: Path, name: str) -> None:
    (workdir / "stage").write_text(name)


def describe(task_dir: str, out: Path) -> ExportedTask:
    """A task's production configurations, the inputs its reference reads, and its exported programs (written
    under `out`)."""
    task = load_task(task_dir)
    ref_fn = import_reference(task).computation
    described = ExportedTask()
    out.mkdir(parents=True, exist_ok=True)
    prod = with_input_bounds(abstract_configurations(task), input_bounds(task))
    for i, config in enumerate(prod):
        described.production.append(config_to_json(config))
        args = [jax.ShapeDtypeStruct(a.shape, np.dtype(a.dtype)) for a in config.dynamic]
        fn = jax.jit(lambda *d, _c=config: ref_fn(*d, *_c.static))
        closed = jax.make_jaxpr(fn)(*args)
        described.used_inputs.append(read_fractions(closed, used_inputs(closed)))
        exported = jax.export.export(fn, platforms=["tpu"])(*args)
        name = f"reference.config{i}.exported"
        (out / name).write_bytes(exported.serialize())
        described.programs.append(name)
    return described


def _save(out: Path, name: str, outputs: OutputSet | None) -> str | None:
    if outputs is None:
        return None
    save_outputs(out / name, outputs.tree, list(outputs.leaves), outputs.note)
    return name


def _failure(exc: Exception) -> str:
    if isinstance(exc, TaskError):
        return str(exc)
    return f"the reference raised {type(exc).__name__}: {str(exc)[:1500]}"


def _open_chip(workdir: Path) -> None:
    chip.hold(on_wait=lambda: _stage(workdir, chip.QUEUED_STAGE))  # held until this process ends
    _stage(workdir, "opening the TPU")
    chip.open_chip()


def _outputs(request: ReferenceRequest, task_index: int, jobs: list[OutputJob], out: Path, workdir: Path,
             background: ThreadPoolExecutor, ahead: ThreadPoolExecutor, timings: dict[str, float]
             ) -> dict[str, dict[str, dict[str, str | None]]]:
    """One task's outputs for its jobs: as the target computes them (on the chip itself, or as XLA computes on a
    TPU), and the float64 truth (on the CPU; where the reference's dots are within `truth_gflops` - larger ones
    are made only if the judge asks, `ReferenceStore.float64`, as only a near miss needs them). The target's
    outputs are computed here, in turn; the truth and the files are made in `background` meanwhile, so that CPU
    work does not keep the chip waiting."""
    task = load_task(request.task_dirs[task_index])
    ref_fn = import_reference(task).computation
    cases = CASES_BY_NAME
    found: dict[str, dict[str, dict[str, str | None]]] = {}
    pending: list[Future[None]] = []
    for job in jobs:
        # The reference's size at the job's shapes (traced, no value drawn): the budget's measure, and the truth's.
        elements, flops = (0, 0.0) if job.float64 else reference_cost(config_from_json(job.config), ref_fn)
        budget = request.interpret_budget
        if budget is not None and not (elements <= budget.elements and flops <= budget.flops):
            continue  # an interpret-mode check runs at other shapes, whose outputs are made when it asks for them
        _stage(workdir, f"reference outputs {job.key}")
        config = with_kept_values(task, config_from_json(job.config), job.values_from,
                                  Path(job.values_file) if job.values_file else None)
        files: dict[str, dict[str, str | None]] = {}
        if job.float64:
            wide = perturbed_truth if job.float64 == "perturbed" else case_truth
            for name in job.cases:
                with _on_cpu():
                    computed = wide(config=config, reference=ref_fn, case=cases[name])
                files[name] = {job.float64: _save(out, f"{job.key}.{name}.{job.float64}.npz", computed)}
        else:
            on_target = None if request.on_chip else as_on_tpu(ref_fn, config.static)
            with_truth = request.truth_gflops is None or flops / 1e9 <= request.truth_gflops
            for case, inputs in drawn_ahead(config, [cases[name] for name in job.cases], ahead):
                stem = f"{job.key}.{case.name}"
                with timed(timings, "target_outputs"):
                    host = inputs.result()
                    ran = None if host is None else run_reference_case(
                        config=config, reference=ref_fn, case=case, as_target=on_target, truth=False, host=host)
                if ran is None:
                    continue
                files[case.name] = {"expected": f"{stem}.expected.npz"}  # no "truth": the judge has it made if needed
                pending.append(background.submit(_save, out, f"{stem}.expected.npz", ran.expected))
                if case.distribution == "task" and job.values_from:  # for candidates' children (TASK_VALUES)
                    files[case.name]["values"] = f"{stem}.values.npz"
                    pending.append(background.submit(_save, out, f"{stem}.values.npz", OutputSet("", tuple(host))))
                if with_truth:
                    pending.append(background.submit(_truth, out, f"{stem}.truth.npz", files[case.name], config,
                                                     ref_fn, case, timings))
        found[job.key] = files
    with timed(timings, "waiting_for_truth"):
        for done in pending:
            done.result()  # a failure of any of them is the task's
    return found


def _truth(out: Path, name: str, entry: dict[str, str | None], config: Any, ref_fn: Any, case: Any,
           timings: dict[str, float]) -> None:
    with timed(timings, "truth"), _on_cpu():
        entry["truth"] = _save(out, name, case_truth(config=config, reference=ref_fn, case=case))


def _cpu() -> Any:
    return jax.devices("cpu")[0]


def _on_cpu() -> Any:
    return jax.default_device(_cpu())


def run(request: ReferenceRequest, workdir: Path,
        on_task_done: Callable[[ReferenceReport], None] | None = None) -> ReferenceReport:
    """Describe and export the tasks asked for, then compute their outputs task by task (`on_task_done` after each:
    the report so far, so that a child that dies later loses only the task it was on)."""
    report = ReferenceReport()
    out = Path(request.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if request.export:
        for i, task_dir in enumerate(request.task_dirs):
            _stage(workdir, f"reference of {Path(task_dir).name}")
            try:
                report.exported[task_dir] = describe(task_dir, out / str(i))
            except Exception as exc:  # noqa: BLE001 - a reference that fails is the task's problem, said as such
                report.exported[task_dir] = ExportedTask(task_error=_failure(exc))
        report.timings["export"] = time.perf_counter() - t0
    if not request.outputs:
        return report
    t1 = time.perf_counter()
    if request.on_chip:
        try:
            _open_chip(workdir)
        except chip.ChipBusy as exc:
            report.chip_busy = str(exc)
            return report
    # One helper: a float64 truth at production shapes can take GiBs, two at once more than the memory limit.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="truth") as background, \
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="inputs") as ahead:
        for index in sorted({job.task for job in request.outputs}):
            try:
                report.outputs.update(_outputs(request, index, [j for j in request.outputs if j.task == index], out,
                                               workdir, background, ahead, report.timings))
            except Exception as exc:  # noqa: BLE001 - likewise
                report.output_errors[request.task_dirs[index]] = _failure(exc)
                report.task_error = report.task_error or _failure(exc)
                if classify_text(str(exc)) == "hbm_oom":  # the task's size on this device, not a fault of it
                    report.out_of_memory.append(request.task_dirs[index])
            report.finished.append(request.task_dirs[index])
            if on_task_done:
                on_task_done(report)
    report.timings["outputs"] = time.perf_counter() - t1
    return report


def main(argv: list[str]) -> int:
    request_path = Path(argv[1])
    report_path = request_path.with_name("reference_report.json")
    report = run(ReferenceRequest.read(request_path), request_path.parent,
                 on_task_done=lambda so_far: write_json(report_path, so_far))
    write_json(report_path, report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
