"""The sandboxed evaluation process: `python -m tpu_runner.child REQUEST.json`.

Runs stages lower -> compile -> correctness -> performance -> profile for one candidate and writes
`child_result.json` beside the request. The current stage is written to a small file first, so that the
parent can tell where a child that hung or was killed had got to. The parent never imports candidate code;
this process does, and exits after one candidate.
"""

from __future__ import annotations

import hashlib
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
import numpy as np

from tpu_runner import jaxpr_walk
from tpu_runner.compile import CompileReport, StaticProfile, compile_lowered, target_sharding, trace
from tpu_runner.correctness import CandidateFailed, check_configuration
from tpu_runner.errors import from_exception
from tpu_runner.estimate import candidate_hbm_bytes, estimate, performance_flags
from tpu_runner.hardware import ChipSpec, get_chip, roofline
from tpu_runner.profile import kernel_facts, summarise
from tpu_runner.result import Correctness, EvalError, Performance
from tpu_runner.tasks import (
    ArgSpec,
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
        sharding = target_sharding(self.chip)
        reports = []
        for i, config in enumerate(configs):
            self.enter("lower")
            try:
                traced = trace(fn, config, sharding)
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
                raise self.fail("lower", exc) from exc
            ir_text = lowered.as_text()
            (self.artifacts / f"candidate.config{i}.stablehlo.mlir").write_text(ir_text)
            self.leave()
            self.enter("compile")
            try:
                report = compile_lowered(lowered, self.profile, lower_seconds=lower_seconds,
                                         keep_in=self.artifacts / "llo", label=f"candidate.config{i}")
            except Exception as exc:
                raise self.fail("compile", exc) from exc
            self.leave()
            if len(limits) != len(traffic.calls):
                limits = [None] * len(traffic.calls)
            reports.append({"report": report, "traffic": traffic, "vmem_limits": limits,
                            "ir_hash": hashlib.sha256(ir_text.encode()).hexdigest()[:16]})
        return reports

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

    def measured_performance(self, task: Task, prod: list[Configuration], cand: list[dict[str, Any]],
                             ref: list[dict[str, Any]], ref_fn: Any, cand_fn: Any
                             ) -> tuple[Performance, dict[str, Any]]:
        """Time candidate and reference on this process's device, interleaved, on production shapes."""
        from tpu_runner.inputs import Case, case_inputs
        from tpu_runner.measure import measure_pair

        config = prod[0]
        atol, rtol = task.tolerance(0)
        input_sets = [case_inputs(config, Case(f"timing{i}", "normal", 7 + i)) for i in range(3)]
        pair = measure_pair(reference=ref_fn, candidate=cand_fn, input_sets=input_sets,  # type: ignore[arg-type]
                            static=config.static, trace_dir=self.artifacts / "trace", atol=atol, rtol=rtol)
        if pair.mismatches:
            raise StageFailure("performance", EvalError("mismatch_while_timing", "outputs produced while timing "
                               "differ from the reference's on the same inputs: " + pair.mismatches[0]), "incorrect")
        chip = self.chip
        flops = ref[0]["cost"].get("flops", 0.0)
        compulsory = sum(a.nbytes for a in config.dynamic) + cand[0]["report"].memory.get("output_size_in_bytes", 0)
        dtype = config.dynamic[0].dtype if config.dynamic else "float32"
        roof = roofline(chip, flops=flops, bytes_moved=compulsory, dtype_name=dtype)
        c_s, r_s = pair.candidate.median_ms / 1e3, pair.reference.median_ms / 1e3
        flags = performance_flags(candidate_seconds=c_s, roofline=roof) if self.on_device else []
        device = jax.devices()[0].device_kind
        if not self.on_device:
            self.notes.append(f"measured on {device}, not on a {chip.name}: the times are not TPU times")
        profile = {
            "method": "measured", "target": chip.name,
            "candidate": {"seconds": c_s, "spread": pair.candidate.spread_ms / 1e3, "ops": []},
            "reference": {"seconds": r_s, "spread": pair.reference.spread_ms / 1e3, "ops": []},
            "roofline": {"seconds": roof.seconds, "bound": roof.bound, "flops": roof.flops, "bytes": roof.bytes,
                         "intensity": roof.intensity},
            "kernels": [f for c in cand for f in kernel_facts(c["traffic"], chip, c["vmem_limits"])],
        }
        perf = Performance(
            method="measured", unit="ms", reference=r_s * 1e3, candidate=c_s * 1e3, speedup=pair.speedup,
            roofline_fraction=roof.seconds / c_s if self.on_device and c_s else None, roofline_ms=roof.seconds * 1e3,
            bound=roof.bound, flops=flops, bytes=float(compulsory), flags=flags,
            detail={"device": device, "source": pair.candidate.source, "iterations": len(pair.candidate.samples_ms),
                    "candidate_spread_ms": pair.candidate.spread_ms, "reference_spread_ms": pair.reference.spread_ms,
                    "configuration": config.describe()},
        )
        return perf, profile

    def performance(self, task: Task, prod: list[Configuration], cand: list[dict[str, Any]],
                    ref: list[dict[str, Any]]) -> tuple[Performance, dict[str, Any]]:
        chip = self.chip
        c_cycles = sum(c["report"].cycles for c in cand)
        c_bytes = sum(candidate_hbm_bytes(c["traffic"], c["report"].cost) for c in cand)
        r_cycles = sum(r["cycles"] for r in ref)
        r_bytes = sum(r["cost"].get("bytes accessed", 0.0) for r in ref)
        flops = sum(r["cost"].get("flops", 0.0) for r in ref)
        compulsory = sum(sum(a.nbytes for a in cfg.dynamic) for cfg in prod) + sum(
            c["report"].memory.get("output_size_in_bytes", 0) for c in cand)
        dtype = prod[0].dynamic[0].dtype if prod and prod[0].dynamic else "float32"
        roof = roofline(chip, flops=flops, bytes_moved=compulsory, dtype_name=dtype)
        c_est = estimate(chip, cycles=c_cycles, hbm_bytes=c_bytes, mode=self.mode)
        r_est = estimate(chip, cycles=r_cycles, hbm_bytes=r_bytes, mode=self.mode)
        flags = performance_flags(candidate_seconds=c_est.seconds, roofline=roof)
        if not all(c["traffic"].exact for c in cand):
            flags.append("traffic_lower_bound: a kernel moves data itself (memory_space ANY); its HBM bytes are a "
                         "lower bound")
        kernels = [f for c in cand for f in kernel_facts(c["traffic"], chip, c["vmem_limits"])]
        profile = {
            "method": "estimated", "target": chip.name,
            "candidate": {**asdict(c_est), "seconds": c_est.seconds, "bound": c_est.bound,
                          "ops": [op for c in cand for op in c["report"].ops]},
            "reference": {**asdict(r_est), "seconds": r_est.seconds, "bound": r_est.bound,
                          "ops": [op for r in ref for op in r["ops"]]},
            "roofline": {"seconds": roof.seconds, "bound": roof.bound, "flops": roof.flops, "bytes": roof.bytes,
                         "intensity": roof.intensity},
            "kernels": kernels,
        }
        perf = Performance(
            method="estimated", unit="ms", reference=r_est.seconds * 1e3, candidate=c_est.seconds * 1e3,
            speedup=r_est.seconds / c_est.seconds if c_est.seconds else float("inf"),
            roofline_fraction=roof.seconds / c_est.seconds if c_est.seconds else None,
            roofline_ms=roof.seconds * 1e3, bound=c_est.bound, flops=flops, bytes=c_bytes, flags=flags,
            detail={"candidate_cycles": c_cycles, "reference_cycles": r_cycles, "reference_bytes": r_bytes,
                    "cycle_model": f"libtpu static LLO profile ({self.mode})",
                    "cycles_per_second": chip.cycle_rate(self.mode), "hbm_bandwidth": chip.hbm_bandwidth,
                    "ir_hash": cand[0]["ir_hash"] if cand else None},
        )
        return perf, profile

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
            self.enter("compile")
            ref = self.reference_costs(task, ref_fn, prod)
            self.leave()
            self.enter("correctness")
            correctness = self.correctness(task, ref_fn, cand_fn, prod)
            out["correctness"] = asdict(correctness)
            self.leave()
            self.enter("performance")
            if self.measured:
                perf, profile = self.measured_performance(task, prod, cand, ref, ref_fn, cand_fn)
            else:
                perf, profile = self.performance(task, prod, cand, ref)
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
        return out


def request_allows_pure_jax(request: dict[str, Any]) -> bool:
    return bool(request.get("allow_pure_jax"))


def _shrink(d: int, factor: int) -> int:
    if factor == 1 or d <= 128 or d % factor:
        return d
    small = d // factor
    if d % 128 == 0 and small % 128:
        return d
    if d % 8 == 0 and small % 8:
        return d
    return small


def derive_configurations(task: Task, prod: list[Configuration], ref_fn: Any, cand_fn: Any,
                          max_steps: int) -> tuple[list[Configuration], list[str], list[str]]:
    """Smaller configurations for a task without get_test_inputs: every dimension mapped by value (so related
    dimensions stay equal), keeping multiples of the (8, 128) tile, small enough for interpret mode."""
    ranges: list[list[tuple[int, int] | None]] = [[a.int_range for a in c.dynamic] for c in prod]
    if any(np.issubdtype(np.dtype(a.dtype), np.integer) for c in prod for a in c.dynamic):
        ranges = [[a.int_range for a in c.dynamic] for c in concrete_configurations(task, "get_inputs")]
    configs, names, notes = [], [], []
    for i, config in enumerate(prod):
        dims = sorted({d for a in config.dynamic for d in a.shape})
        chosen = None
        for factor in (64, 32, 16, 8, 4, 2, 1):
            mapping = {d: _shrink(d, factor) for d in dims}
            specs = []
            for a, rng in zip(config.dynamic, ranges[i], strict=True):
                if rng is not None and rng[1] + 1 in mapping:
                    rng = (rng[0], min(rng[1], mapping[rng[1] + 1] - 1))
                specs.append(ArgSpec(tuple(mapping[d] for d in a.shape), a.dtype, rng))
            small = Configuration(tuple(specs), config.static)
            args = [jax.ShapeDtypeStruct(s.shape, np.dtype(s.dtype)) for s in small.dynamic] + list(small.static)
            try:
                jax.eval_shape(jax.jit(ref_fn, static_argnums=small.static_argnums), *args)
                jaxpr = jax.make_jaxpr(cand_fn, static_argnums=small.static_argnums)(*args)
            except Exception:
                continue
            steps = sum(c.grid_steps * c.multiplicity for c in pallas_traffic(jaxpr).calls)
            elements = sum(int(np.prod(s.shape)) for s in small.dynamic)
            if steps <= max_steps and elements <= 1 << 23:
                chosen = small
                break
        if chosen is None:
            notes.append(f"configuration {i} ({config.describe()}): no smaller configuration both the reference and "
                         f"the candidate accept fits interpret mode (<= {max_steps} grid steps); correctness not "
                         "checked")
            continue
        configs.append(chosen)
        names.append(f"derived[{i}]")
        notes.append(f"derived[{i}]: the task has no get_test_inputs; checked on ({chosen.describe()}) derived from "
                     f"({config.describe()})")
    return configs, names, notes


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
