"""What the evaluator knows of a task's reference, computed in the reference's child and cached on disk.

- its production configurations and exported programs (`programs`), once per task version and JAX version;
- the compiler's figures for those programs (`costs`), once per target and profile mode;
- its outputs on evaluator-owned inputs (`outputs`), once per configuration and case.
Caches live under the runner's cache directory, which a candidate's sandbox cannot write (Landlock), so a
candidate cannot plant the answer it is compared with. Concurrent evaluations of one task in this process wait
for each other rather than running the reference twice; files appear by rename, so other processes see whole
entries or none.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
import uuid
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import jax

from storage.settings import EvalLimits, Settings
from tpu_runner.compiler import CompileAnswer, CompileService
from tpu_runner.hardware import ChipBusy, ChipSpec, runtime_files, with_chip_memory
from tpu_runner.reports import Budget, ExportedTask, OutputJob, ReferenceReport, ReferenceRequest, write_json
from tpu_runner.sandbox import ChildOutcome, child_environment, run_child, untrusted_reads
from tpu_runner.tasks import DRAW, EVALUATOR_CASES, Configuration, Task, TaskError, config_from_json

NUMERICS = "tpu-default-v2"  # how the reference's outputs are computed (numerics.as_on_tpu); part of every key
LAYOUT = "v4"  # of the programs' cache entries (v4: float inputs say whether they are nonnegative)
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock(key: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def numerics_on(device_kind: str | None) -> str:
    """How the reference's outputs are computed: on a chip of `device_kind` itself, or as on a TPU (None)."""
    return f"device:{device_kind}" if device_kind else NUMERICS


def output_key(task: Task, config: dict[str, Any], values_from: str | None, numerics: str = NUMERICS) -> str:
    text = json.dumps([task.digest, config, values_from, numerics, DRAW, jax.__version__], sort_keys=True)
    return f"{task.task_id}-{hashlib.sha256(text.encode()).hexdigest()[:20]}"


class ReferenceStopped(TaskError):
    """The reference's child stopped at a limit of this host (memory or time) while computing a task's outputs:
    a fact of the task on this host, kept so that a candidate's failure at the same limit is not blamed on it."""

    next_step = ("raise the limit the message names (KERNELBOT_EVAL_MEMORY_MIB or KERNELBOT_EVAL_TIMEOUT), or "
                 "evaluate the task on a host with more memory")

    def __init__(self, why: str, kind: str = "memory_limit"):
        super().__init__(why, next_step=OUT_OF_DEVICE_MEMORY if kind == "hbm_oom" else "")
        self.kind = kind


OUT_OF_DEVICE_MEMORY = ("evaluate the task on a TPU with more HBM, or give it production shapes this one holds (a "
                        "reference that materialises less: XLA's own error says how much it needed)")


def _out_of_device_memory(task: Task, why: str) -> ReferenceStopped:
    return ReferenceStopped(f"the reference of task {task.task_id} does not fit this device's memory at its "
                            f"production shapes: {why}", "hbm_oom")


def _stopped(outcome: ChildOutcome, task: Task, limits: EvalLimits) -> TaskError:
    stop = outcome.why_stopped(wall_seconds=limits.wall_seconds, memory_mib=limits.memory_mib)
    if stop.kind == "timeout":
        return ReferenceStopped(f"the reference of task {task.task_id} {stop.how} ({stop.doing}); "
                                "raise KERNELBOT_EVAL_TIMEOUT or make its check shapes smaller", stop.kind)
    if stop.kind == "memory_limit":
        return ReferenceStopped(f"the reference of task {task.task_id} {stop.how} ({stop.doing}); raise "
                                "KERNELBOT_EVAL_MEMORY_MIB to evaluate it", stop.kind)
    return TaskError(f"the reference's process of task {task.task_id} {stop.how} ({stop.doing}) without a "
                     "result:\n" + stop.tail[-1500:])


def _task_at(stage: str | None, tasks: list[Task]) -> Task:
    """The task a reference child was working on, read from its stage ('reference outputs <task id>-<key>')."""
    return next((t for t in tasks if stage and f" {t.task_id}-" in stage), tasks[0])


class ReferenceStore:
    """The reference's data for the tasks evaluated here. With `device_kind` (this host's TPU, when candidates are
    checked on it), outputs are computed on that chip; otherwise as XLA computes them on a TPU, on the CPU."""

    def __init__(self, *, cache_dir: Path, sandbox_dir: Path, limits: EvalLimits, device_kind: str | None = None):
        self.cache_dir, self.sandbox_dir, self.limits = cache_dir, sandbox_dir, limits
        self.device_kind = device_kind
        self.numerics = numerics_on(device_kind)

    def _dir(self, task: Task) -> Path:
        return self.cache_dir / "reference" / f"{task.task_id}-{task.digest}-jax{jax.__version__}-{LAYOUT}"

    def _run(self, tasks: list[Task], *, export: bool, jobs: list[OutputJob], strict: bool = True,
             cpu_only: bool = False, interpret_budget: Budget | None = None) -> tuple[ReferenceReport, Path]:
        """The reference's child on `tasks`; with `strict`, a task error of its outputs is raised. Output jobs run
        on this host's chip when the store has one, unless `cpu_only` (float64 work), and a float64 job runs on the
        task's values kept with its outputs (copied into the child's directory: the cache is private to it)."""
        scratch = self.sandbox_dir / f"reference-{uuid.uuid4().hex[:10]}"
        scratch.mkdir(parents=True)
        for job in jobs:
            if job.float64 and self.copy_task_values(job, scratch / f"values.{job.key}.npz"):
                job.values_file = str(scratch / f"values.{job.key}.npz")
        on_chip = bool(jobs) and self.device_kind is not None and not cpu_only
        request = ReferenceRequest(task_dirs=[str(t.path) for t in tasks], out_dir=str(scratch / "out"),
                                   export=export, outputs=jobs, on_chip=on_chip,
                                   truth_gflops=self.limits.full_check_gflops, interpret_budget=interpret_budget)
        write_json(scratch / "request.json", request)
        env = child_environment(workdir=scratch, llo_dump_dir=None, on_tpu=on_chip, target_accelerator="v6e-1")
        # On the chip one child computes the production outputs of every task asked for: a wall limit each.
        if on_chip:
            limits = replace(with_chip_memory(self.limits), wall_seconds=self.limits.wall_seconds * len(tasks))
        elif cpu_only and self.device_kind is not None:
            # The float64 truth of a chip host's checks, which are at production shapes (as large as the chip's
            # memory holds): the memory a chip's child gets. At the evaluation's own limit, 15p's was never made.
            limits = with_chip_memory(self.limits)
        else:
            limits = self.limits
        outcome = run_child(module="tpu_runner.reference.child", args=[str(scratch / "request.json")],
                            workdir=scratch, env=env, limits=limits, writable=runtime_files() if on_chip else (),
                            reads=untrusted_reads(*(t.path for t in tasks),
                                                  private=(self.cache_dir, self.sandbox_dir.parent)))
        path = scratch / "reference_report.json"
        if outcome.returncode != 0 or not path.is_file() or outcome.timed_out or outcome.memory_exceeded:
            report = ReferenceReport.read(path) if path.is_file() else ReferenceReport()  # what it finished is kept
            pending = [t for t in tasks if str(t.path) not in report.finished and str(t.path) not in
                       report.output_errors]
            at = _task_at(outcome.stage, pending or tasks)
            error = _stopped(outcome, at, limits)
            if isinstance(error, ReferenceStopped) and jobs:
                self._remember_stop(at, error)
            if strict:
                shutil.rmtree(scratch, ignore_errors=True)
                raise error
            report.output_errors[str(at.path)] = str(error)  # the tasks after it were not reached: not failed
            return report, scratch
        report = ReferenceReport.read(path)
        if report.chip_busy:
            shutil.rmtree(scratch, ignore_errors=True)
            raise ChipBusy(report.chip_busy)
        stops: list[ReferenceStopped] = []
        for task in tasks:
            where = str(task.path)
            if where in report.out_of_memory:
                stops.append(_out_of_device_memory(task, report.output_errors[where]))
                self._remember_stop(task, stops[-1])
                report.output_errors[where] = str(stops[-1])
        if report.task_error and strict:
            shutil.rmtree(scratch, ignore_errors=True)
            raise stops[0] if stops else TaskError(report.task_error)
        return report, scratch

    # -- programs -----------------------------------------------------------------------------------------------
    def programs(self, task: Task) -> tuple[list[dict[str, Any]], list[Path]]:
        """The production configurations (as JSON) and the reference's exported program for each."""
        data = self._index(task)
        return data["production"], [self._dir(task) / name for name in data["programs"]]

    def used_inputs(self, task: Task) -> list[list[float]]:
        """Per production configuration and input, the fraction of it the reference's outputs can depend on
        (0: not read at all)."""
        return self._index(task)["used_inputs"]

    def prefetch(self, tasks: list[Task]) -> dict[str, TaskError]:
        """Describe every task not cached yet in one reference child (one start-up of Python and JAX for all);
        returns the tasks that failed, by task id, with why."""
        missing = [t for t in tasks if not (self._dir(t) / "programs.json").is_file()]
        if not missing:
            return {}
        report, scratch = self._run(missing, export=True, jobs=[])
        failed = {}
        try:
            for i, task in enumerate(missing):
                described = report.exported.get(str(task.path),
                                                ExportedTask(task_error="the reference's child said nothing"))
                if described.task_error:
                    failed[task.task_id] = TaskError(described.task_error)
                    continue
                self._install(task, described, scratch / "out" / str(i))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return failed

    def _install(self, task: Task, described: ExportedTask, files: Path) -> None:
        root = self._dir(task)
        staging = root.with_name(root.name + f".{uuid.uuid4().hex[:6]}")
        staging.mkdir(parents=True)
        for name in described.programs:
            shutil.move(files / name, staging / name)
        (staging / "programs.json").write_text(json.dumps({"production": described.production, "programs":
                                                           described.programs, "used_inputs": described.used_inputs}))
        if root.exists():
            shutil.rmtree(staging, ignore_errors=True)
        else:
            staging.rename(root)

    def _index(self, task: Task) -> dict[str, Any]:
        root = self._dir(task)
        index = root / "programs.json"
        with _lock(str(root)):
            if not index.is_file():
                failed = self.prefetch([task])
                if task.task_id in failed:
                    raise failed[task.task_id]
            return json.loads(index.read_text())

    # -- compiler figures ---------------------------------------------------------------------------------------
    def costs(self, task: Task, *, target: str, mode: str, compilers: CompileService,
              profile: bool = True) -> list[CompileAnswer]:
        """The compiler's figures for the reference's programs; with `profile`, its static cycle profile too.

        Where no profile can be had (`KERNELBOT_STATIC_PROFILE=off`, or a libtpu without the profiler), the
        program is the plain compile the unprofiled figures are: one compile and one cache file serve both, the
        answers saying why they have no cycles."""
        _, programs = self.programs(task)
        profiled = profile and compilers.no_profile is None
        path = self._dir(task) / f"costs4-{target}-{mode if profiled else 'unprofiled'}.json"
        answers = self._compiled_costs(task, programs, path, target, compilers, profiled)
        if profile and not profiled:
            return [replace(a, profile_failure=compilers.no_profile) for a in answers]
        return answers

    def _compiled_costs(self, task: Task, programs: list[Path], path: Path, target: str,
                        compilers: CompileService, profile: bool) -> list[CompileAnswer]:
        with _lock(str(path)):
            if path.is_file():
                return [CompileAnswer.from_json(a) for a in json.loads(path.read_text())]
            answers = []
            for program in programs:
                answer = compilers.compile(program, target=target, profile=profile)
                if not answer.ok:
                    assert answer.error is not None
                    raise TaskError(f"the reference of task {task.task_id} does not compile for {target} "
                                    f"({answer.error.kind}), so no candidate can be compared with it on this target:\n"
                                    f"{answer.error.detail[:2000]}")
                answers.append(answer)
            tmp = path.with_suffix(f".{uuid.uuid4().hex[:6]}.tmp")
            tmp.write_text(json.dumps([{**asdict(a), "error": None} for a in answers]))
            tmp.replace(path)
        return answers

    # -- outputs --------------------------------------------------------------------------------------------------
    def outputs(self, task: Task, jobs: list[OutputJob]) -> dict[str, dict[str, dict[str, Path | None]]]:
        """key -> case -> {"expected", "truth", "perturbed"} files, computing what is not cached yet in one
        reference run."""
        root = self.cache_dir / "reference_outputs"
        root.mkdir(parents=True, exist_ok=True)
        with _lock(f"outputs-{task.task_id}-{task.digest}"):
            missing = [job for job in jobs if not (root / f"{job.key}.json").is_file()]
            if missing and (stopped := self.reference_stopped(task)) is not None:
                raise stopped
            if missing:
                report, scratch = self._run([task], export=False, jobs=missing)
                try:
                    self._keep_outputs(report, scratch, missing)
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)
        return self._found(jobs)

    def production_jobs(self, task: Task) -> list[OutputJob]:
        """The jobs for the reference's outputs at every production configuration, every case: what a check on the
        chip asks for (the production shapes are checked there)."""
        production, _ = self.programs(task)
        return [OutputJob(output_key(task, config, f"production:{i}", self.numerics), config, f"production:{i}",
                          [c.name for c in EVALUATOR_CASES]) for i, config in enumerate(production)]

    def task_values(self, job: OutputJob) -> Path | None:
        """The task's own values the reference's child computed a job's outputs on (its "task" case), when that job's
        outputs are made already; None otherwise (nothing is computed here)."""
        index = self.cache_dir / "reference_outputs" / f"{job.key}.json"
        if not index.is_file():
            return None
        name = json.loads(index.read_text()).get("task", {}).get("values")
        return self.cache_dir / "reference_outputs" / name if name else None

    def copy_task_values(self, job: OutputJob, dest: Path) -> bool:
        """The job's kept task values (`task_values`) copied to `dest`, where a child may read them (the cache is
        private to kernelbot); False when there are none. A copy, not a link: the child may write where it reads,
        and the cache's file must stay as made."""
        kept = self.task_values(job)
        if kept is None:
            return False
        shutil.copyfile(kept, dest)
        shutil.copyfile(kept.with_suffix(".json"), dest.with_suffix(".json"))
        return True

    def prefetch_outputs(self, tasks: list[Task], interpret_budget: Budget | None = None) -> dict[str, str]:
        """The production outputs of every task not cached yet, in one reference child (on the chip: one opening of
        it for all); returns why a task's could not be computed, by task id (its evaluation will say so again).
        With `interpret_budget`, only those of the configurations an interpret-mode check runs at (its elements and
        FLOPs): made ahead, their "task" case's values spare each candidate's child its own get_inputs()."""
        root = self.cache_dir / "reference_outputs"
        root.mkdir(parents=True, exist_ok=True)
        wanted: list[OutputJob] = []
        todo: list[Task] = []
        for task in tasks:
            try:
                jobs = [j for j in self.production_jobs(task) if not (root / f"{j.key}.json").is_file()]
            except TaskError:
                continue
            for job in jobs:
                job.task = len(todo)
            if jobs:
                todo.append(task)
                wanted.extend(jobs)
        if not wanted:
            return {}
        failed: dict[str, str] = {}
        while todo:  # a child that stops at one task is started again for the tasks it did not reach
            report, scratch = self._run(todo, export=False, jobs=wanted, strict=False,
                                        interpret_budget=interpret_budget)
            try:
                done = set(report.finished) - set(report.output_errors)
                self._keep_outputs(report, scratch, [j for j in wanted if str(todo[j.task].path) in done])
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            failed.update({t.task_id: report.output_errors[str(t.path)] for t in todo
                           if str(t.path) in report.output_errors})
            left = [t for t in todo if str(t.path) not in report.finished and str(t.path) not in report.output_errors]
            index = {str(t.path): i for i, t in enumerate(left)}
            wanted = [replace(j, task=index[str(todo[j.task].path)]) for j in wanted if str(todo[j.task].path) in index]
            todo = left
        return failed

    # A task's outputs that stopped the reference's child at a limit of this host: kept beside the outputs, so a
    # candidate stopped at the same limit is judged knowing it (and the reference is not run again in vain). Another
    # draw of the inputs (DRAW) may fit where this one did not: its stop is its own.
    def _stop_record(self, task: Task) -> Path:
        return (self.cache_dir / "reference_outputs"
                / f"{task.task_id}-{task.digest[:16]}-{self.numerics}-{DRAW}.stopped")

    def _remember_stop(self, task: Task, error: ReferenceStopped) -> None:
        record = self._stop_record(task)
        record.parent.mkdir(parents=True, exist_ok=True)
        tmp = record.with_suffix(f".{uuid.uuid4().hex[:6]}.tmp")
        tmp.write_text(json.dumps({"why": str(error), "kind": error.kind, "memory_mib": self.limits.memory_mib,
                                   "wall_seconds": self.limits.wall_seconds}))
        tmp.replace(record)

    def reference_stopped(self, task: Task) -> ReferenceStopped | None:
        """How the reference's outputs of `task` stopped at a limit of this host, when they did under limits no
        larger than today's (raising a limit makes it worth trying again)."""
        record = self._stop_record(task)
        if not record.is_file():
            return None
        data = json.loads(record.read_text())
        if self.limits.memory_mib > data["memory_mib"] or self.limits.wall_seconds > data["wall_seconds"]:
            return None
        return ReferenceStopped(data["why"], data["kind"])

    def _keep_outputs(self, report: ReferenceReport, scratch: Path, jobs: list[OutputJob]) -> None:
        """Move a reference run's output files into the cache, each job's index last and whole."""
        root = self.cache_dir / "reference_outputs"
        for job in jobs:
            if job.key not in report.outputs:  # left out by the child (beyond the interpret-mode budget)
                continue
            files = report.outputs[job.key]
            for names in files.values():
                for name in names.values():
                    if name:
                        for part in (name, name.replace(".npz", ".json")):
                            shutil.move(scratch / "out" / part, root / part)
            tmp = root / f"{job.key}.{uuid.uuid4().hex[:6]}.tmp"  # whole, for other processes
            tmp.write_text(json.dumps(files))
            tmp.replace(root / f"{job.key}.json")

    def float64(self, task: Task, job: OutputJob, case: str, part: str) -> tuple[Path | None, str]:
        """A float64 run of the reference for one case, made the first time the judge asks for it (in a reference
        child of its own, on the CPU) and kept beside the case's other outputs: `truth` where it was not made with
        the outputs (large dots), `perturbed` on the case's inputs rounded once more (the task's sensitivity).
        The file, or None and why not: the reference cannot run in float64, or its child could not finish (the
        reason is kept beside the index, so a judgement made later says it too)."""
        root = self.cache_dir / "reference_outputs"
        root.mkdir(parents=True, exist_ok=True)
        why_file = root / f"{job.key}.{case}.{part}.why"
        with _lock(f"outputs-{task.task_id}-{task.digest}"):
            index = root / f"{job.key}.json"
            files = json.loads(index.read_text()) if index.is_file() else {}  # none: the timing's inputs
            if part not in files.get(case, {}):
                one = OutputJob(job.key, job.config, job.values_from, [case], float64=part)
                try:
                    report, scratch = self._run([task], export=False, jobs=[one], cpu_only=True)
                except TaskError as exc:  # out of time or memory: judged without it, and not asked for again
                    name = None
                    why_file.write_text(f"its float64 run on this host's CPU stopped: {exc}"[:600])
                else:
                    try:
                        name = report.outputs.get(job.key, {}).get(case, {}).get(part)
                        if name:
                            for file in (name, name.replace(".npz", ".json")):
                                shutil.move(scratch / "out" / file, root / file)
                    finally:
                        shutil.rmtree(scratch, ignore_errors=True)
                files.setdefault(case, {})[part] = name
                tmp = index.with_suffix(f".{uuid.uuid4().hex[:6]}.tmp")
                tmp.write_text(json.dumps(files))
                tmp.replace(index)
            name = files[case][part]
        if name:
            return root / name, ""
        return None, why_file.read_text() if why_file.is_file() else "the reference does not run in float64"

    def _found(self, jobs: list[OutputJob]) -> dict[str, dict[str, dict[str, Path | None]]]:
        root = self.cache_dir / "reference_outputs"
        found: dict[str, dict[str, dict[str, Path | None]]] = {}
        for job in jobs:
            files = json.loads((root / f"{job.key}.json").read_text())
            found[job.key] = {case: {part: root / name if name else None for part, name in names.items()}
                              for case, names in files.items()}
        return found


def reference_store(settings: Settings, chip: ChipSpec | None = None) -> ReferenceStore:
    """The store evaluations for `chip` use: its outputs computed on this host's TPU when candidates for that
    target run on it."""
    on_chip = chip is not None and settings.on_chip(chip.name)
    return ReferenceStore(cache_dir=settings.cache_dir, sandbox_dir=settings.sandbox_dir, limits=settings.limits,
                          device_kind=chip.device_kind if on_chip and chip is not None else None)


def production_configurations(task: Task, settings: Settings) -> list[Configuration]:
    """The task's production input shapes, traced in the reference's sandboxed child (cached): for people and
    agents to read, without running the task's code in this process."""
    configs, _ = reference_store(settings).programs(task)
    return [config_from_json(c) for c in configs]
