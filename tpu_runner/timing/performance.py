"""Stage 5: the candidate's time against the reference's, estimated from the compile or measured on a device.

Both builders return the `Performance` record and the plain-data profile that `profile.summarise` and the
chart read. Everything they use was produced where the candidate never ran - the compile servers' answers -
except the kernels' traffic, which is computed from the candidate's grid and BlockSpecs, and the times measured
in the candidate's process on a device.

The estimate is the same model for candidate and reference (`timing.model`: op by op, calibrated on measured
TPU times), with the likely range of the speedup it implies (`band`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy, for operands' dtype names
import numpy as np

from tpu_runner.analysis import HloOp, TrafficReport
from tpu_runner.compiler import CompileAnswer
from tpu_runner.hardware import ChipSpec, Roofline, roofline, sublane_tile
from tpu_runner.reports import MeasuredTimes, Performance
from tpu_runner.tasks import Configuration
from tpu_runner.timing.band import measured_band, program_band, speedup_band
from tpu_runner.timing.model import KERNEL_TARGET, ProgramTime, programs_time
from tpu_runner.timing.profile import kernel_facts
from tpu_runner.timing.roofline import candidate_hbm_bytes, performance_flags, traffic_flags


@dataclass(frozen=True)
class CandidateProgram:
    """The candidate at one production configuration: its compile answer and its kernels' traffic."""

    compiled: CompileAnswer
    traffic: TrafficReport
    vmem_limits: list[int | None]
    ir_hash: str | None


def _roofline(chip: ChipSpec, configs: list[Configuration], cand: list[CandidateProgram],
              ref: list[CompileAnswer], used: list[list[float]] | None = None) -> Roofline:
    """The task's work (the reference's FLOPs) against its compulsory traffic: the inputs it reads, read once, and
    its outputs written once (an input the reference ignores costs nothing; of one it masks with a constant
    predicate, only the share its outputs can depend on: a causal attention's score bias, below the diagonal).
    Matmul work the candidate's program cannot do (beyond the most its kernels' bodies and grids and its XLA ops
    can: a mixture of experts' unchosen experts, which the reference computes and weights by zero) is not counted:
    a time below the reference's FLOPs at peak is then what skipping that work gives, and correctness, checked on
    every input set and while timing, decides whether the skipped work was needed."""
    flops = sum(r.cost.get("flops", 0.0) - _skipped_flops(c, r) for c, r in zip(cand, ref, strict=True))
    reads = [u if u else [1.0] * len(cfg.dynamic) for cfg, u in zip(configs, used or [None] * len(configs),
                                                                     strict=True)]
    compulsory = sum(sum(a.nbytes * float(read) for a, read in zip(cfg.dynamic, r, strict=True))
                     for cfg, r in zip(configs, reads, strict=True)) + sum(
        c.compiled.memory.get("output_size_in_bytes", 0) for c in cand)
    dtype = configs[0].dynamic[0].dtype if configs and configs[0].dynamic else "float32"
    return roofline(chip, flops=flops, bytes_moved=compulsory, dtype_name=dtype)


def _skipped_flops(cand: CandidateProgram, ref: CompileAnswer) -> float:
    """The reference's work that the candidate's program cannot do: its FLOPs beyond the most the candidate's
    kernels' bodies and grids can do plus its XLA ops' (XLA's count, less what it took from the kernels' own cost
    estimates, as the bytes are counted). 0 where the kernels do no matmuls or their most is unknown: then nothing
    they skip is told apart from elementwise work, which is not counted in their most."""
    most = cand.traffic.most_flops
    if not most:
        return 0.0
    claimed = sum((call.claimed_flops or 0.0) * call.multiplicity for call in cand.traffic.calls)
    around = max(0.0, cand.compiled.cost.get("flops", 0.0) - claimed)
    return max(0.0, ref.cost.get("flops", 0.0) - most - around)


def untiled_traffic(chip: ChipSpec, traffic: TrafficReport) -> tuple[float, float]:
    """The bytes of a candidate's block DMAs that this chip moves slower than its HBM bandwidth (blocks whose last
    two dims are not whole tiles: `ChipSpec.block_dma_rate`), and the seconds they take at its measured rates.
    Only planes of at least a tile's rows each way, the kind measured (a 3x3 convolution's 126 x 126 outputs; reads
    and writes alike, reads measured with both dims off); narrower blocks (rows of a bias) are left at full rate."""
    moved, seconds = 0.0, 0.0
    for call in traffic.calls:
        for op in call.operands:
            tail = tuple(1 if d is None else d for d in op.block_shape)[-2:]
            if op.in_hbm_manual or not op.bytes or len(tail) < 2:
                continue
            size = np.dtype(op.dtype).itemsize
            if min(tail[0], tail[1]) < sublane_tile(size):
                continue
            rate = chip.block_dma_rate((tail[0], tail[1]), size)
            if rate:
                moved += op.bytes * call.multiplicity
                seconds += op.bytes * call.multiplicity / rate
    return moved, seconds


def _vpu_elements(ops: Iterable[HloOp]) -> float:
    return float(sum(op.vpu_elements * op.repeat for op in ops))


def _roofline_dict(roof: Roofline) -> dict[str, Any]:
    return {"seconds": roof.seconds, "bound": roof.bound, "flops": roof.flops, "bytes": roof.bytes,
            "intensity": roof.intensity}


def _kernels(chip: ChipSpec, cand: list[CandidateProgram]) -> list[dict[str, Any]]:
    return [f for c in cand for f in kernel_facts(c.traffic, chip, c.vmem_limits)]


def estimated_performance(chip: ChipSpec, mode: str, prod: list[Configuration], cand: list[CandidateProgram],
                          ref: list[CompileAnswer], used: list[list[float]] | None = None
                          ) -> tuple[Performance, dict[str, Any], list[str]]:
    """The estimate, its profile, and notes on how it was made when that is not the usual way."""
    notes: list[str] = []
    c_bytes = sum(candidate_hbm_bytes(c.traffic, c.compiled.cost) for c in cand)
    r_bytes = sum(r.cost.get("bytes accessed", 0.0) for r in ref)
    roof = _roofline(chip, prod, cand, ref, used)
    # A kernel does at least the task's work that the XLA ops around it do not, in as many MXU passes as its dots'
    # precision takes (an f32 dot at HIGHEST: six): its time without a profile, and the least it takes with one.
    # Less the matmul work the kernels' bodies and grids cannot do (a mixture of experts' unchosen experts).
    kernel_flops = [max(0.0, r.cost.get("flops", 0.0) - sum(op.flops * op.repeat for op in c.compiled.hlo_ops
                                                             if op.target != KERNEL_TARGET)
                        - _skipped_flops(c, r)) * c.traffic.mxu_passes
                    for c, r in zip(cand, ref, strict=True)]
    # Likewise the task's elementwise and reduction work the XLA ops around the kernels leave to them (XLA's
    # count of its own program's elements, a floor where the chip's vector rate was fitted).
    kernel_vpu = [max(0.0, _vpu_elements(r.hlo_ops) - _vpu_elements(op for op in c.compiled.hlo_ops
                                                                    if op.target != KERNEL_TARGET))
                  for c, r in zip(cand, ref, strict=True)]
    # Blocks the chip moves slower than its bandwidth are timed at their own rate, the rest of the bytes at HBM's.
    untiled = [untiled_traffic(chip, c.traffic) for c in cand]
    tiled_bytes = [float(c.traffic.total_hbm_bytes) - moved for c, (moved, _) in zip(cand, untiled, strict=True)]
    c_time = programs_time(chip, [c.compiled for c in cand], mode=mode, kernel_bytes=tiled_bytes,
                           kernel_flops=kernel_flops, kernel_steps=[grid_steps(c.traffic) for c in cand],
                           kernel_vpu=kernel_vpu, kernel_untiled_seconds=[seconds for _, seconds in untiled])
    r_time = programs_time(chip, ref, mode=mode)
    failed = [(who, a.profile_failure) for who, answers in (("candidate", [c.compiled for c in cand]),
                                                             ("reference", ref))
              for a in answers if a.profile_failure]
    unprofiled_kernels = any(op.source == "work" and op.op_class == "kernel" for op in c_time.ops)
    if unprofiled_kernels and not any(who == "candidate" for who, _ in failed):
        notes.append("libtpu's static profile has no cycles for the candidate's kernels; they are estimated from "
                     "the task's FLOPs at the MXU peak and their BlockSpec traffic instead")
    for who, why in dict(failed).items():
        if who == "candidate" and unprofiled_kernels:
            notes.append(f"no static cycle profile for the candidate's program ({why}); its kernels are estimated "
                         "from the task's FLOPs at the MXU peak and their BlockSpec traffic instead")
        else:
            notes.append(f"no static cycle profile for the {who}'s program ({why}); its XLA ops are timed from "
                         "XLA's own cost model, which needs none")
    # Far below the roofline is suspicious (flagged); just below it is the model's optimism, and no program
    # runs faster than the roofline, so both estimates are bounded by it.
    exact_traffic = all(c.traffic.exact for c in cand)
    # Bytes a kernel moves itself are not counted, so a shortfall is only evidence when the count is exact.
    flags = traffic_flags(candidate_bytes=c_bytes, roofline=roof, chip_bandwidth=chip.hbm_bandwidth) \
        if exact_traffic else []
    c_s, r_s = max(c_time.seconds, roof.seconds), max(r_time.seconds, roof.seconds)
    if c_s > c_time.seconds:
        flags.append(f"estimate_at_roofline: the model gave {c_time.seconds * 1e3:.4g} ms, below the "
                     f"roofline; reported as the roofline")
    if not exact_traffic:
        flags.append("traffic_lower_bound: a kernel's HBM bytes are not exact (it moves data itself with "
                     "memory_space ANY, or its grid is known only at run time), so they are a lower bound and a "
                     "shortfall against the task's bytes is not evidence")
    c_band = program_band(c_time.by_class(), chip.name)
    r_band = program_band(r_time.by_class(), chip.name)
    speedup = r_s / c_s if c_s else float("inf")
    profile = {
        "method": "estimated", "target": chip.name,
        "candidate": _program_profile(c_time, c_s, c_bytes, [op for c in cand for op in c.compiled.ops]),
        "reference": _program_profile(r_time, r_s, r_bytes, [op for r in ref for op in r.ops]),
        "roofline": _roofline_dict(roof),
        "kernels": _kernels(chip, cand),
    }
    band = speedup_band(speedup, r_band, c_band) if c_s else None
    profile["band"] = band
    perf = Performance(
        method="estimated", unit="ms", reference=r_s * 1e3, candidate=c_s * 1e3, speedup=speedup,
        roofline_fraction=roof.seconds / c_s if c_s else None,
        roofline_ms=roof.seconds * 1e3, bound=c_time.bound, flops=roof.flops, bytes=c_bytes, flags=flags,
        band=band,
        detail={"candidate_cycles": sum(n for c in cand for _, n in c.compiled.ops),
                "reference_cycles": sum(n for r in ref for _, n in r.ops), "reference_bytes": r_bytes,
                "cycle_model": f"{c_time.how} (candidate); {r_time.how} (reference)",
                "band_basis": {"candidate": [c_band[0], c_band[1]], "reference": [r_band[0], r_band[1]],
                               "meaning": "true / estimated time, from the measured fidelity of the class "
                                          "most of each program's time is in"},
                "cycles_per_second": chip.cycle_rate(mode),
                "hbm_bandwidth": chip.hbm_bandwidth, "ir_hash": cand[0].ir_hash if cand else None},
    )
    return perf, profile, notes


def grid_steps(traffic: TrafficReport) -> int:
    return sum(call.grid_steps * call.multiplicity for call in traffic.calls)


def _program_profile(timed: ProgramTime, seconds: float, hbm_bytes: float, cycles: list[tuple[str, int]]
                     ) -> dict[str, Any]:
    """What the profile summary, the chart and the trace read of one program's estimate: its ops as (name, ns) in
    the order the program runs them, and each op's class (kernel, matmul, elementwise, ...)."""
    timed_ops = [op for op in timed.ops if op.seconds > 0]
    return {"cycles": sum(n for _, n in cycles), "hbm_bytes": hbm_bytes, "compute_seconds": timed.compute_seconds,
            "memory_seconds": timed.memory_seconds, "seconds": seconds, "bound": timed.bound,
            "ops": [(op.name, round(op.seconds * 1e9)) for op in timed_ops],
            "op_classes": {op.name: op.op_class for op in timed_ops},
            "by_class": timed.by_class(),
            # What a kernel's time rests on, for refitting the chip's vector rate without evaluating again.
            "kernel_ops": [{"name": op.name, "compute_before_vector": op.compute_before_vector,
                            "memory": op.memory_seconds, "fixed": op.fixed_seconds, "repeat": op.repeat,
                            "vector_elements": op.vector_elements}
                           for op in timed.ops if op.op_class == "kernel"]}


def measured_performance(chip: ChipSpec, prod: list[Configuration], cand: list[CandidateProgram],
                         ref: list[CompileAnswer], measured: MeasuredTimes, used: list[list[float]] | None = None,
                         estimate: Performance | None = None) -> tuple[Performance, dict[str, Any]]:
    """Times the candidate's child measured on its device (candidate and reference interleaved, first
    production shape), against the roofline of the compiled programs; `estimate`, the static estimate of the
    same programs, is kept beside the measurement (`detail["estimate"]`)."""
    on_device = measured.on_device
    roof = _roofline(chip, prod[:1], cand[:1], ref[:1], (used or [])[:1] or None)
    c_s, r_s = measured.candidate_ms / 1e3, measured.reference_ms / 1e3
    speedup = r_s / c_s if c_s else 0.0
    band = measured_band(speedup, (measured.reference_ms, measured.reference_spread_ms),
                         (measured.candidate_ms, measured.candidate_spread_ms)) if c_s else None
    profile = {
        "method": "measured", "target": chip.name, "device": measured.device,
        "candidate": {"seconds": c_s, "spread": measured.candidate_spread_ms / 1e3,
                      "ops": [(name, round(ns)) for name, ns in measured.candidate_ops]},
        "reference": {"seconds": r_s, "spread": measured.reference_spread_ms / 1e3,
                      "ops": [(name, round(ns)) for name, ns in measured.reference_ops]},
        "roofline": _roofline_dict(roof),
        "kernels": _kernels(chip, cand),
        "band": band,
    }
    detail: dict[str, Any] = {
        "device": measured.device, "source": measured.source, "iterations": measured.iterations,
        "candidate_spread_ms": measured.candidate_spread_ms, "reference_spread_ms": measured.reference_spread_ms,
        "configuration": measured.configuration}
    if estimate is not None:
        detail["estimate"] = {"speedup": estimate.speedup, "candidate_ms": estimate.candidate,
                              "reference_ms": estimate.reference, "band": estimate.band}
        profile["estimate"] = detail["estimate"]
    perf = Performance(
        method="measured", unit="ms", reference=r_s * 1e3, candidate=c_s * 1e3, speedup=speedup,
        # Against a TPU roofline only when timed on that TPU; CPU-backend times are not comparable to it.
        roofline_fraction=roof.seconds / c_s if on_device and c_s else None, roofline_ms=roof.seconds * 1e3,
        bound=roof.bound, flops=roof.flops, bytes=roof.bytes,
        flags=performance_flags(candidate_seconds=c_s, roofline=roof) if on_device else [],
        detail=detail, band=band,
    )
    return perf, profile
