"""What the compiler's figures miss on the hardware: the timing model's factors and its error bands.

Fitted by `benchmarks/fit_timing_model.py` on the measured suite (`benchmarks/measured/`: XLA's device time on
TPU v6e, median of 50, bf16 inputs) and on the Pallas TPU matmul guide's measurements (v5e). A factor multiplies
one source's compute time for one class of operation; it is a property of the hardware and the compiler (how
far XLA's tiling cost model or the static LLO profile is from the chip), never of a task: no task name or
measured time is looked up at run time. Other TPU generations use the same factors (not yet checked against a
measurement there; their bands say so by being the widest), unless a chip has factors of its own: fitted by the
same script on that chip's measurements (`benchmarks/on_chip.py --log` on a TPU host, then
`benchmarks/estimate_fidelity.py --measured-log` and `fit_timing_model.py --write`), kept as data beside this
module (`fitted/<target>.json`), with that chip's own leave-one-out bands.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# (source, operation class) -> factor on that source's compute time. Unlisted pairs: 1.0.
# Fitted on the 23 workloads of benchmarks/measured (v6e): XLA's cost model is close for 2-D matmuls (0.95) and
# about twice too slow for elementwise, reduction and layout-copy fusions, which run near HBM bandwidth.
FACTORS: dict[tuple[str, str], float] = {
    ("xla", "batched_matmul"): 0.723,
    ("xla", "convolution"): 0.779,
    ("xla", "copy"): 0.387,
    ("xla", "elementwise"): 0.522,
    ("xla", "matmul"): 0.928,
    ("xla", "reduction"): 0.461,
}

# The share of the published HBM bandwidth a streaming op reaches, by the bytes cost analysis counts, for XLA's
# ops and Pallas kernels' DMAs alike (fitted with FACTORS: the measured memory-bound programs moved their counted
# bytes at ~1.0-1.1 TB/s of v6e's 1.64; layout padding of small minor dimensions is part of it).
HBM_EFFICIENCY = 0.622

# Each top-level op's fixed cost on the device (launch, pipeline fill): ~1 us, the order of the smallest ops'
# measured times.
LAUNCH_SECONDS = 1.0e-6

# A Pallas kernel's cost per grid step besides its DMAs and compute (pipeline bookkeeping, DMA issue and wait),
# which the static profile does not see: the Pallas matmul guide's 128x128x128-block kernels on v5e took
# ~0.23 us per step more than their traffic's time at HBM_EFFICIENCY (32k and 262k steps, plain, transposed and
# fused alike): ~350 cycles at v5e's 1.5 GHz.
GRID_STEP_CYCLES = 350

# Elementwise throughput when nothing better is known: 8 sublanes x 128 lanes, one result per lane per cycle.
VPU_ELEMENTS_PER_CYCLE = 1024

# The measured spread of true / estimated time per class: the 10th and 90th percentiles of each workload's
# measured / estimated time with factors fitted without it (leave-one-out), at least +-10%; a class seen in
# fewer than 3 workloads gets the spread of all. A program's band is that of the class its time is mostly in.
# `kernel` (Pallas kernels: static profile + per-step cost + BlockSpec traffic) comes from the Pallas matmul
# guide's kernels on v5e (estimated 0.99-1.24x of measured at 4096 and 8192).
BANDS: dict[str, tuple[float, float]] = {
    "batched_matmul": (0.66, 1.89),  # 4 workloads: attention and MoE einsums, the least predictable
    "convolution": (0.78, 1.16),  # 2 workloads: the spread of all
    "elementwise": (0.83, 1.41),  # 3 workloads
    "matmul": (0.78, 1.13),  # 14 workloads
    "reduction": (0.78, 1.16),  # no workload mostly in it: the spread of all
    "copy": (0.78, 1.16),
    "kernel": (0.75, 1.25),  # one kernel family (matmuls), in the sample its per-step cost was fitted on
}
DEFAULT_BAND = (0.6, 1.6)  # a class the measurements do not cover (sorts, scatters, XLA's own custom calls)
FITTED_ON = "v6e"  # where the tables above were measured; a chip without a fit of its own widens their bands
UNMEASURED_WIDENING = 1.25


FITTED = Path(__file__).resolve().parent / "fitted"  # <target>.json: a chip's own factors, bands, the fit's data


@dataclass(frozen=True)
class Calibration:
    """The factors and bands an estimate for one chip uses, and the chip whose measurements they were fitted on."""

    fitted_on: str
    factors: Mapping[tuple[str, str], float]
    hbm_efficiency: float
    bands: Mapping[str, tuple[float, float]]
    default_band: tuple[float, float]
    # Elements a Pallas kernel's vector unit gets through per cycle, fitted on the chip's measured kernels
    # (`benchmarks/fit_kernel_model.py`): with it, a kernel takes at least the task's elementwise work at that rate.
    # None where no kernel was measured on the chip (the static profile and the MXU floor alone).
    kernel_vpu_per_cycle: float | None = None

    def factor(self, source: str, op_class: str) -> float:
        return self.factors.get((source, op_class), 1.0)


# Every figure as the compiler gives it: what a fit starts from.
UNCALIBRATED = Calibration("none", {}, 1.0, {}, DEFAULT_BAND)


@functools.cache
def _fitted(target: str) -> Calibration | None:
    path = FITTED / f"{target}.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    factors = {tuple(key.split("/", 1)): value for key, value in data["factors"].items()}
    # Pallas kernels' band: from the chip's own measured kernels where `fit_kernel_model.py` wrote one, else from
    # the kernels measured for the per-step cost (on v5e); never from XLA programs.
    kernel = data.get("kernel") or {}
    bands = {**{k: tuple(v) for k, v in data["bands"].items()}, "kernel": tuple(kernel.get("band", BANDS["kernel"]))}
    return Calibration(target, factors, data["hbm_efficiency"], bands, tuple(data["default_band"]),
                       kernel.get("vpu_elements_per_cycle"))


def for_target(target: str) -> Calibration:
    """The chip's own fitted calibration when it has one, else the one fitted on v6e (read at each call, so the
    module's tables stay the one place v6e's live)."""
    return _fitted(target) or Calibration(FITTED_ON, FACTORS, HBM_EFFICIENCY, BANDS, DEFAULT_BAND)


def band(op_class: str, target: str) -> tuple[float, float]:
    calibration = for_target(target)
    low, high = calibration.bands.get(op_class, calibration.default_band)
    if target != calibration.fitted_on:  # another chip's bands
        low, high = low / UNMEASURED_WIDENING, high * UNMEASURED_WIDENING
    return low, high
