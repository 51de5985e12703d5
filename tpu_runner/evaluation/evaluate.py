"""The evaluation pipeline, parent side: the static check here, everything else in processes it supervises.

- the reference's child (`reference.child`, cached by `reference.store`): the task's production shapes, its
  exported programs and its outputs on evaluator-owned inputs; it never sees the candidate;
- the candidate's child (`candidate.child`, run from here by `candidate.process`): traces, checks and exports the
  candidate, runs it at the check shapes and saves the outputs; it can write only its own work directory;
- the compile servers (`compiler.service`): compile both programs for the target with libtpu and its static
  profiler, apart from each other, so a profiler abort costs the estimate its cycles, never the verdict.
This process compares the outputs (numpy only), builds the estimate from the compilers' answers and gives the
verdict. It never imports candidate or task code.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal

from storage.errors import KernelbotError
from storage.settings import EvalLimits, Settings
from tpu_runner.analysis import traffic_from_json
from tpu_runner.candidate import (
    CandidateCompiles,
    IrGate,
    SparePool,
    StaticViolation,
    check_source,
    run_candidate,
    stopped_error,
)
from tpu_runner.checking import (
    CandidateFailed,
    CandidateRun,
    Judge,
    OutputSet,
    ReferenceRun,
    judged,
    load_outputs,
    output_scale,
    scaled_atol,
)
from tpu_runner.hardware import ChipBusy, ChipSpec, UnknownTarget, get_chip, with_chip_memory
from tpu_runner.reference import ReferenceStopped, output_key, reference_store
from tpu_runner.reports import (
    Budget,
    CandidateReport,
    CandidateRequest,
    CheckReport,
    Correctness,
    CorrectnessCase,
    EvalError,
    EvalResult,
    Host,
    KeptDifference,
    OutputJob,
    Stage,
    Verdict,
    failure,
)
from tpu_runner.sandbox import ChildOutcome
from tpu_runner.tasks import EVALUATOR_CASES, Task, TaskError, config_from_json, load_task
from tpu_runner.timing import (
    CandidateProgram,
    accepted_while_timing,
    band_text,
    estimated_performance,
    measured_performance,
    render_profile_chart,
    summarise,
    trace_json,
)


class KernelFileError(KernelbotError, ValueError):
    """The candidate file cannot be read."""
    next_step = "pass the path of a Python file that defines computation(...)"


class DerivedShapesOnly(Exception):
    """The candidate failed only at shapes the evaluator derived from the production ones: a kernel written for its
    production sizes may do that and be right, so it proves nothing either way."""

    def __init__(self, error: EvalError, why: str):
        super().__init__(error.detail)
        self.error, self.why = error, why


@dataclass(frozen=True)
class KernelSource:
    """A candidate's code in hand (a brain's answer, a database row), not in a file of its own."""

    code: str


@dataclass(frozen=True)
class EvalRequest:
    """One candidate to evaluate. Where the caller holds them already (agents, jobs) the task is the loaded `Task`
    and the kernel its `KernelSource`; at the edges (the terminal's files, benchmarks) they are a task directory and
    a kernel file, read here. Either way the evaluator writes the one copy of the kernel its sandboxed child reads,
    kept with the evaluation's artifacts."""

    task: Task | Path
    kernel: KernelSource | Path
    target: str
    allow_pure_jax: bool = False
    measure: bool = False  # time on this host's backend even without a TPU of the target (used by tests)

    def loaded_task(self) -> Task:
        """The task (TaskError when a directory given is not one)."""
        return self.task if isinstance(self.task, Task) else load_task(self.task)

    def source(self) -> str:
        """The candidate's code (KernelFileError when a file given cannot be read)."""
        if isinstance(self.kernel, KernelSource):
            return self.kernel.code
        try:
            return self.kernel.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise KernelFileError(f"cannot read the kernel file {self.kernel}: {exc}") from None


def _new_eval_id(task: Task) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{task.task_id}-{uuid.uuid4().hex[:6]}"


def evaluate(request: EvalRequest, settings: Settings, *, eval_id: str | None = None,
             on_stage: Callable[[str], None] | None = None, spares: SparePool | None = None,
             ir_gate: IrGate | None = None) -> EvalResult:
    """Evaluate one candidate. Raises TaskError / KernelFileError / UnknownTarget for bad input.

    With `ir_gate`, the child stops after lowering when the gate says the program was evaluated already
    (verdict `duplicate`), before the expensive stages."""
    started = time.perf_counter()
    task = request.loaded_task()
    chip = get_chip(request.target)
    host: Host = "tpu" if settings.on_chip(chip.name) else "cpu"
    source = request.source()
    settings.ensure_dirs()
    eval_id = eval_id or _new_eval_id(task)
    artifacts = settings.artifacts_dir / eval_id
    artifacts.mkdir(parents=True, exist_ok=True)
    kernel_file = artifacts / "candidate.py"  # the candidate's one file: what its child reads, kept as an artifact
    kernel_file.write_text(source)
    artifact_map = {"candidate": str(kernel_file)}
    allow_pure_jax = request.allow_pure_jax or task.allow_pure_jax

    try:
        check_source(source, expected_params=task.param_count, allow_pure_jax=allow_pure_jax,
                     filename=str(kernel_file))
        if on_stage:
            on_stage("static")
    except StaticViolation as violation:
        result = failure(task=task.task_id, target=chip.name, host=host, stage="static", error=violation.error)
        return _finish(result, artifacts, artifact_map, started)

    pool = spares or SparePool(root=settings.sandbox_dir, limits=settings.limits, keep=0)
    try:
        run = _Evaluation(request, settings, task, chip, host, artifacts, kernel_file, pool, on_stage, ir_gate,
                          allow_pure_jax)
        result = run.result()
    finally:
        if spares is None:
            pool.close()
    artifact_map.update(run.artifact_map)
    return _finish(result, artifacts, artifact_map, started)


class _Evaluation:
    def __init__(self, request: EvalRequest, settings: Settings, task: Task, chip: ChipSpec, host: Host,
                 artifacts: Path, kernel_file: Path, pool: SparePool, on_stage: Callable[[str], None] | None,
                 ir_gate: IrGate | None, allow_pure_jax: bool):
        self.request, self.settings, self.task, self.chip, self.host = request, settings, task, chip, host
        self.artifacts, self.kernel_file, self.pool, self.on_stage = artifacts, kernel_file, pool, on_stage
        self.ir_gate, self.allow_pure_jax = ir_gate, allow_pure_jax
        self.workdir = artifacts / "work"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.compilers = pool.compilers(settings.static_profile)
        self.store = reference_store(settings, chip)
        self.timings: dict[str, float] = {}
        self.notes: list[str] = []
        self.artifact_map: dict[str, str] = {}
        self.output_baseline: float | None = None  # the task's own outputs' magnitude at the production shapes

    def stage(self, name: str) -> None:
        if self.on_stage:
            self.on_stage(name)

    def _fail(self, stage: Stage, error: EvalError, verdict: Verdict | None = None, **extra: Any) -> EvalResult:
        return failure(task=self.task.task_id, target=self.chip.name, host=self.host, stage=stage,
                       error=error, verdict=verdict, notes=self.notes, timings=self.timings, **extra)

    # -- the candidate's child --------------------------------------------------------------------------------
    def run_candidate(self, compiles: CandidateCompiles) -> tuple[ChildOutcome, CandidateReport | None]:
        limits = self.settings.limits
        task_values = self._copied_task_values()
        request = CandidateRequest(
            task_dir=str(self.task.path), kernel_path=str(self.kernel_file), target=self.chip.name, host=self.host,
            allow_pure_jax=self.allow_pure_jax, artifacts_dir=str(self.artifacts), workdir=str(self.workdir),
            budget=interpret_budget(limits),
            measure=self.request.measure, ir_gate=self.ir_gate is not None, task_values=task_values)
        try:
            outcome, report = run_candidate(request, pool=self.pool, limits=limits, compiles=compiles,
                                            private=(self.settings.home, self.settings.cache_dir),
                                            ir_gate=self.ir_gate, on_stage=self.stage)
        finally:  # the cache keeps them; the artifacts need not
            for name in task_values.values():
                for file in (self.workdir / name, (self.workdir / name).with_suffix(".json")):
                    file.unlink(missing_ok=True)
        if (self.workdir / "stderr.txt").exists():
            self.artifact_map["log"] = str(self.workdir / "stderr.txt")
        self.timings["child_wall"] = outcome.wall_seconds
        self.timings["peak_rss_mib"] = outcome.peak_rss_mib
        return outcome, report

    def _copied_task_values(self) -> dict[str, str]:
        """The task's own production values, where the reference's child kept them with outputs made already,
        copied into the candidate's work directory (which its child may read, unlike the cache): the child reads
        them rather than running get_inputs() again, which took 17-37 s on a chip for the attention and
        convolution workloads. File names there, by `values_from`."""
        copied: dict[str, str] = {}
        for job in self.store.production_jobs(self.task):
            if job.values_from is None:
                continue
            name = f"task_values.{job.values_from.replace(':', '-')}.npz"
            if self.store.copy_task_values(job, self.workdir / name):
                copied[job.values_from] = name
        return copied

    # -- the whole evaluation -------------------------------------------------------------------------------
    def result(self) -> EvalResult:
        task, chip, settings = self.task, self.chip, self.settings
        self.compilers.warm(chip.name)
        t0 = time.perf_counter()
        production_json, _ = self.store.programs(task)  # the reference's child, once per task version
        self.timings["reference_programs"] = time.perf_counter() - t0
        compiles = CandidateCompiles(self.compilers, chip, self.workdir, self.artifacts)
        outcome, report = self.run_candidate(compiles)
        if report is not None and report.task_error:
            raise TaskError(report.task_error)
        if report is not None and report.chip_busy:
            raise ChipBusy(report.chip_busy)
        if report is None and not (outcome.stopped or compiles.failed):
            limits = with_chip_memory(settings.limits) if self.host == "tpu" else settings.limits
            stage, error = stopped_error(outcome, limits.wall_seconds, limits.memory_mib)
            if (stopped := self._reference_stopped(stage)) is not None:
                return self._fail(stage, task_beyond_limits(error, stopped), "unverified")
            verdict: Verdict = "timeout" if error.kind == "timeout" else "crashed"
            return self._fail(stage, error, verdict)
        if report is not None:
            self.timings.update(report.timings)
            self.notes.extend(report.notes)
            if report.error is not None:
                stage = report.stage if report.stage != "load" else "lower"  # a child fails from lowering on
                return self._fail(stage, report.error, report.verdict, ir_hash=report.ir_hash)
        answers = compiles.wait()
        self.timings["compile"] = compiles.seconds
        self._keep_ir()
        ir_hash = report.ir_hash if report else None
        for answer in answers:
            if not answer.ok:
                assert answer.error is not None
                return self._fail("compile", self._with_line(answer.error, report), ir_hash=ir_hash)
        assert report is not None
        if "unconfined" in report.sandbox:
            self.notes.append(f"sandbox: {report.sandbox}")
        if [p.config for p in report.programs] != production_json:
            return self._fail("static", EvalError("harness_tamper", "the candidate's process reported production "
                              "shapes other than the task's"), "rejected", ir_hash=ir_hash)
        prod = [config_from_json(c) for c in production_json]
        self.stage("reference")
        t0 = time.perf_counter()
        ref_costs = self.store.costs(task, target=chip.name, mode=settings.static_profile, compilers=self.compilers)
        self.timings["reference"] = time.perf_counter() - t0
        self.stage("correctness")
        t0 = time.perf_counter()
        try:
            correctness = self.judge(report)
        except ReferenceStopped as stopped:  # the kernel ran; what it is judged against cannot be computed here
            return self._fail("correctness", reference_beyond_host(stopped), "unverified", ir_hash=ir_hash)
        except CandidateFailed as failed:
            if failed.error.kind == "harness_tamper":
                return self._fail("correctness", failed.error, "rejected", ir_hash=ir_hash)
            if checker_ran_out(failed.error, self.host):
                return self._fail("correctness", self._checker_limit(failed.error), "unverified", ir_hash=ir_hash)
            return self._fail("correctness", failed.error, ir_hash=ir_hash)
        except DerivedShapesOnly as derived:
            return self._fail("correctness", self._derived_only(derived), "unverified", ir_hash=ir_hash)
        self.timings["judge"] = time.perf_counter() - t0
        programs = [CandidateProgram(a, traffic_from_json(p.traffic), p.vmem_limits, ir_hash)
                    for a, p in zip(answers, report.programs, strict=True)]
        self.stage("performance")
        estimate, estimated_profile, estimate_notes = estimated_performance(
            chip, settings.static_profile, prod, programs, ref_costs, self.store.used_inputs(task))
        estimate.detail["notes"] = estimate_notes
        self.notes.extend(estimate_notes)
        if report.measured is not None:
            if report.measured.mismatches:
                first = report.measured.mismatches[0]
                return self._fail("performance", EvalError("mismatch_while_timing", "outputs produced while timing "
                                  f"differ from the reference's on the same inputs: {first}"),
                                  "incorrect", correctness=correctness, ir_hash=ir_hash)
            try:
                refused = self._judge_kept(report.measured.kept, production_json[0])
            except CandidateFailed as failed:  # a file named outside its outputs
                return self._fail("performance", failed.error, "rejected", ir_hash=ir_hash)
            if refused is not None:
                return self._fail("performance", refused, "incorrect", correctness=correctness, ir_hash=ir_hash)
            perf, profile = measured_performance(chip, prod, programs, ref_costs, report.measured,
                                                 self.store.used_inputs(task), estimate=estimate)
            self._keep_trace()
            if not report.measured.on_device:
                self.notes.append(f"measured on {perf.detail['device']}, not on a {chip.name}: the times are not "
                                  "TPU times")
        else:
            perf, profile = estimate, estimated_profile
        self.stage("profile")
        profile["summary"] = summarise(profile)
        return self._verdict(correctness, perf, profile, ir_hash)

    def _reference_stopped(self, stage: Stage) -> ReferenceStopped | None:
        """Whether the task's own reference stops at this host's limits at the production shapes, asked when a
        candidate's child stopped while running them on the chip (its outputs are computed now if they were not)."""
        if self.host != "tpu" or stage not in ("correctness", "performance"):
            return None
        try:
            self.store.outputs(self.task, self.store.production_jobs(self.task))
        except ReferenceStopped as stopped:
            return stopped
        return None

    def _checker_limit(self, error: EvalError) -> EvalError:
        """Memory the checking machine ran out of, said as that and what would check the kernel instead."""
        return EvalError(error.kind, f"the checking machine ran out of memory running the kernel ({self.host}, "
                         f"{self.settings.limits.memory_mib} MiB per evaluation), which says nothing of the kernel on "
                         f"a {self.chip.name}'s HBM: {error.detail}\nWhat checks it: a TPU runner of {self.chip.name}, "
                         "or here with KERNELBOT_EVAL_MEMORY_MIB raised", error.line, "correctness")

    def _derived_only(self, derived: DerivedShapesOnly) -> EvalError:
        """The failure at derived shapes, said as what it is and what would decide it."""
        where = f"on a TPU runner of {self.chip.name} (there the production shapes are checked)"
        return EvalError(derived.error.kind, f"differs from the reference only at shapes derived from the production "
                         f"ones, which the kernel may not be written for: specialised to its production shape, or "
                         f"wrong - this check cannot tell. {derived.error.detail}\nWhat decides it: a check at the "
                         f"production shapes, {where}, or here with KERNELBOT_FULL_CHECK_ELEMENTS and "
                         f"KERNELBOT_FULL_CHECK_GFLOPS raised above them ({derived.why})", derived.error.line,
                         "correctness")

    def _with_line(self, error: EvalError, report: CandidateReport | None) -> EvalError:
        """A compiler error names no Python line; with one kernel, its definition is the place to look."""
        kernels = [k for p in (report.programs if report else []) for k in p.kernels]
        if error.line is None and len({tuple(k) for k in kernels}) == 1:
            name, line = kernels[0]
            return EvalError(error.kind, f"{error.detail}\n(in kernel {name}, defined at line {line})", line,
                             error.stage)
        return error

    def _keep_trace(self) -> None:
        """The profiler's trace of the timed calls (Perfetto opens it), kept as the profile's artifact."""
        traces = sorted((self.artifacts / "trace").glob("**/*.trace.json.gz"))
        if traces:
            self.artifact_map["trace"] = str(traces[-1])

    def _keep_ir(self) -> None:
        for ir in sorted(self.artifacts.glob("candidate.config*.stablehlo.mlir")):
            self.artifact_map[ir.stem.replace(".", "_")] = str(ir)
        if (self.artifacts / "llo").is_dir():
            self.artifact_map["static_profiles"] = str(self.artifacts / "llo")

    # -- correctness ------------------------------------------------------------------------------------------
    def judge(self, report: CandidateReport) -> Correctness:
        jobs = []
        for check in report.checks:
            jobs.append(OutputJob(output_key(self.task, check.config, check.values_from, self.store.numerics),
                                  check.config,
                                  check.values_from, [c.case for c in check.cases]))
        reference = self.store.outputs(self.task, [j for j in jobs if j.cases]) if any(j.cases for j in jobs) else {}
        cases: list[CorrectnessCase] = []
        notes = list(self.notes)
        differs: list[str] = []
        by_name = {c.name: c for c in EVALUATOR_CASES}
        outputs = self.workdir / "outputs"
        for index, (check, job) in enumerate(zip(report.checks, jobs, strict=True)):
            config = config_from_json(check.config)
            atol, rtol = self.task.tolerance(self._config_index(check, index))
            judge = Judge(check.name, config, atol, rtol)
            notes.append(check.why)
            self.notes.append(check.why)
            if check.differs:
                differs.append(f"{check.name}: " + "; ".join(check.differs))
            try:
                cases.extend(self._judge_check(judge, check, job, reference, by_name, outputs))
                if check.name.startswith("production") and self.output_baseline is None:
                    self.output_baseline = judge.baseline_scale  # what the timing's outputs are scaled against
            except CandidateFailed as failed:
                if check.name.startswith("derived"):
                    raise DerivedShapesOnly(failed.error, check.why) from None
                raise
        passed = [c for c in cases if c.status == "passed"]
        if differs:
            notes.append("the program checked is not the program timed (" + " | ".join(differs) + ")")
        if not passed:
            skipped = list(dict.fromkeys(c.note for c in cases if c.status == "skipped" and c.note))
            return Correctness(status="not_checked", cases=cases, notes=notes + skipped)
        status: Literal["passed", "not_checked"] = "passed" if not differs else "not_checked"
        return Correctness(status=status, cases=cases, max_abs_err=max(c.max_abs_err or 0.0 for c in passed),
                           max_rel_err=max(c.max_rel_err or 0.0 for c in passed), notes=notes)

    def _judge_check(self, judge: Judge, check: CheckReport, job: OutputJob,
                     reference: dict[str, dict[str, dict[str, Path | None]]], by_name: dict[str, Any],
                     outputs: Path) -> list[CorrectnessCase]:
        """One check configuration's cases, judged in order (CandidateFailed at the first failure)."""
        cases: list[CorrectnessCase] = []
        for out in check.cases:
            files = reference[job.key][out.case]
            expected, truth = files["expected"], files.get("truth")
            assert expected is not None

            ref = ReferenceRun(by_name[out.case], load_outputs(expected), load_outputs(truth) if truth else None,
                               perturbed=partial(self._float64, job, out.case, "perturbed"),
                               later=partial(self._float64, job, out.case, "truth") if "truth" not in files else None)
            cand = CandidateRun(by_name[out.case])
            if out.error:
                cand.error = replace(out.error, stage="correctness")
            else:
                assert out.outputs is not None
                cand.outputs = load_outputs(_child_file(outputs, out.outputs))
                cand.again = load_outputs(_child_file(outputs, out.again)) if out.again else None
            cases.append(judge.case(cand, ref))
        return cases

    def _float64(self, job: OutputJob, case: str, part: str) -> OutputSet:
        """A float64 run of the reference the judge asks for (made once, then kept with the outputs)."""
        path, why = self.store.float64(self.task, job, case, part)
        return load_outputs(path) if path else OutputSet("", (), why)  # no leaves: the judge says why

    def _judge_kept(self, kept: list[KeptDifference], config: dict[str, Any]) -> EvalError | None:
        """Outputs that differed in values while timing, judged as the correctness cases are: against a float64 run
        of the reference on the same timing inputs (its own child, with this host's memory for a reference), then
        the task's sensitivity. The first refused is the error; the accepted ones are said in the notes."""
        if not kept:
            return None
        atol, rtol = self.task.tolerance(0)
        job = OutputJob(output_key(self.task, config, None, self.store.numerics), config, None, [k.case for k in kept])
        outputs = self.workdir / "outputs"
        for diff in kept:
            expected = load_outputs(_child_file(outputs, diff.reference))
            # The timing's inputs are drawn unscaled, as the "normal" case's are: atol scaled as for that case.
            comparison, note = judged(load_outputs(_child_file(outputs, diff.candidate)), expected,
                                      scaled_atol(atol, output_scale(expected), self.output_baseline), rtol,
                                      partial(self._float64, job, diff.case, "truth"),
                                      partial(self._float64, job, diff.case, "perturbed"))
            if not comparison.ok and comparison.error is not None:
                return EvalError("mismatch_while_timing", "outputs produced while timing differ from the reference's "
                                 f"on the same inputs: iteration {diff.iterations[0]}: {comparison.error.kind}: "
                                 f"{comparison.error.detail}")
            self.notes.append(accepted_while_timing(diff.iterations[0], note))
        return None

    @staticmethod
    def _config_index(check: CheckReport, index: int) -> int:
        inside = check.name.partition("[")[2].rstrip("]")
        return int(inside) if inside.isdigit() else index

    # -- the verdict ----------------------------------------------------------------------------------------
    def _verdict(self, correctness: Correctness, perf: Any, profile: dict[str, Any], ir_hash: str | None) -> EvalResult:
        chip = self.chip
        reasons = []
        if correctness.status != "passed":
            reasons.append("correctness was not established: " + "; ".join(correctness.notes)[-600:])
        physics = [f for f in perf.flags if f.startswith("faster_than_physics")]
        if physics:
            reasons.append("the estimate is faster than physics allows (" + physics[0].split(": ", 1)[-1] + "), so "
                           "the figure cannot be trusted")
        verdict: Verdict = "unverified" if reasons else "ok"
        message = f"{verdict}: {headline(perf, chip.name)}"
        if reasons:
            message += "; " + "; ".join(reasons)[:500]
        if perf.flags:
            message += f"; flagged: {', '.join(f.split(':')[0] for f in perf.flags)}"
        return EvalResult(task=self.task.task_id, target=chip.name, host=self.host, verdict=verdict,
                          stage="done", message=message, correctness=correctness, performance=perf, profile=profile,
                          notes=self.notes, timings=self.timings, ir_hash=ir_hash)


def _child_file(outputs: Path, name: str) -> Path:
    """A file the candidate's child says it wrote: a plain name in its outputs directory, never a path elsewhere
    (the report is the candidate's process's word)."""
    if not name or Path(name).name != name or name in (".", ".."):
        raise CandidateFailed(EvalError("harness_tamper", "the candidate's process named an output file outside its "
                                        f"outputs directory: {name[:80]!r}"))
    return outputs / name


def task_beyond_limits(error: EvalError, stopped: ReferenceStopped) -> EvalError:
    """A candidate stopped where the task's own reference stops too: said as the task's size on this host, which
    says nothing of the kernel."""
    return EvalError(error.kind, f"{error.detail}; the task's own reference stops at this host's limits too "
                     f"({stopped}), so this says nothing of the kernel.\nWhat decides it: the evaluation again with "
                     f"the limit raised (KERNELBOT_EVAL_MEMORY_MIB, KERNELBOT_EVAL_TIMEOUT)", error.line, error.stage)


def reference_beyond_host(stopped: ReferenceStopped) -> EvalError:
    """A candidate that ran at its check shapes where the task's own reference cannot compute the outputs to judge
    it by (more device memory than the chip has, or this host's limits): not checked, and not the kernel's fault."""
    return EvalError(stopped.kind, f"the kernel ran at the shapes checked, but the task's own reference cannot "
                     f"compute its outputs there ({stopped}), so the kernel was not checked.\nWhat decides it: "
                     f"{stopped.next_step}", None, "correctness")


def checker_ran_out(error: EvalError, host: str) -> bool:
    """A kernel out of memory where it is checked off the chip: the checker's limit, not the kernel's fault."""
    return error.kind == "hbm_oom" and host != "tpu"


def headline(perf: Any, target: str) -> str:
    """'x1.32 vs reference (measured on TPU v5 lite: 0.8 ms vs 1.06 ms, 40 iterations, ±2%; estimated x1.10), 64%
    of roofline', or for an estimate 'x1.10 vs reference (estimated: ... on v5e; likely x0.9-x1.4), ...'."""
    likely = band_text(perf)
    if perf.method == "measured":
        how = (f"measured on {perf.detail.get('device', target)}: {perf.candidate:.4g} ms vs {perf.reference:.4g} ms, "
               f"{perf.detail.get('iterations', 0)} iterations{', ' + likely if likely else ''}")
        estimate = perf.detail.get("estimate")
        if estimate:
            how += f"; estimated x{estimate['speedup']:.2f}"
    else:
        how = f"estimated: {perf.candidate:.4g} ms vs {perf.reference:.4g} ms on {target}"
        how += f"; {likely}" if likely else ""
    return f"x{perf.speedup:.2f} vs reference ({how}), {perf.roofline_fraction or 0:.0%} of roofline"


def _finish(result: EvalResult, artifacts: Path, artifact_map: dict[str, str], started: float) -> EvalResult:
    import jax  # loaded by every evaluation already

    result.jax_version = jax.__version__
    if result.profile:
        (artifacts / "profile.txt").write_text(result.profile["summary"] + "\n")
        artifact_map["profile_summary"] = str(artifacts / "profile.txt")
        method = result.profile["method"]
        chart = render_profile_chart(result.profile, artifacts / "profile.png",
                                     title=f"{result.task} on {result.target} ({method})")
        artifact_map["profile_chart"] = str(chart)
        # The same profile op by op for Perfetto's UI (ui.perfetto.dev) or chrome://tracing.
        (artifacts / "profile.trace.json").write_bytes(trace_json(result.profile, task=result.task,
                                                                 target=result.target))
        artifact_map["profile_trace"] = str(artifacts / "profile.trace.json")
    result.artifacts = {**artifact_map, "result": str(artifacts / "result.json")}
    total = time.perf_counter() - started
    stage_seconds = sum(v for k, v in result.timings.items() if k in ("lower", "compile", "reference",
                                                                      "correctness", "performance", "profile"))
    result.timings["total"] = total
    result.timings["overhead"] = max(0.0, total - stage_seconds)
    (artifacts / "result.json").write_text(json.dumps(result.to_json(), indent=1, default=float))
    return result


def interpret_budget(limits: EvalLimits) -> Budget:
    """What a check in interpret mode may afford at production shapes, from the evaluation's limits."""
    return Budget(limits.full_check_elements, limits.full_check_gflops * 1e9, limits.interpret_grid_steps)


def describe_tasks(requests: list[EvalRequest], settings: Settings) -> dict[str, str]:
    """Every task's reference described at once, in one child, before the evaluations start (each would start
    its own otherwise), then their production outputs at once, in one more child: on this host's TPU all of them
    (one opening of the chip), elsewhere those checked in interpret mode. Returns why a task's could not be made
    ahead, by task id; its evaluation tries again and reports."""
    tasks: dict[str, Task] = {}
    for req in requests:
        try:
            task = req.loaded_task()
        except TaskError:
            continue
        tasks.setdefault(task.digest, task)
    failed: dict[str, str] = {}
    try:
        failed.update({t: str(e) for t, e in reference_store(settings).prefetch(list(tasks.values())).items()})
    except TaskError as exc:
        failed["all"] = str(exc)
    for target in sorted({r.target for r in requests}):
        # Elsewhere, those a check in interpret mode runs at the production shapes for (most test-sized tasks):
        # made ahead, the candidates' children read the task's values instead of each calling get_inputs().
        budget = None if settings.on_chip(target) else interpret_budget(settings.limits)
        try:
            failed.update(reference_store(settings, get_chip(target)).prefetch_outputs(list(tasks.values()), budget))
        except UnknownTarget:
            continue  # the evaluations for it say so, one by one
        except TaskError as exc:
            failed["all"] = str(exc)
    return failed


def _with_task_loaded(request: EvalRequest) -> EvalRequest:
    """The request with its task loaded; as it was when the task is broken (its evaluation reports that)."""
    try:
        return replace(request, task=request.loaded_task())
    except TaskError:
        return request


def evaluate_many(requests: Iterable[EvalRequest], settings: Settings, *, workers: int | None = None,
                  warm_spares: bool = True, described: bool = False,
                  on_done: Callable[[EvalRequest, EvalResult | Exception], None] | None = None
                  ) -> list[EvalResult | Exception]:
    """Evaluate candidates in parallel, one sandboxed child each, up to `workers` at a time.

    With `warm_spares`, the next children are started while earlier ones run, so an evaluation does not wait
    for Python and JAX to start (each child still serves one candidate). `described`: the caller ran
    `describe_tasks` for these requests already."""
    items = list(requests)
    loaded = [_with_task_loaded(req) for req in items]  # each task read once, for describing and evaluating
    workers = workers or settings.eval_workers
    if not described:
        describe_tasks(loaded, settings)
    spares = SparePool(root=settings.sandbox_dir, limits=settings.limits, keep=0)  # set per evaluation below
    waiting = [len(items)]
    lock = threading.Lock()

    def one(req: EvalRequest, ready: EvalRequest) -> EvalResult | Exception:
        with lock:  # no more spares than evaluations still to start: unused ones are wasted start-ups
            waiting[0] -= 1
            spares.keep = min(workers, waiting[0]) if warm_spares else 0
        try:
            outcome: EvalResult | Exception = evaluate(ready, settings, spares=spares)
        except Exception as exc:  # noqa: BLE001 - one candidate's failure is its outcome; the others go on
            outcome = exc
        if on_done:
            on_done(req, outcome)
        return outcome

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(one, items, loaded))
    finally:
        spares.close()

