"""The scan kernels' parameters: the TUNABLE spaces the search and the autotuner move in, apart from the brain's own
first choice in them (from the roofline and the size of a streamed block), which comes with the sentences that
reason it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from agents.offline.expr import FULL
from agents.offline.kernel_family import floor_in
from agents.offline.program import itemsize
from agents.offline.scan.shape import CumsumShape, RecurrenceShape
from tpu_runner.hardware import ChipSpec

MiB = 2**20
BLOCK_TARGET_BYTES = 2 * MiB  # a streamed block long enough to reach HBM bandwidth, small enough to double-buffer
DEFAULT_VMEM_LIMIT = 64 * MiB


@dataclass(frozen=True, kw_only=True)
class CumsumParams:
    """The prefix-sum kernel's TUNABLE values, typed (agents.offline.kernel_family.as_tunable gives the dict the
    plans carry). Exactly one of the block sizes is set: rows for a scan along the lanes, lanes for one across."""

    block_rows: int | None = None  # lines (rows) per block, for a scan along the last axis
    block_cols: int | None = None  # lines (lanes) per block, for a scan along another axis
    chunk: int  # elements of the scan per grid step: one matmul with a chunk x chunk triangle
    splits: int  # bf16 parts per f32 value; 2 leave ~2^-17 of each element, 3 are exact to f32 rounding
    vmem_limit_bytes: int

    def __post_init__(self) -> None:
        if (self.block_rows is None) == (self.block_cols is None):
            raise ValueError(f"one of the block sizes is set, not both or neither: {self.block_rows=}, "
                             f"{self.block_cols=}")
        if self.chunk < 1 or self.splits < 1:
            raise ValueError(f"{self.chunk=} and {self.splits=} must be at least 1")


@dataclass(frozen=True, kw_only=True)
class RecurrenceParams:
    """The recurrence kernel's TUNABLE values, typed."""

    block_cols: int  # features (lanes) per block
    chunk: int  # time steps per grid step
    unroll: int  # how far the loop over a chunk's steps is unrolled
    vmem_limit_bytes: int

    def __post_init__(self) -> None:
        if min(self.block_cols, self.chunk, self.unroll) < 1:
            raise ValueError(f"{self.block_cols=}, {self.chunk=} and {self.unroll=} must be at least 1")


def _roofline(moved: int, chip: ChipSpec, what: str) -> str:
    seconds = moved / chip.hbm_bandwidth
    return (f"{what} is memory-bound: {moved / MiB:.0f} MiB must cross HBM (each input read once, the output written "
            f"once), at least {seconds * 1e3:.3g} ms at {chip.name}'s {chip.hbm_bandwidth / 1e9:.0f} GB/s; the "
            "kernel reads each input block once and writes each output block once.")


def _vmem_space() -> tuple[int, ...]:
    return tuple(m * MiB for m in (16, 32, 64, 100))


# -- prefix sums ---------------------------------------------------------------------------------------------------
def cumsum_space(spec: CumsumShape) -> dict[str, tuple[Any, ...]]:
    across = ("BLOCK_ROWS", (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)) if spec.lanes \
        else ("BLOCK_COLS", (128, 256, 512, 1024, 2048, 4096))
    chunks = (128, 256, 512) if spec.lanes else (64, 128, 256, 512)
    return {across[0]: across[1], "CHUNK": chunks, "SPLITS": (2, 3), "VMEM_LIMIT_BYTES": _vmem_space()}


def choose_cumsum(spec: CumsumShape, chip: ChipSpec) -> tuple[CumsumParams, list[str]]:
    """The brain's first choice in the prefix sum's space, and why (the first sentence: the roofline)."""
    space = cumsum_space(spec)
    n = spec.shape[spec.axis]
    size = math.prod(spec.shape)
    moved = sum(v.size * itemsize(v.dtype) for _, v, _ in spec.operands) + spec.output.size \
        * itemsize(spec.output.dtype)
    reasons = [_roofline(moved, chip, f"A prefix sum of {size / 2**20:.0f}M elements with "
                         f"{len(spec.pre) + len(spec.post)} elementwise ops around it")]
    # v5e's MXU is 128 wide, v6e's 256: a chunk of one MXU width is one pass of the systolic array.
    chunk = floor_in(space["CHUNK"], 128 if chip.name == "v5e" else 256)
    splits = 2
    mxu = 2 * splits * size * min(chunk, n)
    reasons.append(
        f"Within a chunk of {chunk} elements the prefix sum is one matmul with a {chunk}x{chunk} triangle of ones "
        f"on the MXU. The f32 data goes as {splits} bf16 parts (the high bits, then the rounding rest), each times "
        "the exact 0/1 triangle with f32 accumulation, so each element keeps ~2^-17 of its size and 8192-long "
        f"sums stay within a 1e-3 tolerance: {mxu / 1e9:.1f} GFLOP, {mxu / chip.peak_for('bfloat16') * 1e3:.3g} ms "
        "at the bf16 peak, under the memory time. The triangle's block index never changes, so it is fetched once.")
    full = 1 + sum(kind == FULL for _, _, kind in spec.operands)
    across_key = "BLOCK_ROWS" if spec.lanes else "BLOCK_COLS"
    # Each streamed block ~2 MiB: rows (or lanes) x chunk x 4 bytes.
    across = floor_in(space[across_key], max(8, BLOCK_TARGET_BYTES // (4 * chunk)))
    lines = math.prod(spec.shape) // n
    working = (2 * full * across * chunk * 4 + 4 * across * chunk * 4 + across * 128 * 4) / MiB
    reasons.append(
        f"Blocks of {across} {'rows' if spec.lanes else 'lanes'} x {chunk}: "
        f"~{across * chunk * 4 / MiB:.1f} MiB per streamed block, {full} streams double-buffered plus the bf16 "
        f"parts and the f32 sums, ~{working:.0f} MiB "
        f"in a {DEFAULT_VMEM_LIMIT // MiB} MiB scoped VMEM limit ({chip.vmem_bytes // MiB} MiB on "
        f"{chip.name}); {lines} lines of {n}.")
    reasons.append(
        "A running total per line in VMEM scratch carries the sum from chunk to chunk: the chunk axis is the "
        "grid's last and 'arbitrary'" + (", walked from the end for a reverse scan." if spec.reverse else "."))
    if n % chunk and n > chunk:
        reasons.append(f"{n} is not a multiple of the chunk: the scan axis is padded and the padding masked to 0.")
    blocks = {"block_rows": across} if spec.lanes else {"block_cols": across}
    return CumsumParams(**blocks, chunk=chunk, splits=splits, vmem_limit_bytes=DEFAULT_VMEM_LIMIT), reasons


# -- the linear recurrence ------------------------------------------------------------------------------------------
def recurrence_space(spec: RecurrenceShape) -> dict[str, tuple[Any, ...]]:
    return {"BLOCK_COLS": (128, 256, 512, 1024, 2048), "CHUNK": (8, 16, 32, 64, 128, 256, 512, 1024),
            "UNROLL": (1, 2, 4, 8), "VMEM_LIMIT_BYTES": _vmem_space()}


def choose_recurrence(spec: RecurrenceShape, chip: ChipSpec) -> tuple[RecurrenceParams, list[str]]:
    """The brain's first choice in the recurrence's space, and why (the first sentence: the roofline)."""
    space = recurrence_space(spec)
    n = spec.shape[spec.axis]
    post = math.prod(spec.shape[spec.axis + 1:])
    moved = 2 * math.prod(spec.shape) * itemsize(spec.dtype) + math.prod(spec.shape) * itemsize(spec.out_dtype)
    reasons = [_roofline(moved, chip, f"A linear recurrence over {n} steps of {post} features (2 FLOP per "
                         "element)")]
    cols = floor_in(space["BLOCK_COLS"], min(post, 512)) if post >= 128 else 128
    chunk = floor_in(space["CHUNK"], max(8, BLOCK_TARGET_BYTES // 2 // (4 * cols)))
    reasons.append(
        f"Blocks of {chunk} steps x {cols} features (~{chunk * cols * 4 / MiB:.2f} MiB per stream, three streams "
        f"double-buffered in a {DEFAULT_VMEM_LIMIT // MiB} MiB scoped VMEM limit): time on sublanes, features on "
        "lanes, so each step's update is one lane-dense row of multiply-adds and h never leaves vector registers "
        "within a chunk.")
    reasons.append(
        "h is carried from chunk to chunk in VMEM scratch: the chunk axis is the grid's last and 'arbitrary'"
        + (", walked from the end for a reverse recurrence." if spec.reverse else ".")
        + " The loop over a chunk's steps is unrolled 8 times so loads, multiply-adds and stores overlap.")
    return RecurrenceParams(block_cols=cols, chunk=chunk, unroll=8, vmem_limit_bytes=DEFAULT_VMEM_LIMIT), reasons
