"""The sandboxed evaluation process: `python -m tpu_runner.child REQUEST.json`.

Runs stages lower -> compile -> correctness -> performance -> profile for one candidate and writes
`child_result.json` beside the request. The current stage is written to a small file first, so that the
parent can tell where a child that hung or was killed had got to. The parent never imports candidate code;
this process does, and exits after one candidate.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from types import ModuleType
from typing import Any

import jax

from tpu_runner import jaxpr_walk
from tpu_runner.compile import CompileReport, StaticProfile, compile_lowered, target_sharding, trace
from tpu_runner.correctness import CandidateFailed, check_configuration
from tpu_runner.derive import derive_configurations
from tpu_runner.errors import from_exception
from tpu_runner.hardware import ChipSpec, get_chip
from tpu_runner.ir import ir_digest
from tpu_runner.performance import MismatchWhileTiming, estimated_performance, measured_performance
from tpu_runner.profile import summarise
from tpu_runner.result import Correctness, EvalError
from tpu_runner.tasks import (
    Configuration,
    Task,
    TaskError,
    abstract_configurations,
    concrete_configurations,
    has_test_inputs,
    import_reference,
    load_task,
)
from tpu_runner.traffic import pallas_traffic


class StageFailure(Exception):
    def __init__(self, stage: str, error: EvalError, verdict: str | None = None):
        super().__init__(error.detail)
        self.stage, self.error, self.verdict = stage, error, verdict


class Child:
    def __init__(self, request: dict[str, Any]):
        self.request = request
        self.workdir = Path(request["workdir"])
        self.artifacts = Path(request["artifacts_dir"])
        self.cache_dir = Path(request["cache_dir"])
        self.candidate_path = request["kernel_path"]
        self.chip: ChipSpec = get_chip(request["target"])
        self.profile = StaticProfile(Path(request["llo_dump_dir"]) if request.get("llo_dump_dir") else None)
        self.mode = request.get("static_profile", "fast")
        # On a TPU of the target's generation the candidate runs and is timed on it; `measure` asks for the
        # same measured path on whatever backend this is (the tests use it on the CPU backend).
        self.on_device = False
        self.measured = bool(request.get("measure"))
        self.timings: dict[str, float] = {}
        self.notes: list[str] = []
        self.ir_hash: str | None = None

    # -- bookkeeping ------------------------------------------------------------------------------------------
    def enter(self, stage: str) -> None:
        (self.workdir / "stage").write_text(stage)
        self._stage, self._t0 = stage, time.perf_counter()

    def leave(self) -> None:
        self.timings[self._stage] = self.timings.get(self._stage, 0.0) + time.perf_counter() - self._t0

    def fail(self, stage: str, exc: BaseException, default_kind: str | None = None) -> StageFailure:
        return StageFailure(stage, from_exception(exc, stage=stage, candidate_path=self.candidate_path,
                                                  default_kind=default_kind))

    # -- stages -----------------------------------------------------------------------------------------------
    def import_candidate(self) -> ModuleType:
        spec = importlib.util.spec_from_file_location("kernelbot_candidate", self.candidate_path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise self.fail("lower", exc, "import_error") from exc
        if not callable(getattr(module, "computation", None)):
            raise StageFailure("lower", EvalError("missing_entry_point", "computation is not callable"))
        return module

    def check_policy(self, jaxpr: Any, task: Task) -> None:
        """What the traced program shows that the source did not: kernels, callbacks, aliasing."""
        if not task.allow_pure_jax and not request_allows_pure_jax(self.request) and not jaxpr_walk.pallas_calls(jaxpr):
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

    def compile_candidate(self, fn: Any, configs: list[Configuration], task: Task) -> list[dict[str, Any]]:
        """Lower every configuration, pass the IR gate, then compile each one."""
        lowered_all = [self.lower_configuration(fn, config, i, task) for i, config in enumerate(configs)]
        self.ir_hash = ir_digest([lowered.as_text() for lowered, _, _, _ in lowered_all])
        self.pass_ir_gate()
        reports = []
        for i, (lowered, traffic, limits, lower_seconds) in enumerate(lowered_all):
            self.enter("compile")
            try:
                report = compile_lowered(lowered, self.profile, lower_seconds=lower_seconds,
                                         keep_in=self.artifacts / "llo", label=f"candidate.config{i}")
            except Exception as exc:
                raise self.fail("compile", exc) from exc
            self.leave()
            if len(limits) != len(traffic.calls):
                limits = [None] * len(traffic.calls)
            reports.append({"report": report, "traffic": traffic, "vmem_limits": limits, "ir_hash": self.ir_hash})
        return reports

    def lower_configuration(self, fn: Any, config: Configuration, i: int, task: Task) -> tuple[Any, Any, list, float]:
        self.enter("lower")
        try:
            traced = trace(fn, config, target_sharding(self.chip))
        except Exception as exc:
            raise self.fail("lower", exc) from exc
        self.check_policy(traced.jaxpr, task)
        traffic = pallas_traffic(traced.jaxpr)
        limits = [jaxpr_walk.vmem_limit(e) for e in jaxpr_walk.pallas_calls(traced.jaxpr)]
        try:
            t0 = time.perf_counter()
            lowered = traced.lower()
            lower_seconds = time.perf_counter() - t0
        except Exception as exc:
            failed = self.fail("lower", exc)
            kernels = jaxpr_walk.kernel_definitions(traced.jaxpr, self.candidate_path)
            if failed.error.line is None and len(kernels) == 1:
                # Kernel bodies keep no usable traceback; the kernel's own definition is the next best place.
                name, line = kernels[0]
                failed.error = EvalError(failed.error.kind, f"{failed.error.detail}\n(in kernel {name}, defined "
                                         f"at line {line})", line, failed.error.stage)
            raise failed from exc
        (self.artifacts / f"candidate.config{i}.stablehlo.mlir").write_text(lowered.as_text())
        self.leave()
        return lowered, traffic, limits, lower_seconds

    def pass_ir_gate(self) -> None:
        """With an IR gate, tell the parent the normalised IR digest and wait for go/stop: a search stops here
        a candidate whose program it has already evaluated, before any compile."""
        if not self.request.get("ir_gate"):
            return
        (self.workdir / "ir_hash").write_text(self.ir_hash)
        answer = sys.stdin.readline().strip()
        if answer != "go":
            detail = answer.removeprefix("stop").strip() or "an earlier candidate"
            raise StageFailure("lower", EvalError("duplicate_ir", f"this candidate lowers to the same program as "
                               f"{detail}; it is not evaluated again"), "duplicate")

    def reference_costs(self, task: Task, ref_fn: Any, configs: list[Configuration]) -> list[dict[str, Any]]:
        """Compile the reference under the same options; cached per task, target and toolchain."""
        key = f"{task.task_id}-{task.digest}-{self.chip.name}-{self.mode}-jax{jax.__version__}.json"
        path = self.cache_dir / "reference" / key
        if path.is_file():
            return json.loads(path.read_text())
        sharding = target_sharding(self.chip)
        out = []
        for config in configs:
            traced = trace(ref_fn, config, sharding)
            t0 = time.perf_counter()
            lowered = traced.lower()
            report: CompileReport = compile_lowered(lowered, self.profile, lower_seconds=time.perf_counter() - t0)
            out.append({"cycles": report.cycles, "ops": report.ops, "cost": report.cost,
                        "compile_seconds": report.compile_seconds})
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(out))
        tmp.replace(path)
        return out

    def correctness(self, task: Task, ref_fn: Any, cand_fn: Any, prod: list[Configuration]) -> Correctness:
        if has_test_inputs(task):
            configs = concrete_configurations(task, "get_test_inputs")
            names = [f"test[{i}]" for i in range(len(configs))]
        else:
            configs, names, notes = derive_configurations(task, prod, ref_fn, cand_fn,
                                                          self.request["interpret_grid_steps"])
            self.notes.extend(notes)
            if not configs:
                return Correctness(status="not_checked", notes=notes)
        cases = []
        interpret = not self.on_device
        for i, (name, config) in enumerate(zip(names, configs, strict=True)):
            atol, rtol = task.tolerance(i)
            try:
                cases += check_configuration(name=name, config=config, reference=ref_fn, candidate=cand_fn,
                                             atol=atol, rtol=rtol, interpret=interpret,
                                             candidate_path=self.candidate_path)
            except CandidateFailed as failed:
                raise StageFailure("correctness", failed.error) from failed
        passed = [c for c in cases if c.status == "passed"]
        if not passed:
            return Correctness(status="not_checked", cases=cases,
                               notes=["the reference was not finite on any evaluator input"])
        return Correctness(status="passed", cases=cases,
                           max_abs_err=max(c.max_abs_err or 0.0 for c in passed),
                           max_rel_err=max(c.max_rel_err or 0.0 for c in passed),
                           notes=list(self.notes))

    def detect_device(self) -> None:
        if self.request["host"] != "tpu":
            return
        kind = jax.devices()[0].device_kind
        self.on_device = kind == self.chip.device_kind
        if self.on_device:
            self.measured = True
        else:
            self.notes.append(f"this host's accelerator is {kind!r}, not the target {self.chip.device_kind!r}: "
                              "checked in interpret mode and estimated")

    def run(self) -> dict[str, Any]:
        out: dict[str, Any] = {"timings": self.timings, "notes": self.notes}
        try:
            self.enter("load")
            self.detect_device()
            task = load_task(self.request["task_dir"])
            ref_fn = import_reference(task).computation
            prod = abstract_configurations(task)
            self.leave()
            self.enter("lower")
            cand_fn = self.import_candidate().computation
            self.leave()
            cand = self.compile_candidate(cand_fn, prod, task)
            self.enter("reference")  # its own stage: libtpu aborting here is the task's problem, not the candidate's
            ref = self.reference_costs(task, ref_fn, prod)
            self.leave()
            self.enter("correctness")
            correctness = self.correctness(task, ref_fn, cand_fn, prod)
            out["correctness"] = asdict(correctness)
            self.leave()
            self.enter("performance")
            if self.measured:
                try:
                    perf, profile = measured_performance(
                        self.chip, task, prod, cand, ref, ref_fn, cand_fn, trace_dir=self.artifacts / "trace",
                        on_device=self.on_device)
                except MismatchWhileTiming as mismatch:
                    raise StageFailure("performance", mismatch.error, "incorrect") from mismatch
                if not self.on_device:
                    self.notes.append(f"measured on {perf.detail['device']}, not on a {self.chip.name}: the times "
                                      "are not TPU times")
            else:
                perf, profile = estimated_performance(self.chip, self.mode, prod, cand, ref)
            out["performance"] = asdict(perf)
            self.leave()
            self.enter("profile")
            profile["summary"] = summarise(profile)
            out["profile"] = profile
            self.leave()
            out["stage"] = "done"
        except TaskError as exc:
            out["task_error"] = str(exc)
        except StageFailure as failed:
            out.update(stage=failed.stage, error=failed.error.to_json(), verdict=failed.verdict)
        out["ir_hash"] = self.ir_hash
        return out


def request_allows_pure_jax(request: dict[str, Any]) -> bool:
    return bool(request.get("allow_pure_jax"))


def main(argv: list[str]) -> int:
    request_path = Path(argv[1])
    request = json.loads(request_path.read_text())
    result = Child(request).run()
    tmp = request_path.with_name("child_result.json.tmp")
    tmp.write_text(json.dumps(result, default=float))
    tmp.replace(request_path.with_name("child_result.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
