"""The time of a compiled XLA:TPU program without a TPU, op by op.

Every top-level operation of the optimised program (`hlo_ops`: fusions, copies, custom calls, loop bodies with
their trip counts) runs in turn; each takes the longer of its compute and its HBM traffic, plus a fixed launch
cost, and the program takes their sum. An op's compute comes from the best figure there is for it:

- `xla`: XLA:TPU's own tiling cost model, recorded in the op (`estimated_cycles`); present for every XLA fusion,
  copy and convolution, with or without the static profiler;
- `profile`: libtpu's static LLO profile, for the ops XLA keeps no estimate of - Pallas kernels and XLA's own
  custom calls (a kernel's cycles are those of the profile entries no other op claims);
- `work`: when neither exists (the profiler aborted on a kernel), its FLOPs at the MXU peak and its elementwise
  work at the VPU's rate - the task's FLOPs for a candidate's kernels, never the candidate's own CostEstimate.

What each figure misses on the hardware is a factor per source and operation class (`calibration.FACTORS`, or
the chip's own), fitted on measured TPU times; the same model times candidate and reference. A candidate's
kernels move the bytes its grid and BlockSpecs say (`traffic.py`), not their operands once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tpu_runner.compiler import CompileAnswer
from tpu_runner.hardware import ChipSpec
from tpu_runner.timing.calibration import (
    FACTORS,
    GRID_STEP_CYCLES,
    LAUNCH_SECONDS,
    VPU_ELEMENTS_PER_CYCLE,
    Calibration,
    for_target,
)
from tpu_runner.timing.roofline import estimate

KERNEL_TARGET = "tpu_custom_call"  # a Mosaic kernel: a Pallas kernel, or one XLA wrote itself


@dataclass(frozen=True)
class OpTime:
    name: str
    op_class: str
    source: str  # xla | profile | work
    compute_seconds: float
    memory_seconds: float
    repeat: int
    fixed_seconds: float = LAUNCH_SECONDS  # launch, and a Pallas kernel's per-grid-step cost
    # A kernel's share of the task's elementwise work per run, and its compute without that work's floor: what
    # `benchmarks/fit_kernel_model.py` refits the chip's vector rate from.
    vector_elements: float = 0.0
    compute_before_vector: float = 0.0

    @property
    def seconds(self) -> float:
        if self.op_class == "async":  # overlaps the ops after it
            return 0.0
        return (max(self.compute_seconds, self.memory_seconds) + self.fixed_seconds) * self.repeat


@dataclass(frozen=True)
class ProgramTime:
    ops: tuple[OpTime, ...]

    @property
    def seconds(self) -> float:
        return sum(op.seconds for op in self.ops)

    @property
    def compute_seconds(self) -> float:
        return sum(op.compute_seconds * op.repeat for op in self.ops)

    @property
    def memory_seconds(self) -> float:
        return sum(op.memory_seconds * op.repeat for op in self.ops)

    @property
    def bound(self) -> str:
        compute = sum(op.seconds for op in self.ops if op.compute_seconds >= op.memory_seconds)
        return "compute" if compute >= self.seconds / 2 else "memory"

    def by_class(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for op in self.ops:
            out[op.op_class] = out.get(op.op_class, 0.0) + op.seconds
        return out

    @property
    def how(self) -> str:
        counts: dict[str, int] = {}
        for op in self.ops:
            counts[op.source] = counts.get(op.source, 0) + 1
        names = {"xla": "XLA's cost model", "profile": "static profile", "work": "FLOPs and bytes"}
        return "per-op model: " + ", ".join(f"{n} op{'s' if n > 1 else ''} from {names[s]}"
                                            for s, n in sorted(counts.items()))


def _profile_cycles(answer: CompileAnswer) -> tuple[dict[str, int], int]:
    """Static-profile cycles by HLO op name, and the cycles no HLO op name claims (Pallas kernels are profiled
    under their kernel's name)."""
    names = {op.name for op in answer.hlo_ops}
    by_name: dict[str, int] = {}
    unclaimed = 0
    for name, cycles in answer.ops:
        if name in names:
            by_name[name] = by_name.get(name, 0) + cycles
        else:
            unclaimed += cycles
    return by_name, unclaimed


def program_time(chip: ChipSpec, answer: CompileAnswer, *, mode: str, kernel_bytes: float | None = None,
                 kernel_flops: float = 0.0, kernel_steps: int = 0, kernel_vpu: float = 0.0,
                 kernel_untiled_seconds: float = 0.0, calibration: Calibration | None = None) -> ProgramTime:
    """One compiled program's time. `kernel_bytes`: what its Pallas kernels move by their BlockSpecs (a candidate);
    `kernel_flops`: the MXU work its kernels must at least do; `kernel_vpu`: the elements of elementwise and
    reduction work they must at least do (a floor where the chip has a fitted vector rate); `kernel_steps`: their
    grid steps, each of which costs a fixed time besides its DMAs and compute; `kernel_untiled_seconds`: the time of
    their block DMAs the chip moves slower than its bandwidth (not in `kernel_bytes`; `untiled_traffic`);
    `calibration`: the factors (default: the chip's own, `calibration.for_target`)."""
    calibration = calibration or for_target(chip.name)
    by_name, unclaimed = _profile_cycles(answer)
    ops = answer.hlo_ops
    kernels = [op for op in ops if op.target == KERNEL_TARGET]
    # Bytes, steps and unclaimed cycles are shared among the kernels in proportion to their operands.
    kernel_io = sum(op.hbm_bytes * op.repeat for op in kernels) or 1.0
    out: list[OpTime] = []
    for op in ops:
        share = op.hbm_bytes * op.repeat / kernel_io if op in kernels else 0.0
        memory_bytes = kernel_bytes * share / op.repeat if op in kernels and kernel_bytes is not None else op.hbm_bytes
        memory = memory_bytes / (chip.hbm_bandwidth * calibration.hbm_efficiency)
        if op in kernels:
            memory += kernel_untiled_seconds * share / op.repeat
        op_class = "kernel" if op.target == KERNEL_TARGET else "async" if op.opcode == "copy-start" else op.op_class
        # XLA's estimate for a Mosaic kernel rests on the kernel's own CostEstimate: never used.
        own_estimate = op.xla_cycles if op.target != KERNEL_TARGET else 0
        # The static profile counts a kernel's code once (a grid step, a loop's body, every branch), not as it runs:
        # the least a kernel takes is still the task's FLOPs it does, at the MXU's peak (39k's convolution: 13,780
        # static cycles, 9 us, for 76 GFLOP that take at least 0.39 ms).
        kernel_work = kernel_flops * share / op.repeat if op in kernels else 0.0
        floor = kernel_work / chip.peak_flops["bf16"]
        # Nor the task's elementwise work, where the chip's kernels were measured for the rate: a loop's body
        # counted once left 39k's GELU over 528M outputs (~12G elements) out of its cycles (0.45 ms estimated,
        # 1.78 measured on a v5e).
        vector_elements = kernel_vpu * share / op.repeat if op in kernels else 0.0
        rate = calibration.kernel_vpu_per_cycle
        vector_floor = vector_elements / (rate * chip.clock_hz) if rate else 0.0
        # A kernel profiled at 0 cycles was not profiled (libtpu leaves some kernels empty), not free.
        if op.name in by_name and not own_estimate and (by_name[op.name] or op not in kernels):
            source, cycles = "profile", by_name[op.name] / op.repeat
            compute = max(cycles / chip.cycle_rate(mode), floor)
        elif own_estimate:
            source, compute = "xla", own_estimate / chip.clock_hz
        elif op in kernels and unclaimed:
            source, compute = "profile", max(unclaimed * share / op.repeat / chip.cycle_rate(mode), floor)
        else:
            flops = op.flops or kernel_work
            source = "work"
            compute = max(flops / chip.peak_flops["bf16"], op.vpu_elements / (VPU_ELEMENTS_PER_CYCLE * chip.clock_hz))
        steps = kernel_steps * share / op.repeat if op in kernels else 0.0
        fixed = LAUNCH_SECONDS + steps * GRID_STEP_CYCLES / chip.clock_hz
        compute *= calibration.factor(source, op_class)
        out.append(OpTime(op.name, op_class, source, max(compute, vector_floor), memory, op.repeat, fixed,
                          vector_elements, compute))
    return ProgramTime(tuple(out))


def programs_time(chip: ChipSpec, answers: Sequence[CompileAnswer], *, mode: str,
                  kernel_bytes: Sequence[float | None] | None = None,
                  kernel_flops: Sequence[float] | None = None, kernel_steps: Sequence[int] | None = None,
                  kernel_vpu: Sequence[float] | None = None, kernel_untiled_seconds: Sequence[float] | None = None,
                  calibration: Calibration | None = None) -> ProgramTime:
    """Several programs (one per production configuration) run one after another."""
    ops: list[OpTime] = []
    for i, answer in enumerate(answers):
        kb = kernel_bytes[i] if kernel_bytes else None
        kf = kernel_flops[i] if kernel_flops else 0.0
        ks = kernel_steps[i] if kernel_steps else 0
        kv = kernel_vpu[i] if kernel_vpu else 0.0
        ku = kernel_untiled_seconds[i] if kernel_untiled_seconds else 0.0
        ops.extend(program_time(chip, answer, mode=mode, kernel_bytes=kb, kernel_flops=kf, kernel_steps=ks,
                                kernel_vpu=kv, kernel_untiled_seconds=ku, calibration=calibration).ops)
    return ProgramTime(tuple(ops))


def static_profile_time(chip: ChipSpec, answers: Sequence[CompileAnswer], mode: str) -> float | None:
    """The model before this one: the whole program's static cycles against its bytes at HBM bandwidth (kept as
    the baseline `benchmarks/estimate_fidelity.py` compares against)."""
    if not all(a.profiled for a in answers):
        return None
    return estimate(chip, cycles=sum(n for a in answers for _, n in a.ops), mode=mode,
                    hbm_bytes=sum(a.cost.get("bytes accessed", 0.0) for a in answers)).seconds


__all__ = ["FACTORS", "OpTime", "ProgramTime", "program_time", "programs_time", "static_profile_time"]
