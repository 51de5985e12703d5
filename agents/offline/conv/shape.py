"""What recognising a convolution found: the image and kernel among the inputs, the sizes of the stride-1
convolution the kernel computes, the reference's padding, kernel layout steps and strides, the epilogue and its
mode; with the layout that follows from the sizes (wide rows, rows flattened in VMEM, planes written in place)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from agents.offline.expr import FULL, ROW, SCALAR
from agents.offline.program import Op, Value

MiB = 2**20
DEFAULT_EPI_ROWS = 16  # a bf16 output's sublane tile
TILED, POOL, PLANE = "tiled", "pool", "plane"  # no reduction; a global pool; plane statistics


@dataclass(frozen=True)
class ConvOperand:
    index: int  # position among computation's dynamic arguments
    kind: str  # ROW (one value per output channel) or SCALAR
    value: Value



@dataclass(frozen=True)
class ConvShape:
    x: int  # input positions of the image and the weights
    w: int
    rank: int  # spatial dimensions: 2 or 3
    batch: int
    c_in: int
    c_out: int
    in_spatial: tuple[int, ...]
    window: tuple[int, ...]
    dtype: str  # the image's dtype
    w_dtype: str
    highest: bool  # the reference asked for Precision.HIGHEST
    conv_out: Value
    operands: tuple[ConvOperand, ...]
    ops: tuple[Op, ...]  # the epilogue
    output: Value
    mode: str  # TILED | POOL | PLANE
    reduces: bool
    n_inputs: int
    n_static: int
    # (lo, hi, interior) per spatial axis, applied in turn to the image before a VALID convolution: the
    # reference's own padding and input (lhs) dilation, and any explicit zero pad it wrote.
    x_pads: tuple[tuple[tuple[int, int, int], ...], ...] = ()
    w_steps: tuple[tuple[str, tuple[int, ...]], ...] = ()  # ("rev", axes) / ("transpose", perm) on the kernel
    # The reference's strides; in_spatial, window and c_in are then those of the stride-1 convolution the kernel
    # computes over the space-to-depth image (each phase of the stride a group of input channels).
    strides: tuple[int, ...] = ()
    # A transposed convolution's output phases, per spatial axis (dilation, front pad in the dilated image, output
    # length); c_out, in_spatial and window are then those of the stride-1 convolution of the undilated image that
    # computes every phase as a group of output channels (helpers._stride_phases).
    phases: tuple[tuple[int, int, int], ...] = ()
    tail: tuple[Op, ...] = ()  # after `output`, as XLA ops on whole arrays (agents.offline.tail)
    inputs: tuple[Value, ...] = ()  # the reference's inputs, which the tail may read


    @property
    def out_spatial(self) -> tuple[int, ...]:
        return tuple(s - k + 1 for s, k in zip(self.in_spatial, self.window, strict=True))

    @property
    def taps(self) -> int:
        return math.prod(self.window)

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.c_out * math.prod(self.out_spatial) * self.c_in * self.taps

    def describe(self) -> str:
        what = {TILED: "an elementwise epilogue", POOL: "a global pool over the spatial axes",
                PLANE: "per-plane statistics (a spatial normalisation)"}[self.mode]
        window = "x".join(map(str, self.window))
        padded = f" (padded{' and dilated' if dilates(self.x_pads) else ''} to this by XLA)" if self.x_pads else ""
        if self.strides:
            padded += (f" (stride {'x'.join(map(str, self.strides))}, as a stride-1 convolution of its space-to-depth "
                       "image)")
        if self.phases:
            padded += (f" (input dilation {'x'.join(str(d) for d, _, _ in self.phases)}, as a stride-1 convolution "
                       f"of the undilated image, its {phase_count(self)} output phases as "
                       "groups of channels)")
        rest = f", then {len(self.tail)} XLA ops on whole arrays" if self.tail else ""
        return (f"{self.rank}-D convolution {window} of {self.dtype}[{self.batch}, {self.c_in}, "
                f"{', '.join(map(str, self.in_spatial))}]{padded} to {self.c_out} channels, then {what} "
                f"({len(self.ops)} ops) -> {self.output.dtype}{list(self.output.shape)}{rest}")


def phase_count(spec: ConvShape) -> int:
    """Output phases of a transposed convolution computed as channel groups (1 when it is not one)."""
    return math.prod(d for d, _, _ in spec.phases)


def dilates(pads: tuple[tuple[tuple[int, int, int], ...], ...]) -> bool:
    return any(interior for pad in pads for _, _, interior in pad)



def value_kind(shape: tuple[int, ...], main: tuple[int, ...]) -> str | None:
    """FULL (the convolution's output shape), ROW (one value per channel, or per sample and channel) or SCALAR."""
    if shape == main:
        return FULL
    if math.prod(shape) == 1:
        return SCALAR
    n, c, rank = main[0], main[1], len(main)
    if len(shape) == rank and shape[1] == c and shape[0] in (1, n) and all(d == 1 for d in shape[2:]):
        return ROW
    if shape == (n, c) or shape == (c,) or (len(shape) == rank - 1 and shape[0] == c
                                            and all(d == 1 for d in shape[1:])):
        return ROW
    return None



def padded_channels(c_in: int) -> int:
    return -(-c_in // 8) * 8


def wide_positions(spec: ConvShape) -> int:
    """Output positions the kernel computes per sample and channel (rows as long as the input's)."""
    inner = math.prod(spec.in_spatial[1:])
    return spec.out_spatial[0] * inner


def flattens_in_vmem(spec: ConvShape) -> bool:
    """Rows whole lane tiles long, in groups of 8 (the sublane tile): the kernel flattens the image itself."""
    return spec.in_spatial[-1] % 128 == 0 and math.prod(spec.in_spatial[:-1]) % 8 == 0


def writes_planes(spec: ConvShape) -> bool:
    """Is the per-element output written in its final (N, C, *out_spatial) layout by the kernel? When the input's
    rows below the leading spatial axis are whole lane tiles (W for 2-D, H x W for 3-D), a block is a run of whole
    leading rows (image rows, or depth planes): its wide positions are reshaped in VMEM and cropped as they are
    stored, so XLA neither relayouts the flat (C, positions) result nor crops it in HBM (each a full pass over
    the output). Plane statistics take all the rows in one block."""
    if spec.mode == POOL or value_kind(spec.output.shape, spec.conv_out.shape) != FULL:
        return False
    return math.prod(spec.in_spatial[1:]) % 128 == 0


def row_unit(spec: ConvShape) -> int:
    """Leading output rows per block come in multiples of this: a 2-D block's rows are its sublanes."""
    return 8 if spec.rank == 2 else 1



def offset_strides(spec: ConvShape) -> tuple[int, ...]:
    """The largest offset each spatial axis adds to a tap (the halo of a flattened position)."""
    strides = [math.prod(spec.in_spatial[a + 1:]) for a in range(spec.rank)]
    return tuple((k - 1) * s for k, s in zip(spec.window, strides, strict=True))


