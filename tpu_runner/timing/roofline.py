"""Stage 5 without hardware: the bytes a candidate moves, and the flags a time earns against the roofline.

A Pallas candidate's bytes come from its grid and BlockSpecs (`traffic.py`), plus whatever XLA code surrounds
its kernels - never from the candidate's own CostEstimate. The time itself is `model`'s; `estimate` here is
the whole-program model before it (static cycles / clock against HBM bytes / bandwidth), kept as the baseline
`benchmarks/estimate_fidelity.py` compares against.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_runner.analysis import TrafficReport
from tpu_runner.hardware import BoundTime, ChipSpec, Roofline

# Anything estimated or measured below this fraction of the roofline time beats physics.
PHYSICS_MARGIN = 0.9


@dataclass(frozen=True, kw_only=True)
class TimeEstimate(BoundTime):
    cycles: int
    hbm_bytes: float


def estimate(chip: ChipSpec, *, cycles: int, hbm_bytes: float, mode: str = "fast") -> TimeEstimate:
    return TimeEstimate(cycles=cycles, hbm_bytes=hbm_bytes, compute_seconds=cycles / chip.cycle_rate(mode),
                        memory_seconds=hbm_bytes / chip.hbm_bandwidth)


def candidate_hbm_bytes(traffic: TrafficReport, cost: dict[str, float]) -> float:
    """Pallas traffic from the BlockSpecs, plus the bytes of the XLA ops around the kernels.

    XLA's module-wide 'bytes accessed' counts each custom call as its claimed bytes (CostEstimate) or its
    operands and results; that part is removed and replaced by the evaluator's own figure.
    """
    xla_total = cost.get("bytes accessed")
    if xla_total is None:
        return float(traffic.total_hbm_bytes)
    counted_for_kernels = sum(
        (call.claimed_bytes if call.claimed_bytes is not None else call.io_bytes) * call.multiplicity
        for call in traffic.calls)
    return float(traffic.total_hbm_bytes) + max(0.0, xla_total - counted_for_kernels)


def performance_flags(*, candidate_seconds: float, roofline: Roofline) -> list[str]:
    """For a measured time: below the roofline is beyond what the chip can do."""
    flags: list[str] = []
    if candidate_seconds < PHYSICS_MARGIN * roofline.seconds:
        flags.append(f"faster_than_physics: {candidate_seconds * 1e3:.4g} ms is below the {roofline.bound} roofline "
                     f"of {roofline.seconds * 1e3:.4g} ms")
    return flags


def traffic_flags(*, candidate_bytes: float, roofline: Roofline, chip_bandwidth: float) -> list[str]:
    """For an estimate: a cycle count below the roofline is the model's optimism (the figure is then the
    roofline), but a kernel whose own grid and BlockSpecs move fewer bytes than the task's inputs and outputs
    hold skips data no correct kernel can skip."""
    if candidate_bytes < PHYSICS_MARGIN * roofline.bytes:
        return [f"faster_than_physics: its grid moves {candidate_bytes / 1e6:.4g} MB, less than the "
                f"{roofline.bytes / 1e6:.4g} MB of inputs the task reads and outputs it writes "
                f"({candidate_bytes / chip_bandwidth * 1e3:.4g} ms at HBM bandwidth is below the memory "
                f"roofline of {roofline.bytes / chip_bandwidth * 1e3:.4g} ms)"]
    return []
