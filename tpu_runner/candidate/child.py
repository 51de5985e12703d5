"""The candidate's sandboxed process: `python -m tpu_runner.candidate.child REQUEST.json` (through `sandbox.entry`).

Imports the candidate (and, for shapes only, the task's reference), then for every production configuration
traces it for the TPU target, applies the policy checks the traced program shows (kernels, callbacks,
aliasing), checks that the production grid writes every output element, and exports the program for the
compile servers. It then picks the shapes to check (`checkshapes`), runs the candidate there on
evaluator-owned inputs - in Pallas TPU interpret mode on a host without the target TPU - and saves the outputs
as files. Nothing here decides a verdict: outputs are compared, and the exported programs compiled, by
processes that never ran the candidate. A report (`protocol.CandidateReport`) says what was done; the current
stage is written to a small file first, so the parent can tell where a child that hung or was killed had got to.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import resource
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import numpy as np

from tpu_runner.analysis import ir_digest, jaxpr_walk, output_coverage, pallas_traffic, program_form, traffic_to_json
from tpu_runner.checking import (
    CheckShape,
    Comparison,
    Production,
    as_output_set,
    choose,
    compare_outputs,
    memory_allowance,
    run_candidate_case,
    save_outputs,
    with_kept_values,
)
from tpu_runner.hardware import ChipSpec, chip, get_chip
from tpu_runner.reports import (
    Budget,
    CandidateReport,
    CandidateRequest,
    CaseOutput,
    CheckReport,
    EvalError,
    KeptDifference,
    MeasuredTimes,
    ProgramReport,
    Stage,
    Verdict,
    from_exception,
    timed,
    write_json,
)
from tpu_runner.sandbox import integrity
from tpu_runner.tasks import (
    ENTRY_POINTS,
    EVALUATOR_CASES,
    TIMING_CASES,
    Configuration,
    Task,
    TaskError,
    abstract_configurations,
    case_inputs,
    concrete_configurations,
    config_to_json,
    drawn_ahead,
    has_test_inputs,
    import_reference,
    input_bounds,
    kernelbench,
    load_task,
    with_input_bounds,
)
from tpu_runner.timing import (  # imported before the candidate: its functions are watched (integrity)
    Judgement,
    measure_pair,
)

ON_DEVICE_BUDGET = Budget(elements=1 << 62, flops=1e30, grid_steps=1 << 62)


class StageFailure(Exception):
    def __init__(self, stage: Stage, error: EvalError, verdict: Verdict | None = None):
        super().__init__(error.detail)
        self.stage, self.error, self.verdict = stage, error, verdict


@contextlib.contextmanager
def target_context(chip: ChipSpec, on_device: bool) -> Iterator[None]:
    """Trace as for the target TPU: on a host without it, an abstract mesh of that device kind, so that code
    asking for the TPU's generation (`pltpu.get_tpu_info()`) gets the target's, with no libtpu needed."""
    if on_device:
        yield
        return
    mesh = jax.sharding.AbstractMesh(
        (1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,),
        abstract_device=jax.sharding.AbstractDevice(device_kind=chip.device_kind, num_cores=1, platform="tpu"))
    with jax.sharding.use_abstract_mesh(mesh):
        yield


def _abstract(config: Configuration) -> list[Any]:
    return [jax.ShapeDtypeStruct(a.shape, np.dtype(a.dtype)) for a in config.dynamic] + list(config.static)


def timing_input_sets(config: Configuration, count: int = len(TIMING_CASES)) -> list[list[Any]]:
    """The first `count` input sets of the production configuration for timing."""
    sets = [case_inputs(config, case) for case in TIMING_CASES[:count]]
    assert all(s is not None for s in sets)  # only a "task" case can lack inputs
    return [s for s in sets if s is not None]


def timing_sets_plan(set_bytes: int, device_bytes: int | None, host_room: int | None) -> tuple[int, bool]:
    """How many timing input sets (one to three) and whether to draw them while the candidate is checked.

    The sets stay on the device through the timing, with one more copy per call: together they keep to a quarter
    of the chip's memory, the rest being the programs' own (5p's three sets of 2.8 GB, with its reference's 8.6 GB
    of scores, would not fit a v5e's 15.7). Drawn ahead only when they take at most a quarter of the host memory
    the evaluation has left (drawn beside the correctness cases, 5p's 8.4 GB took its child past the limit);
    otherwise after the checks, once their inputs are gone."""
    count = len(TIMING_CASES)
    while count > 1 and device_bytes is not None and (count + 1) * set_bytes > device_bytes // 4:
        count -= 1
    ahead = host_room is None or count * set_bytes <= host_room // 4
    return count, ahead


def keeping_judge(outputs: Path, atol: float, rtol: float, kept: list[tuple[str, str]]) -> Judgement:
    """Outputs that differed while timing, judged elementwise here; a difference in values only (which the float64
    truth or the task's sensitivity may explain) is saved instead and kept for the evaluator to judge, as it judges
    the correctness cases (`KeptDifference`). One pair per input set (a deterministic kernel gives one): its two
    files are appended to `kept` in the order the judge was asked; another pair on the same set is judged here."""
    sets_kept: set[int] = set()

    def judge(k: int, cand: Any, ref: Any) -> tuple[Comparison, str] | None:
        comparison = compare_outputs(cand, ref, atol, rtol)
        if comparison.ok or comparison.error is None or comparison.error.kind != "mismatch" or k in sets_kept:
            return comparison, ""
        sets_kept.add(k)
        names = (f"{TIMING_CASES[k].name}.candidate.npz", f"{TIMING_CASES[k].name}.reference.npz")
        for name, tree in zip(names, (cand, ref), strict=True):
            held = as_output_set(tree)
            save_outputs(outputs / name, held.tree, list(held.leaves))
        kept.append(names)
        return None

    return judge


class CandidateStages:
    """The candidate's stages in its child, in order (`run`): load, lower (trace, check, export), the IR gate,
    correctness (run at the check shapes, save the outputs), and performance when timed on this host."""

    def __init__(self, request: CandidateRequest):
        self.request = request
        self.workdir = Path(request.workdir)
        self.artifacts = Path(request.artifacts_dir)
        self.outputs = self.workdir / "outputs"
        self.candidate_path = request.kernel_path
        self.target: ChipSpec = get_chip(request.target)
        # On a TPU of the target's generation the candidate runs and is timed on it; `measure` asks for the
        # same measured path on whatever backend this is (the tests use it on the CPU backend).
        self.on_device = False
        self.measured = request.measure
        self.report = CandidateReport(stage="load", sandbox=os.environ.get("KERNELBOT_SANDBOX", "not sandboxed"))
        self._stage, self._t0 = "load", time.perf_counter()

    # -- bookkeeping ------------------------------------------------------------------------------------------
    def enter(self, stage: str) -> None:
        (self.workdir / "stage").write_text(stage)
        self._stage, self._t0 = stage, time.perf_counter()

    def leave(self) -> None:
        timings = self.report.timings
        timings[self._stage] = timings.get(self._stage, 0.0) + time.perf_counter() - self._t0
        # The resident memory's high-water mark when each stage ends (on a TPU the runtime holds much of it from
        # the start): which stage grew it, where the supervisor's peak alone does not say.
        timings[f"rss_mib.{self._stage}"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def fail(self, stage: Stage, exc: BaseException, default_kind: str | None = None) -> StageFailure:
        return StageFailure(stage, from_exception(exc, stage=stage, candidate_path=self.candidate_path,
                                                  default_kind=default_kind))

    # -- stages -----------------------------------------------------------------------------------------------
    def import_candidate(self, task: Task) -> ModuleType:
        spec = importlib.util.spec_from_file_location("kernelbot_candidate", self.candidate_path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise self.fail("lower", exc, "import_error") from exc
        name = next((n for n in ENTRY_POINTS if callable(getattr(module, n, None))), None)
        if name is None and any(isinstance(getattr(module, n, None), type) for n in kernelbench.MODEL_CLASSES):
            module.computation = kernelbench.candidate_computation(module, import_reference(task))
            return module
        if name is None:
            raise StageFailure("lower", EvalError("missing_entry_point", "computation is not callable"))
        if name == "workload":  # JAXBench's optimized.py: its arguments come in the workload's own order
            reference = import_reference(task)
            adapt = getattr(reference, "called_as_reference", None)
            module.computation = adapt(module.workload) if adapt else module.workload
        return module

    def check_policy(self, jaxpr: Any, task: Task) -> None:
        """What the traced program shows that the source did not: kernels, callbacks, aliasing."""
        if not (task.allow_pure_jax or self.request.allow_pure_jax) and not jaxpr_walk.pallas_calls(jaxpr):
            raise StageFailure("static", EvalError("no_pallas_call", "the traced computation contains no pallas_call: "
                               "the Pallas code is never reached, so this is not a kernel"), "rejected")
        found = jaxpr_walk.callbacks(jaxpr)
        if found:
            raise StageFailure("static", EvalError("host_callback", f"the computation calls back to the host "
                               f"({', '.join(found)}): work outside the device is not allowed"), "rejected")
        aliased = jaxpr_walk.aliased_calls(jaxpr)
        if aliased and not task.allow_input_output_aliases:
            raise StageFailure("static", EvalError("input_output_alias", f"{', '.join(aliased)} aliases inputs to "
                               "outputs (input_output_aliases); this task does not allow it"), "rejected")

    def production_program(self, fn: Any, config: Configuration, i: int, task: Task) -> tuple[Production, str]:
        """Trace, check and export the candidate at one production configuration; returns its lowered text."""
        self.enter("lower")
        with target_context(self.target, self.on_device):
            try:
                jaxpr = jax.make_jaxpr(fn, static_argnums=config.static_argnums)(*_abstract(config))
            except Exception as exc:
                raise self.fail("lower", exc) from exc
            self.check_policy(jaxpr, task)
            traffic = pallas_traffic(jaxpr)
            coverage = output_coverage(jaxpr)
            try:
                dynamic = _abstract(config)[: len(config.dynamic)]
                jitted = jax.jit(lambda *d: fn(*d, *config.static))
                exported = jax.export.export(jitted, platforms=["tpu"])(*dynamic)
            except Exception as exc:
                failed = self.fail("lower", exc)
                kernels = jaxpr_walk.kernel_definitions(jaxpr, self.candidate_path)
                if failed.error.line is None and len(kernels) == 1:
                    # Kernel bodies keep no usable traceback; the kernel's own definition is the next best place.
                    name, line = kernels[0]
                    failed.error = EvalError(failed.error.kind, f"{failed.error.detail}\n(in kernel {name}, defined "
                                             f"at line {line})", line, failed.error.stage)
                raise failed from exc
        if coverage.missing:
            raise StageFailure("correctness", EvalError(
                "partial_output", f"at the production shapes ({config.describe()}) part of the output is never "
                f"written: {'; '.join(coverage.missing)}. Every element of every output must be written by some "
                "grid step (grid and output BlockSpec)."), "incorrect")
        self.report.coverage_unchecked.extend(coverage.unchecked)
        text = exported.mlir_module()
        (self.artifacts / f"candidate.config{i}.stablehlo.mlir").write_text(text)
        name = f"candidate.config{i}.exported"
        (self.workdir / name).write_bytes(exported.serialize())
        self.report.programs.append(ProgramReport(
            config=config_to_json(config), exported=name, traffic=traffic_to_json(traffic),
            vmem_limits=[jaxpr_walk.vmem_limit(e) for e in jaxpr_walk.pallas_calls(jaxpr)],
            kernels=jaxpr_walk.kernel_definitions(jaxpr, self.candidate_path)))
        self.leave()
        return Production(config, jaxpr, traffic, program_form(jaxpr)), text

    def pass_ir_gate(self) -> None:
        """With an IR gate, tell the parent the normalised IR digest and wait for go/stop: a search stops here
        a candidate whose program it has already evaluated, before any compile."""
        if not self.request.ir_gate:
            return
        assert self.report.ir_hash is not None
        (self.workdir / "ir_hash").write_text(self.report.ir_hash)
        answer = sys.stdin.readline().strip()
        if answer != "go":
            detail = answer.removeprefix("stop").strip() or "an earlier candidate"
            raise StageFailure("lower", EvalError("duplicate_ir", f"this candidate lowers to the same program as "
                               f"{detail}; it is not evaluated again"), "duplicate")

    def check_shapes(self, task: Task, ref_fn: Any, cand_fn: Any, production: list[Production]) -> list[CheckShape]:
        tests = concrete_configurations(task, "get_test_inputs") if has_test_inputs(task) else []
        tests = [Configuration(c.dynamic, c.static) for c in tests]  # values are re-read by name where used
        # On the chip the production shapes are checked, however large: the chip runs them as it will be timed.
        budget = ON_DEVICE_BUDGET if self.on_device else self.request.budget
        with target_context(self.target, self.on_device):
            checks, notes = choose(production=production, tests=tests, ref_fn=ref_fn, cand_fn=cand_fn,
                                   budget=budget,
                                   int_ranges=[[a.int_range for a in p.config.dynamic] for p in production])
        self.report.notes.extend(notes)
        return checks

    def run_checks(self, task: Task, cand_fn: Any, checks: list[CheckShape]) -> None:
        """Each check's cases in turn, stopping at the first failure. The next case's inputs are drawn and the
        outputs written by a helper thread meanwhile: on a chip, the chip then waits for neither."""
        self.outputs.mkdir(parents=True, exist_ok=True)
        twice = True
        failed = False
        writes: list[Future[None]] = []
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="case-io") as helper:
            for check in checks:
                values_from = (f"production:{check.name.split('[')[1].rstrip(']')}" if check.production
                               else f"test:{check.name.split('[')[1].rstrip(']')}" if check.name.startswith("test")
                               else None)
                with self.timed("correctness.task_values"):
                    # the values the reference's outputs were computed on, where the evaluator copied them in
                    kept = self.request.task_values.get(values_from or "")
                    config = with_kept_values(task, check.config, values_from, self.workdir / kept if kept else None)
                entry = CheckReport(name=check.name, config=config_to_json(check.config), values_from=values_from,
                                    why=check.why, differs=check.differs, production=check.production)
                self.report.checks.append(entry)
                if failed:  # the judge stops at the first failure: later checks are reported without cases
                    continue
                for case, inputs in drawn_ahead(config, EVALUATOR_CASES, helper):
                    if failed:
                        break
                    with self.timed("correctness.inputs"):
                        host = inputs.result()
                    if host is None:
                        continue
                    label = f"{check.name}/{case.name}"
                    with target_context(self.target, self.on_device), self.timed("correctness.run"):
                        ran = run_candidate_case(label=label, config=config, candidate=cand_fn, case=case,
                                                 interpret=not self.on_device, candidate_path=self.candidate_path,
                                                 twice=twice, host=host)
                    assert ran is not None
                    twice = False
                    out = CaseOutput(case=case.name)
                    if ran.error is not None:
                        out.error = ran.error
                        failed = True  # the judge stops at the first failure; later cases are not needed
                    else:
                        assert ran.outputs is not None
                        out.outputs = f"{check.name}.{case.name}.npz"
                        writes.append(helper.submit(save_outputs, self.outputs / out.outputs, ran.outputs.tree,
                                                    list(ran.outputs.leaves)))
                        if ran.again is not None:
                            out.again = f"{check.name}.{case.name}.again.npz"
                            writes.append(helper.submit(save_outputs, self.outputs / out.again, ran.again.tree,
                                                        list(ran.again.leaves)))
                    entry.cases.append(out)
            with self.timed("correctness.writing"):
                for write in writes:
                    write.result()

    def timed(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Add the time spent inside to `name` in the report's timings (the parts of a stage)."""
        return timed(self.report.timings, name)

    def time_on_this_host(self, task: Task, ref_fn: Any, cand_fn: Any, prod: list[Configuration],
                          drawn: Future[list[list[Any]]]) -> None:
        config = prod[0]
        atol, rtol = task.tolerance(0)
        with self.timed("performance.inputs"):
            input_sets = drawn.result()
        files: list[tuple[str, str]] = []
        pair = measure_pair(reference=ref_fn, candidate=cand_fn, input_sets=input_sets,
                            static=config.static, trace_dir=self.artifacts / "trace", atol=atol, rtol=rtol,
                            judge=keeping_judge(self.outputs, atol, rtol, files))
        self.report.notes.extend(pair.notes)
        kept = [KeptDifference(TIMING_CASES[k].name, iterations, cand, ref)
                for (k, iterations), (cand, ref) in zip(pair.kept, files, strict=True)]
        self.report.measured = MeasuredTimes(
            candidate_ms=pair.candidate.median_ms, reference_ms=pair.reference.median_ms,
            candidate_spread_ms=pair.candidate.spread_ms, reference_spread_ms=pair.reference.spread_ms,
            iterations=len(pair.candidate.samples_ms), source=pair.candidate.source,
            device=jax.devices()[0].device_kind, mismatches=pair.mismatches[:3],
            configuration=config.describe(), on_device=self.on_device,
            candidate_ops=pair.candidate_ops, reference_ops=pair.reference_ops, kept=kept)

    def timing_inputs(self, config: Configuration, *, ahead: bool) -> Future[list[list[Any]]] | None:
        """The timing input sets as the helper thread draws them, sized to the chip's and the host's memory
        (`timing_sets_plan`); None where they are to be drawn later (asked `ahead`, they are too large now)."""
        stats = (jax.devices()[0].memory_stats() if self.on_device else None) or {}
        count, early = timing_sets_plan(sum(a.nbytes for a in config.dynamic), stats.get("bytes_limit"),
                                        memory_allowance())
        if ahead and not early:
            return None
        if count < len(TIMING_CASES):
            self.report.notes.append(f"timed on {count} input set{'s' * (count > 1)} instead of "
                                     f"{len(TIMING_CASES)}: {len(TIMING_CASES)} would not fit the chip's memory "
                                     "beside the programs")
        return self.ahead.submit(timing_input_sets, config, count)

    @functools.cached_property
    def ahead(self) -> ThreadPoolExecutor:
        """One helper thread for work the candidate's stages do not wait on yet (it ends with the process)."""
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="ahead")

    def detect_device(self) -> None:
        """On a TPU host, wait for the chip (its lock, so that children take turns) and open it."""
        if self.request.host != "tpu":
            return
        chip.hold(on_wait=lambda: self.enter(chip.QUEUED_STAGE))  # held until this process ends
        self.enter("load")
        kind = chip.open_chip()
        self.on_device = kind == self.target.device_kind
        if self.on_device:
            self.measured = True
        else:
            self.report.notes.append(f"this host's accelerator is {kind!r}, not the target "
                                     f"{self.target.device_kind!r}: checked in interpret mode and estimated")

    def run(self) -> CandidateReport:
        report = self.report
        try:
            self.enter("load")
            self.detect_device()
            task = load_task(self.request.task_dir)
            ref_fn = import_reference(task).computation
            prod = with_input_bounds(abstract_configurations(task), input_bounds(task))
            self.leave()
            self.enter("lower")
            snapshot = integrity.take_snapshot()
            cand_fn = self.import_candidate(task).computation
            self.leave()
            programs = [self.production_program(cand_fn, config, i, task) for i, config in enumerate(prod)]
            production = [p for p, _ in programs]
            report.ir_hash = ir_digest([text for _, text in programs])
            self.pass_ir_gate()
            # The timing inputs are drawn while the candidate is checked (on a chip, seconds it would wait
            # otherwise) when they are small beside the memory left; else after the checks.
            timing_inputs = self.timing_inputs(prod[0], ahead=True) if self.measured else None
            self.enter("correctness")
            with self.timed("correctness.choosing_shapes"):
                checks = self.check_shapes(task, ref_fn, cand_fn, production)
            self.run_checks(task, cand_fn, checks)
            self.leave()
            if self.measured:
                self.enter("performance")
                timing_inputs = timing_inputs or self.timing_inputs(prod[0], ahead=False)
                assert timing_inputs is not None
                self.time_on_this_host(task, ref_fn, cand_fn, prod, timing_inputs)
                self.leave()
            changed = integrity.changes_since(snapshot)
            if changed:
                raise StageFailure("static", EvalError("harness_tamper", "the candidate changed functions the "
                                   f"evaluation relies on: {', '.join(changed[:8])}"), "rejected")
            report.stage = "done"
        except TaskError as exc:
            report.task_error = str(exc)
        except chip.ChipBusy as exc:
            report.chip_busy = str(exc)
        except StageFailure as failed:
            report.stage, report.error, report.verdict = failed.stage, failed.error, failed.verdict
        return report


def main(argv: list[str]) -> int:
    # The compile servers run this same JAX: no forward-compatible lowering is needed, and without it Mosaic keeps
    # source locations out of the kernel's body, so programs that differ only in names or lines digest alike.
    jax.config.update("jax_export_ignore_forward_compatibility", True)
    request_path = Path(argv[1])
    report = CandidateStages(CandidateRequest.read(request_path)).run()
    write_json(request_path.with_name("child_result.json"), report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
