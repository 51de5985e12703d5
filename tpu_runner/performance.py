"""Stage 5: the candidate's time against the reference's, estimated from the compile or measured on a device.

Both builders return the `Performance` record and the plain-data profile that `profile.summarise` and the
chart read. The estimate needs no hardware; the measurement runs on this process's default device.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import jax

from tpu_runner.estimate import candidate_hbm_bytes, estimate, performance_flags
from tpu_runner.hardware import ChipSpec, Roofline, roofline
from tpu_runner.inputs import Case, case_inputs
from tpu_runner.measure import measure_pair
from tpu_runner.profile import kernel_facts
from tpu_runner.result import EvalError, Performance
from tpu_runner.tasks import Configuration, Task

Compiled = dict[str, Any]  # {"report": CompileReport, "traffic": TrafficReport, "vmem_limits": [...], "ir_hash": str}
ReferenceCost = dict[str, Any]  # {"cycles": int, "ops": [...], "cost": {...}, "compile_seconds": float}


class MismatchWhileTiming(Exception):
    def __init__(self, error: EvalError):
        super().__init__(error.detail)
        self.error = error


def _roofline(chip: ChipSpec, configs: list[Configuration], cand: list[Compiled], ref: list[ReferenceCost]) -> Roofline:
    """The task's work (the reference's FLOPs) against its compulsory traffic (inputs read, outputs written once)."""
    flops = sum(r["cost"].get("flops", 0.0) for r in ref)
    compulsory = sum(sum(a.nbytes for a in cfg.dynamic) for cfg in configs) + sum(
        c["report"].memory.get("output_size_in_bytes", 0) for c in cand)
    dtype = configs[0].dynamic[0].dtype if configs and configs[0].dynamic else "float32"
    return roofline(chip, flops=flops, bytes_moved=compulsory, dtype_name=dtype)


def _roofline_dict(roof: Roofline) -> dict[str, Any]:
    return {"seconds": roof.seconds, "bound": roof.bound, "flops": roof.flops, "bytes": roof.bytes,
            "intensity": roof.intensity}


def _kernels(chip: ChipSpec, cand: list[Compiled]) -> list[dict[str, Any]]:
    return [f for c in cand for f in kernel_facts(c["traffic"], chip, c["vmem_limits"])]


def estimated_performance(chip: ChipSpec, mode: str, prod: list[Configuration], cand: list[Compiled],
                          ref: list[ReferenceCost]) -> tuple[Performance, dict[str, Any]]:
    c_cycles = sum(c["report"].cycles for c in cand)
    c_bytes = sum(candidate_hbm_bytes(c["traffic"], c["report"].cost) for c in cand)
    r_cycles = sum(r["cycles"] for r in ref)
    r_bytes = sum(r["cost"].get("bytes accessed", 0.0) for r in ref)
    roof = _roofline(chip, prod, cand, ref)
    c_est = estimate(chip, cycles=c_cycles, hbm_bytes=c_bytes, mode=mode)
    r_est = estimate(chip, cycles=r_cycles, hbm_bytes=r_bytes, mode=mode)
    # Far below the roofline is suspicious (flagged); just below it is the cycle model's optimism, and no kernel
    # runs faster than the roofline, so both estimates are bounded by it.
    flags = performance_flags(candidate_seconds=c_est.seconds, roofline=roof)
    c_s, r_s = max(c_est.seconds, roof.seconds), max(r_est.seconds, roof.seconds)
    if c_s > c_est.seconds:
        flags.append(f"estimate_at_roofline: the cycle model gave {c_est.seconds * 1e3:.4g} ms, below the "
                     f"roofline; reported as the roofline")
    if not all(c["traffic"].exact for c in cand):
        flags.append("traffic_lower_bound: a kernel moves data itself (memory_space ANY); its HBM bytes are a "
                     "lower bound")
    profile = {
        "method": "estimated", "target": chip.name,
        "candidate": {**asdict(c_est), "seconds": c_s, "bound": c_est.bound,
                      "ops": [op for c in cand for op in c["report"].ops]},
        "reference": {**asdict(r_est), "seconds": r_s, "bound": r_est.bound,
                      "ops": [op for r in ref for op in r["ops"]]},
        "roofline": _roofline_dict(roof),
        "kernels": _kernels(chip, cand),
    }
    perf = Performance(
        method="estimated", unit="ms", reference=r_s * 1e3, candidate=c_s * 1e3,
        speedup=r_s / c_s if c_s else float("inf"),
        roofline_fraction=roof.seconds / c_s if c_s else None,
        roofline_ms=roof.seconds * 1e3, bound=c_est.bound, flops=roof.flops, bytes=c_bytes, flags=flags,
        detail={"candidate_cycles": c_cycles, "reference_cycles": r_cycles, "reference_bytes": r_bytes,
                "cycle_model": f"libtpu static LLO profile ({mode})", "cycles_per_second": chip.cycle_rate(mode),
                "hbm_bandwidth": chip.hbm_bandwidth, "ir_hash": cand[0]["ir_hash"] if cand else None},
    )
    return perf, profile


def measured_performance(chip: ChipSpec, task: Task, prod: list[Configuration], cand: list[Compiled],
                         ref: list[ReferenceCost], ref_fn: Any, cand_fn: Any, *, trace_dir: Path,
                         on_device: bool) -> tuple[Performance, dict[str, Any]]:
    """Time candidate and reference on this process's device, interleaved, on the first production shape."""
    config = prod[0]
    atol, rtol = task.tolerance(0)
    input_sets = [case_inputs(config, Case(f"timing{i}", "normal", 7 + i)) for i in range(3)]
    pair = measure_pair(reference=ref_fn, candidate=cand_fn, input_sets=input_sets,  # type: ignore[arg-type]
                        static=config.static, trace_dir=trace_dir, atol=atol, rtol=rtol)
    if pair.mismatches:
        raise MismatchWhileTiming(EvalError("mismatch_while_timing", "outputs produced while timing differ from "
                                            "the reference's on the same inputs: " + pair.mismatches[0]))
    roof = _roofline(chip, prod[:1], cand[:1], ref[:1])
    c_s, r_s = pair.candidate.median_ms / 1e3, pair.reference.median_ms / 1e3
    profile = {
        "method": "measured", "target": chip.name,
        "candidate": {"seconds": c_s, "spread": pair.candidate.spread_ms / 1e3, "ops": []},
        "reference": {"seconds": r_s, "spread": pair.reference.spread_ms / 1e3, "ops": []},
        "roofline": _roofline_dict(roof),
        "kernels": _kernels(chip, cand),
    }
    perf = Performance(
        method="measured", unit="ms", reference=r_s * 1e3, candidate=c_s * 1e3, speedup=pair.speedup,
        # Against a TPU roofline only when timed on that TPU; CPU-backend times are not comparable to it.
        roofline_fraction=roof.seconds / c_s if on_device and c_s else None, roofline_ms=roof.seconds * 1e3,
        bound=roof.bound, flops=roof.flops, bytes=roof.bytes,
        flags=performance_flags(candidate_seconds=c_s, roofline=roof) if on_device else [],
        detail={"device": jax.devices()[0].device_kind, "source": pair.candidate.source,
                "iterations": len(pair.candidate.samples_ms), "candidate_spread_ms": pair.candidate.spread_ms,
                "reference_spread_ms": pair.reference.spread_ms, "configuration": config.describe()},
    )
    return perf, profile
