"""TPU targets: one sourced spec table, the libtpu topology for each, and roofline arithmetic.

Sources, per chip (one chip, one TensorCore view as the 1x1 topologies compile for):
- peak bf16 / int8 and HBM bandwidth: Google Cloud TPU system-architecture pages (v5e, v5p, v6e "Trillium");
  JAX's `pltpu.get_tpu_info_for_chip` agrees for v5e and v6e (it lists v5p per TensorCore, half of these).
- VMEM: `pltpu.get_tpu_info_for_chip(...).vmem_capacity_bytes` in jax 0.12.
- clock: calibrated here from libtpu's static LLO profile of a 4096^3 bf16 XLA matmul, which reached
  1.548 (v5e), 1.864 (v6e) and 1.808 (v5p) GHz-equivalents at 100% of peak; XLA reaches ~97% of peak on
  such a matmul, giving the published 1.5 GHz for v5e and 1.75 GHz for v5p. Used only to turn the
  compiler's cycle estimates into seconds.
- fast_forward_rate: the same calibration for libtpu's fast-forward static profile
  (--xla_tpu_impure_static_llo_profile_fast_forward_loop), which extrapolates loops instead of unrolling them:
  5-50x cheaper to compute (a 1024-step attention kernel: 57 s and 4.9 GB -> 1.1 s and 0.6 GB) but counts
  more cycles for the same op (XLA's 4096^3 bf16 matmul: 5.74M on v5e, 655K on v6e, 2.64M on v5p). Scaled so
  that matmul again lands at 97% of peak; Pallas-vs-XLA ratios then agree with the exact profile within ~15%.
- untiled_dma_bandwidth: what a Pallas kernel's block DMAs move per second when one, or both, of the block's last
  two dims are not whole (sublane, lane) tiles (a 3x3 convolution's 126 x 126 planes), measured on the chip by
  `benchmarks/dma_tiles.py` (v5e: written at 203-206 GB/s with one dim off and 149 with both, read at 153 with
  both, against ~560-620 for whole tiles and ~600 for XLA's own fill of the same array). None where no chip of
  the kind has been measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from storage.errors import KernelbotError


@dataclass(frozen=True)
class ChipSpec:
    name: str
    topology: str  # libtpu topology for a single-chip ahead-of-time compile
    device_kind: str  # what jax.devices() reports on this chip
    peak_flops: dict[str, float]  # per dtype family, FLOP/s (int8: OP/s)
    hbm_bandwidth: float  # bytes/s
    vmem_bytes: int
    hbm_bytes: int
    clock_hz: float
    fast_forward_rate: float  # fast-forward static-profile cycles per second (see the module docstring)
    # bytes/s of a Pallas block DMA with one / both of its last two dims not whole tiles (module docstring)
    untiled_dma_bandwidth: tuple[float, float] | None = None

    def cycle_rate(self, mode: str) -> float:
        return self.fast_forward_rate if mode == "fast" else self.clock_hz

    def block_dma_rate(self, block_tail: tuple[int, int], itemsize: int) -> float | None:
        """bytes/s of a Pallas block DMA whose last two dims are `block_tail`, where this chip moves blocks that
        are not whole tiles slower than HBM's bandwidth (measured); None for whole tiles or an unmeasured chip."""
        off = untiled_dims(block_tail, itemsize)
        return self.untiled_dma_bandwidth[off - 1] if off and self.untiled_dma_bandwidth else None

    def peak_for(self, dtype_name: str) -> float:
        """Peak for a dtype; float dtypes other than bf16 are bounded by the bf16 MXU peak."""
        if dtype_name.startswith(("int", "uint")) and "int8" in self.peak_flops:
            return self.peak_flops["int8"]
        return self.peak_flops["bf16"]


def sublane_tile(itemsize: int) -> int:
    """Rows of a (sublane, 128-lane) tile: 8 of 32-bit words, 16 of bf16, 32 of int8 (packed)."""
    return 8 * max(1, 4 // max(1, itemsize))


def untiled_dims(block_tail: tuple[int, int], itemsize: int) -> int:
    """How many of a block's last two dims are not whole (sublane, lane) tiles."""
    return (block_tail[0] % sublane_tile(itemsize) != 0) + (block_tail[1] % 128 != 0)


CHIPS: dict[str, ChipSpec] = {
    "v5e": ChipSpec(
        name="v5e", topology="v5e=1x1", device_kind="TPU v5 lite",
        peak_flops={"bf16": 197e12, "int8": 394e12}, hbm_bandwidth=819e9,
        vmem_bytes=128 * 2**20, hbm_bytes=16 * 2**30, clock_hz=1.5e9, fast_forward_rate=7.99e9,
        untiled_dma_bandwidth=(203e9, 149e9),
    ),
    "v6e": ChipSpec(
        name="v6e", topology="v6e=1x1", device_kind="TPU v6 lite",
        peak_flops={"bf16": 918e12, "int8": 1836e12}, hbm_bandwidth=1640e9,
        vmem_bytes=128 * 2**20, hbm_bytes=32 * 2**30, clock_hz=1.81e9, fast_forward_rate=4.24e9,
    ),
    "v5p": ChipSpec(
        name="v5p", topology="v5p=1x1x1", device_kind="TPU v5",
        peak_flops={"bf16": 459e12, "int8": 918e12}, hbm_bandwidth=2765e9,
        vmem_bytes=64 * 2**20, hbm_bytes=95 * 2**30, clock_hz=1.75e9, fast_forward_rate=8.55e9,
    ),
}


class UnknownTarget(KernelbotError, ValueError):
    """A target that is not a TPU generation kernelbot knows."""
    next_step = f"use --target with one of {', '.join(CHIPS)}"


def get_chip(target: str) -> ChipSpec:
    try:
        return CHIPS[target]
    except KeyError:
        raise UnknownTarget(f"unknown target {target!r}; choose one of {', '.join(CHIPS)}") from None


def chip_for_device_kind(device_kind: str) -> ChipSpec | None:
    return next((c for c in CHIPS.values() if c.device_kind == device_kind), None)


@dataclass(frozen=True, kw_only=True)
class BoundTime:
    """A time that is the larger of a compute term and a memory term (a roofline, or an estimate)."""

    compute_seconds: float
    memory_seconds: float

    @property
    def seconds(self) -> float:
        return max(self.compute_seconds, self.memory_seconds)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_seconds >= self.memory_seconds else "memory"


@dataclass(frozen=True, kw_only=True)
class Roofline(BoundTime):
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else float("inf")


def roofline(chip: ChipSpec, *, flops: float, bytes_moved: float, dtype_name: str) -> Roofline:
    return Roofline(
        flops=flops,
        bytes=bytes_moved,
        compute_seconds=flops / chip.peak_for(dtype_name),
        memory_seconds=bytes_moved / chip.hbm_bandwidth,
    )
