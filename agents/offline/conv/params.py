"""The convolution kernel's parameters: the TUNABLE space the search and the autotuner move in, apart from the
brain's own first choice in it (from the roofline and a VMEM budget), which comes with the sentences that reason it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from agents.offline.conv.shape import (
    DEFAULT_EPI_ROWS,
    PLANE,
    POOL,
    ConvShape,
    MiB,
    flattens_in_vmem,
    offset_strides,
    padded_channels,
    phase_count,
    row_unit,
    wide_positions,
    writes_planes,
)
from agents.offline.expr import default_dtypes, dtype_space
from agents.offline.kernel_family import floor_in
from agents.offline.program import itemsize
from tpu_runner.hardware import ChipSpec, sublane_tile


@dataclass(frozen=True, kw_only=True)
class ConvParams:
    """The kernel's TUNABLE values, typed (agents.offline.kernel_family.as_tunable gives the dict the plans carry)."""

    block_co: int  # output channels per block
    block_p: int | None = None  # output positions (lanes) per block; None for plane statistics (the whole plane)
    epi_rows: int | None = None  # channel rows per epilogue step; None for a global pool (the whole tile)
    chunk: int  # positions per MXU dot inside a step
    fold_taps: bool = True  # one dot over all taps (a patch in VMEM) or one dot per tap
    vmem_limit_bytes: int
    elementwise_dtypes: str  # "reference" or "float32" (agents.offline.expr.DTYPE_CHOICES)

    def __post_init__(self) -> None:
        if self.block_co < 1 or self.chunk < 1 or (self.block_p is not None and self.block_p < 1):
            raise ValueError(f"blocks hold at least one row: {self.block_co=}, {self.block_p=}, {self.chunk=}")


def conv_space(spec: ConvShape) -> dict[str, tuple[Any, ...]]:
    space: dict[str, tuple[Any, ...]] = {"BLOCK_CO": (64, 128, 256, 512)}
    if spec.mode != PLANE:
        space["BLOCK_P"] = (512, 1024, 2048, 4096, 8192, 16384, 32768)  # output positions (lanes) per grid step
    # Positions per MXU dot inside a step. On a v5e, 39k (72 deep, before a pool) ran 3.5% faster at 4096 than at
    # 2048 (2.47 ms against 2.56, wall clock) in a probe; 4096 was outside the space its search moved in.
    space["CHUNK"] = (256, 512, 1024, 2048, 4096)
    if spec.mode != POOL:
        space["EPI_ROWS"] = (8, 16, 32, 64)  # channel rows per step of the fused epilogue
    space["FOLD_TAPS"] = (True, False)  # one dot over all taps (a patch in VMEM) or one dot per tap
    space["VMEM_LIMIT_BYTES"] = tuple(m * 2**20 for m in (32, 64, 100, 120))
    space["ELEMENTWISE_DTYPES"] = dtype_space({spec.conv_out.dtype} | {op.out.dtype for op in spec.ops}
                                              | {o.value.dtype for o in spec.operands})
    return space



def _vmem_bytes(spec: ConvShape, block_co: int, block_p: int, chunk: int) -> int:
    halo = sum(off for off in offset_strides(spec)) + 256
    copies = 3 if flattens_in_vmem(spec) else 2  # double-buffered, and flattened in VMEM when it is
    x_bytes = copies * max(16, padded_channels(spec.c_in)) * (math.prod(spec.in_spatial) + halo) \
        * itemsize(spec.dtype)
    patch = spec.taps * padded_channels(spec.c_in) * chunk * 6  # f32 patch and its bf16 copy for the MXU
    # The epilogue's f32 values (the compiler keeps about one live value per two ops of a long chain): before a
    # pool, a chunk's in the chunk loop, with no accumulator; otherwise EPI_ROWS rows of the accumulator's block.
    live = max(4, len(spec.ops) // 2) * 4
    if spec.mode == POOL:
        return x_bytes + patch + live * block_co * chunk + 2 * 8 * block_p * 4  # and the mask's blocks
    acc = block_co * block_p * 4
    temporaries = live * min(block_co, DEFAULT_EPI_ROWS) * block_p
    out = 2 * block_co * block_p * itemsize(spec.output.dtype)
    return x_bytes + patch + acc + temporaries + out



def untiled_writes(spec: ConvShape, chip: ChipSpec, block_p: int) -> str | None:
    """Why the output's writes cost more than its bytes at HBM bandwidth, where the kernel writes planes whose
    blocks end in dims that are not whole (sublane, lane) tiles and the chip's rate for such DMAs is measured."""
    if not writes_planes(spec):
        return None
    rows = spec.out_spatial[0] if spec.mode == PLANE else block_p // math.prod(spec.in_spatial[1:])
    tail = ((rows,) + tuple(spec.out_spatial[1:]))[-2:]
    rate = chip.block_dma_rate((tail[0], tail[1]), itemsize(spec.output.dtype))
    if rate is None:
        return None
    sublanes = sublane_tile(itemsize(spec.output.dtype))
    out_bytes = spec.output.size * itemsize(spec.output.dtype)
    return (f"Its output blocks end in {tail[0]} x {tail[1]}, not whole ({sublanes}, 128) tiles of "
            f"{spec.output.dtype}: {chip.name} moves such blocks at ~{rate / 1e9:.0f} GB/s (measured by "
            f"benchmarks/dma_tiles.py; ~560 for whole tiles), so writing the {out_bytes / MiB:.3g} MiB output takes "
            f"at least {out_bytes / rate * 1e3:.3g} ms (against {out_bytes / chip.hbm_bandwidth * 1e3:.3g} at full "
            "bandwidth) whatever the kernel computes. The same array is no faster written another way: 126 x 126 "
            "planes written as whole tiles and cropped by XLA after the kernel took as long on that chip.")


def choose_params(spec: ConvShape, chip: ChipSpec) -> tuple[ConvParams, list[str]]:
    """The brain's first choice in the space, and why (the first sentence: the roofline)."""
    space = conv_space(spec)
    wide = wide_positions(spec)
    in_bytes = spec.batch * spec.c_in * math.prod(spec.in_spatial) * itemsize(spec.dtype)
    out_bytes = spec.output.size * itemsize(spec.output.dtype)
    w_bytes = spec.c_out * spec.c_in * spec.taps * itemsize(spec.w_dtype)
    ideal = in_bytes + out_bytes + w_bytes
    peak = chip.peak_for(spec.dtype)
    intensity = spec.flops / ideal
    reasons = [f"{spec.flops / 1e9:.1f} GFLOP over at least {ideal / MiB:.0f} MiB: arithmetic intensity "
               f"{intensity:.0f} FLOP/byte against {chip.name}'s ridge point of {peak / chip.hbm_bandwidth:.0f}, so "
               f"the convolution is {'compute' if intensity > peak / chip.hbm_bandwidth else 'memory'}-bound at "
               f"best ({max(spec.flops / peak, ideal / chip.hbm_bandwidth) * 1e3:.3g} ms)."]
    block_co = floor_in(space["BLOCK_CO"], spec.c_out) if spec.c_out > 64 else 64
    depth = spec.taps * padded_channels(spec.c_in)
    # A shallow contraction takes longer dots: on a v5e at 72 deep (39k), 2048 positions per dot ran in 3.3 ms
    # against 4.0 at 1024 and 5.6 at 512; at 576 deep (22k) the three were level.
    chunk = 2048 if depth <= 128 else 1024 if depth <= 512 else 512
    lanes = -(-wide // 128) * 128
    # Before a pool the epilogue runs chunk by chunk in an unrolled loop, which overlaps one chunk's MXU work with
    # another's vector work: the longer the loop the better (on a v5e, 39k at 16 chunks of 2048 ran in 2.41 ms,
    # 8 in 2.48, 4 in 2.64-2.68); elsewhere the accumulator's block is in VMEM, and 4 chunks are enough.
    per_step = 16 * chunk if spec.mode == POOL else min(4 * chunk, 4096)
    block_p = -(-wide // chunk) * chunk if spec.mode == PLANE else min(
        floor_in(space["BLOCK_P"], per_step), -(-lanes // chunk) * chunk)
    if writes_planes(spec) and spec.mode != PLANE:  # whole leading rows (see the wrapper's rows_blk)
        inner, unit = math.prod(spec.in_spatial[1:]), row_unit(spec)
        block_p = min(spec.out_spatial[0], max(unit, block_p // inner // unit * unit)) * inner
    vmem = _vmem_bytes(spec, min(block_co, spec.c_out), block_p, chunk)
    limit = next((v for v in space["VMEM_LIMIT_BYTES"] if v >= 1.25 * vmem), space["VMEM_LIMIT_BYTES"][-1])
    params = ConvParams(block_co=block_co, block_p=block_p if "BLOCK_P" in space else None,
                        epi_rows=None if spec.mode == POOL else DEFAULT_EPI_ROWS, chunk=chunk, fold_taps=True,
                        vmem_limit_bytes=limit,
                        elementwise_dtypes=default_dtypes(chip.name, space["ELEMENTWISE_DTYPES"]))
    extra = (wide - math.prod(spec.out_spatial)) / math.prod(spec.out_spatial)
    reasons += [
        f"The input of one sample ({spec.c_in} channels x {math.prod(spec.in_spatial)} positions) stays in VMEM "
        "for all its output blocks, so the image is read from HBM once; each tap is a lane shift of it, so no "
        "im2col array is ever written to HBM.",
        f"Output rows are computed as wide as the input's ({wide} positions per plane, {extra:.1%} more MXU work "
        "than the valid ones) so every tap is one shift; the wide positions are masked out of reductions and "
        + ("cropped as each plane is stored in its final layout." if writes_planes(spec)
           else "cropped from a per-element output by XLA."),
        f"The {spec.taps} taps are folded into one contraction of {spec.taps * padded_channels(spec.c_in)} "
        f"(a patch of {chunk} positions in VMEM), rather than {spec.taps} dots of {spec.c_in}: the MXU "
        "does fewer, deeper passes" + (f"; a contraction this shallow ({depth}) takes {chunk} positions per dot "
                                       "(measured faster on a v5e)." if depth <= 128 else "."),
        f"Blocks of {min(block_co, spec.c_out)} output channels x {block_p} positions: about "
        f"{vmem / MiB:.0f} MiB of VMEM with the input, the patch, "
        + ("a chunk's epilogue values (each chunk's convolution is pooled as it is made, in an unrolled loop that "
           "overlaps the MXU's work with the vector work)" if spec.mode == POOL
           else "the f32 accumulator and the epilogue's values")
        + f", under a {limit // MiB} MiB scoped limit.",
    ]
    if spec.phases:
        count = phase_count(spec)
        reasons.append(f"The reference's input dilation would multiply zeros in {count - 1} of every {count} MXU "
                       f"products and tap shifts; its {count} output phases are computed instead as {count} groups "
                       f"of {spec.c_out // count} output channels of a stride-1 convolution of the undilated image "
                       f"(window {'x'.join(map(str, spec.window))}, each phase's taps those of the reference's kernel "
                       "that land on real samples, zeros elsewhere), and XLA interleaves the phases into the "
                       "reference's layout after the kernel (a pass over the output).")
        if chip.name == "v5e" and spec.rank == 3:  # what the chip said of this form (docs/tpu-host.md)
            reasons.append("Expect the phases' interleave to cost more than the convolution on a v5e: measured "
                           "there (a 3-D transposed convolution of 32 to 64 channels, stride 2, then a layer norm "
                           "over the width), the kernel took 5.8 of 29.6 ms and XLA's crop of the wide rows and "
                           "interleave of the width's phases on the lanes most of the rest: x0.89 of XLA's speed, "
                           "against x0.68 for the dense form over the dilated image.")
    untiled = untiled_writes(spec, chip, block_p)
    if untiled:
        reasons.append(untiled)
    if spec.mode == POOL:
        reasons.append("The global pool accumulates across the position axis ('arbitrary'); only [N, C] is "
                       "written back.")
    elif spec.mode == PLANE:
        reasons.append("The per-plane statistics need the whole plane, so one block holds all its positions; "
                       "the conv result never leaves VMEM before it is normalised.")
        if chip.name == "v5e":  # what the chip said of this form (docs/tpu-host.md)
            reasons.append("Expect no gain over XLA on a v5e: measured there, this form (a 3x3 convolution of 64 to "
                           "128 channels, then an instance norm) ran at x0.81 of XLA's speed (6.73 ms against "
                           "5.44); with its taps, its dot and its norm taken out, moving each sample in and its "
                           "126 x 126 planes out still took 3.9 ms, and the three added 0.4, 1.1 and 1.6 ms to it, "
                           "not overlapped. It is the offline brain's only form for plane statistics.")
    if not spec.highest and "float32" in (spec.dtype, spec.w_dtype):
        reasons.append("f32 operands are rounded to bf16 for the MXU with f32 accumulation, as XLA computes a "
                       "default-precision convolution on TPU.")
    return params, reasons
