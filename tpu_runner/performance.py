"""Stage 5: the candidate's time against the reference's, estimated from the compile or measured on a device.

Both builders return the `Performance` record and the plain-data profile that `profile.summarise` and the
chart read. Everything they use was produced where the candidate never ran - the compile servers' answers -
except the kernels' traffic, which is computed from the candidate's grid and BlockSpecs, and the times measured
in the candidate's process on a device.

The estimate is the same model for candidate and reference: max(static cycles / clock, HBM bytes / bandwidth)
when libtpu's static profiler gave cycles for both; when it could not (it aborts on some programs), both fall
back to the roofline of the compiler's cost analysis, max(FLOPs / peak, bytes / bandwidth), and say so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tpu_runner.compile_service import CompileAnswer
from tpu_runner.estimate import TimeEstimate, candidate_hbm_bytes, estimate, performance_flags, traffic_flags
from tpu_runner.hardware import ChipSpec, Roofline, roofline
from tpu_runner.profile import kernel_facts
from tpu_runner.result import Performance
from tpu_runner.tasks import Configuration
from tpu_runner.traffic import TrafficReport


@dataclass(frozen=True)
class CandidateProgram:
    """The candidate at one production configuration: its compile answer and its kernels' traffic."""

    compiled: CompileAnswer
    traffic: TrafficReport
    vmem_limits: list[int | None]
    ir_hash: str | None


def _roofline(chip: ChipSpec, configs: list[Configuration], cand: list[CandidateProgram],
              ref: list[CompileAnswer], used: list[list[bool]] | None = None) -> Roofline:
    """The task's work (the reference's FLOPs) against its compulsory traffic: the inputs it reads, read once, and
    its outputs written once (an input the reference ignores costs nothing)."""
    flops = sum(r.cost.get("flops", 0.0) for r in ref)
    reads = [u if u else [True] * len(cfg.dynamic) for cfg, u in zip(configs, used or [None] * len(configs),
                                                                      strict=True)]
    compulsory = sum(sum(a.nbytes for a, read in zip(cfg.dynamic, r, strict=True) if read)
                     for cfg, r in zip(configs, reads, strict=True)) + sum(
        c.compiled.memory.get("output_size_in_bytes", 0) for c in cand)
    dtype = configs[0].dynamic[0].dtype if configs and configs[0].dynamic else "float32"
    return roofline(chip, flops=flops, bytes_moved=compulsory, dtype_name=dtype)


def _roofline_dict(roof: Roofline) -> dict[str, Any]:
    return {"seconds": roof.seconds, "bound": roof.bound, "flops": roof.flops, "bytes": roof.bytes,
            "intensity": roof.intensity}


def _kernels(chip: ChipSpec, cand: list[CandidateProgram]) -> list[dict[str, Any]]:
    return [f for c in cand for f in kernel_facts(c.traffic, chip, c.vmem_limits)]


def estimated_performance(chip: ChipSpec, mode: str, prod: list[Configuration], cand: list[CandidateProgram],
                          ref: list[CompileAnswer], used: list[list[bool]] | None = None
                          ) -> tuple[Performance, dict[str, Any], list[str]]:
    """The estimate, its profile, and notes on how it was made when that is not the usual way."""
    notes: list[str] = []
    c_bytes = sum(candidate_hbm_bytes(c.traffic, c.compiled.cost) for c in cand)
    r_bytes = sum(r.cost.get("bytes accessed", 0.0) for r in ref)
    roof = _roofline(chip, prod, cand, ref, used)
    profiled = all(c.compiled.profiled for c in cand) and all(r.profiled for r in ref)
    if profiled:
        c_cycles = sum(sum(n for _, n in c.compiled.ops) for c in cand)
        r_cycles = sum(sum(n for _, n in r.ops) for r in ref)
        c_est = estimate(chip, cycles=c_cycles, hbm_bytes=c_bytes, mode=mode)
        r_est = estimate(chip, cycles=r_cycles, hbm_bytes=r_bytes, mode=mode)
        model = f"libtpu static LLO profile ({mode})"
    else:
        why = [a.profile_failure for a in [*(c.compiled for c in cand), *ref] if a.profile_failure]
        who = "the candidate's" if any(c.compiled.profile_failure for c in cand) else "the reference's"
        notes.append(f"no static cycle profile for {who} program ({why[0] if why else 'not profiled'}); both are "
                     "estimated from the compiler's cost analysis instead (FLOPs at peak, bytes at HBM bandwidth)")
        # The candidate does the task's work at least: its compute is the reference's FLOPs at peak.
        c_cycles = r_cycles = 0
        flops_seconds = roof.flops / chip.peak_for(prod[0].dynamic[0].dtype if prod and prod[0].dynamic else "f32")
        c_est = _fallback(flops_seconds, c_bytes, chip)
        r_est = _fallback(flops_seconds, r_bytes, chip)
        model = "cost-analysis roofline (no static profile)"
    # Far below the roofline is suspicious (flagged); just below it is the cycle model's optimism, and no kernel
    # runs faster than the roofline, so both estimates are bounded by it.
    exact_traffic = all(c.traffic.exact for c in cand)
    # Bytes a kernel moves itself are not counted, so a shortfall is only evidence when the count is exact.
    flags = traffic_flags(candidate_bytes=c_bytes, roofline=roof, chip_bandwidth=chip.hbm_bandwidth) \
        if exact_traffic else []
    c_s, r_s = max(c_est.seconds, roof.seconds), max(r_est.seconds, roof.seconds)
    if c_s > c_est.seconds and profiled:
        flags.append(f"estimate_at_roofline: the cycle model gave {c_est.seconds * 1e3:.4g} ms, below the "
                     f"roofline; reported as the roofline")
    if not exact_traffic:
        flags.append("traffic_lower_bound: a kernel's HBM bytes are not exact (it moves data itself with "
                     "memory_space ANY, or its grid is known only at run time), so they are a lower bound and a "
                     "shortfall against the task's bytes is not evidence")
    profile = {
        "method": "estimated", "target": chip.name,
        "candidate": {**asdict(c_est), "seconds": c_s, "bound": c_est.bound,
                      "ops": [op for c in cand for op in c.compiled.ops]},
        "reference": {**asdict(r_est), "seconds": r_s, "bound": r_est.bound, "ops": [op for r in ref for op in r.ops]},
        "roofline": _roofline_dict(roof),
        "kernels": _kernels(chip, cand),
    }
    perf = Performance(
        method="estimated", unit="ms", reference=r_s * 1e3, candidate=c_s * 1e3,
        speedup=r_s / c_s if c_s else float("inf"),
        roofline_fraction=roof.seconds / c_s if c_s else None,
        roofline_ms=roof.seconds * 1e3, bound=c_est.bound, flops=roof.flops, bytes=c_bytes, flags=flags,
        detail={"candidate_cycles": c_cycles, "reference_cycles": r_cycles, "reference_bytes": r_bytes,
                "cycle_model": model, "cycles_per_second": chip.cycle_rate(mode),
                "hbm_bandwidth": chip.hbm_bandwidth, "ir_hash": cand[0].ir_hash if cand else None},
    )
    return perf, profile, notes


def _fallback(compute_seconds: float, hbm_bytes: float, chip: ChipSpec) -> TimeEstimate:
    return TimeEstimate(cycles=0, hbm_bytes=hbm_bytes, compute_seconds=compute_seconds,
                        memory_seconds=hbm_bytes / chip.hbm_bandwidth)


def measured_performance(chip: ChipSpec, prod: list[Configuration], cand: list[CandidateProgram],
                         ref: list[CompileAnswer], measured: dict[str, Any], used: list[list[bool]] | None = None
                         ) -> tuple[Performance, dict[str, Any]]:
    """Times the candidate's child measured on its device (candidate and reference interleaved, first
    production shape), against the roofline of the compiled programs."""
    on_device = bool(measured.get("on_device"))
    roof = _roofline(chip, prod[:1], cand[:1], ref[:1], (used or [])[:1] or None)
    c_s, r_s = measured["candidate_ms"] / 1e3, measured["reference_ms"] / 1e3
    profile = {
        "method": "measured", "target": chip.name,
        "candidate": {"seconds": c_s, "spread": measured["candidate_spread_ms"] / 1e3, "ops": []},
        "reference": {"seconds": r_s, "spread": measured["reference_spread_ms"] / 1e3, "ops": []},
        "roofline": _roofline_dict(roof),
        "kernels": _kernels(chip, cand),
    }
    perf = Performance(
        method="measured", unit="ms", reference=r_s * 1e3, candidate=c_s * 1e3, speedup=r_s / c_s if c_s else 0.0,
        # Against a TPU roofline only when timed on that TPU; CPU-backend times are not comparable to it.
        roofline_fraction=roof.seconds / c_s if on_device and c_s else None, roofline_ms=roof.seconds * 1e3,
        bound=roof.bound, flops=roof.flops, bytes=roof.bytes,
        flags=performance_flags(candidate_seconds=c_s, roofline=roof) if on_device else [],
        detail={"device": measured["device"], "source": measured["source"], "iterations": measured["iterations"],
                "candidate_spread_ms": measured["candidate_spread_ms"],
                "reference_spread_ms": measured["reference_spread_ms"], "configuration": measured["configuration"]},
    )
    return perf, profile
