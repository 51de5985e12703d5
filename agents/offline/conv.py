"""Convolutions: a 2-D (NCHW x OIHW) or 3-D (NCDHW x OIDHW) conv_general_dilated with any padding, strides or
input dilation (a transposed convolution's; not strides and input dilation together), no kernel dilation and no
feature groups, followed by an epilogue: per-channel broadcasts (bias, affine weights), elementwise chains, and
reductions over all the spatial axes (a global pool to [N, C], or statistics per (sample, channel) plane such
as an instance norm's).

The kernel is an implicit GEMM on a flattened layout that needs no transpose of the input. One sample's input
is (C_in, D*H*W) with the spatial positions on the lanes; an output position p (flattened over the input's
row length, so p = r*W + c) takes tap (i, j) from the input at p + i*W + j. Positions with c >= W_out (and rows
r >= H_out in 3-D) are computed and thrown away: "wide" rows cost (W - W_out) / W_out extra MXU work and keep
every tap a plain shift of the lanes. Per grid step (sample, output-channel block, position block):
- the whole sample's input sits in VMEM (fetched once per sample: its index map ignores the other axes);
- per chunk of positions, each tap's window is loaded at a 128-aligned lane offset, rolled by the rest of its
  offset and stored into a (taps * C_in, chunk) patch in VMEM (FOLD_TAPS), then one MXU dot
  w (C_out, taps * C_in) @ patch gives the chunk in f32; without FOLD_TAPS, one dot per tap is accumulated;
- the epilogue runs on the f32 accumulator; spatial reductions mask the wide positions out, and a global pool
  accumulates across the position axis ('arbitrary'), so only [N, C] goes back to HBM.
A plane statistic (instance norm) needs the whole plane: its position block is the whole plane.
The input is padded (channels to the sublane tile, positions past the last tap's reach) and the wide output is
cropped with XLA ops outside the kernel; that traffic is counted in the reasons.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from agents.offline.expr import (
    FLOAT_DTYPES,
    FULL,
    ROW,
    SCALAR,
    BlockCode,
    NotRecognised,
    as_typed,
    default_dtypes,
    dtype_space,
    to_helper,
    unsupported,
)
from agents.offline.kernel_family import floor_in
from agents.offline.program import Op, Program, Value, itemsize
from agents.offline.tail import TAIL_PRIMS, splits, tail_inputs, wrapper_tail
from tpu_runner.hardware.targets import ChipSpec

MiB = 2**20
DEFAULT_EPI_ROWS = 16  # a bf16 output's sublane tile
TILED, POOL, PLANE = "tiled", "pool", "plane"  # no reduction; a global pool; plane statistics
_REDUCTIONS = {"reduce_sum": ("jnp.sum", "0.0", "+"), "reduce_max": ("jnp.max", "-jnp.inf", "jnp.maximum"),
               "reduce_min": ("jnp.min", "jnp.inf", "jnp.minimum")}
_TRANSCENDENTAL = {"exp", "log", "log1p", "expm1", "tanh", "logistic", "sqrt", "rsqrt", "erf", "sin", "cos",
                   "pow"}
_LAYOUTS = {2: ((0, 1, 2, 3), "NCHW / OIHW"), 3: ((0, 1, 2, 3, 4), "NCDHW / OIDHW")}


@dataclass(frozen=True)
class ConvOperand:
    index: int  # position among computation's dynamic arguments
    kind: str  # ROW (one value per output channel) or SCALAR
    value: Value


@dataclass(frozen=True)
class Conv:
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
    tail: tuple[Op, ...] = ()  # after `output`, as XLA ops on whole arrays (agents.offline.tail)
    inputs: tuple[Value, ...] = ()  # the reference's inputs, which the tail may read

    family = "convolution"

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
        padded = f" (padded{' and dilated' if _dilates(self.x_pads) else ''} to this by XLA)" if self.x_pads else ""
        if self.strides:
            padded += (f" (stride {'x'.join(map(str, self.strides))}, as a stride-1 convolution of its space-to-depth "
                       "image)")
        rest = f", then {len(self.tail)} XLA ops on whole arrays" if self.tail else ""
        return (f"{self.rank}-D convolution {window} of {self.dtype}[{self.batch}, {self.c_in}, "
                f"{', '.join(map(str, self.in_spatial))}]{padded} to {self.c_out} channels, then {what} "
                f"({len(self.ops)} ops) -> {self.output.dtype}{list(self.output.shape)}{rest}")

    def space(self) -> dict[str, tuple[Any, ...]]:
        return conv_space(self)

    def params(self, chip: ChipSpec) -> tuple[dict[str, Any], list[str]]:
        return conv_params(self, chip)

    def strategy(self) -> str:
        return conv_strategy(self)

    def source(self, params: dict[str, Any], header: str, tunable_text: str) -> str:
        return conv_source(self, params, header, tunable_text)


# -- recognising ------------------------------------------------------------------------------------------------
def _ints(value: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in value)


def _check_form(op: Op) -> int:
    """The number of spatial axes of a convolution this family writes; NotRecognised for any other form."""
    lhs, rhs = (a for a in op.args[:2])
    assert isinstance(lhs, Value) and isinstance(rhs, Value)
    rank = len(lhs.shape) - 2
    p = op.params
    where = f"the reference's convolution of {lhs.dtype}{list(lhs.shape)} by {rhs.dtype}{list(rhs.shape)}"
    if rank not in _LAYOUTS:
        raise NotRecognised(f"{where} is {rank}-D; the offline brain writes 2-D and 3-D convolutions")
    order, names = _LAYOUTS[rank]
    dims = p.get("dimension_numbers")
    specs = tuple(_ints(d) for d in dims) if dims is not None else (order, order, order)
    if specs != (order, order, order):
        raise NotRecognised(f"{where} uses dimension numbers {specs}; the offline brain writes {names} layouts")
    rhs_dilation = _ints(p.get("rhs_dilation") or (1,) * rank)
    if rhs_dilation != (1,) * rank:
        raise NotRecognised(f"{where} has kernel dilation {list(rhs_dilation)} (rhs_dilation); the offline brain "
                            "writes convolutions without kernel dilation (padding, strides and input dilation, as "
                            "a transposed convolution has, it writes)")
    strides = _ints(p.get("window_strides") or (1,) * rank)
    if strides != (1,) * rank and _ints(p.get("lhs_dilation") or (1,) * rank) != (1,) * rank:
        raise NotRecognised(f"{where} has both strides {list(strides)} and input dilation; the offline brain "
                            "writes one or the other")
    groups = (int(p.get("feature_group_count", 1)), int(p.get("batch_group_count", 1)))
    if groups != (1, 1):
        raise NotRecognised(f"{where} is grouped (feature_group_count {groups[0]}, batch_group_count "
                            f"{groups[1]}); the offline brain writes dense convolutions (one group)")
    return rank


def _conv_pad(op: Op, rank: int) -> tuple[tuple[int, int, int], ...]:
    """The convolution's own padding and input dilation as one lax.pad of the image (dilation, then edges)."""
    padding = tuple(_ints(pair) for pair in op.params.get("padding", ())) or ((0, 0),) * rank
    dilation = _ints(op.params.get("lhs_dilation") or (1,) * rank)
    return tuple((lo, hi, d - 1) for (lo, hi), d in zip(padding, dilation, strict=True))


def _dilates(pads: tuple[tuple[tuple[int, int, int], ...], ...]) -> bool:
    return any(interior for pad in pads for _, _, interior in pad)


def _after_pads(spatial: tuple[int, ...], pads: tuple[tuple[tuple[int, int, int], ...], ...]) -> tuple[int, ...]:
    for pad in pads:
        spatial = tuple((s - 1) * (i + 1) + 1 + lo + hi for s, (lo, hi, i) in zip(spatial, pad, strict=True))
    return spatial


def _space_to_depth_view(c_in: int, spatial: tuple[int, ...], window: tuple[int, ...], strides: tuple[int, ...]
                         ) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """The stride-1 convolution a strided one is over its space-to-depth image (see _SPACE_TO_DEPTH): channels,
    image and window sizes."""
    small = tuple(-(-k // s) for k, s in zip(window, strides, strict=True))
    out = tuple((p - k) // s + 1 for p, k, s in zip(spatial, window, strides, strict=True))
    return c_in * math.prod(strides), tuple(o - 1 + k for o, k in zip(out, small, strict=True)), small


_SPACE_TO_DEPTH = '''

def _space_to_depth(x, w, strides):
    """A strided convolution as a stride-1 one: phase (a, b) of the stride becomes input channels of the image
    (cropped or zero-padded to whole phases) and the kernel's taps (zero-padded to whole phases) split alike, so
    y[o, i, j] = sum of w[o, c, s*i1 + a, ...] * x[c, s*(i + i1) + a, ...] is unchanged."""
    n, c, o = x.shape[0], x.shape[1], w.shape[0]
    rank = len(strides)
    small = tuple(-(-k // s) for k, s in zip(w.shape[2:], strides))
    out = tuple((p - k) // s + 1 for p, k, s in zip(x.shape[2:], w.shape[2:], strides))
    size = tuple((q - 1 + k) * s for q, k, s in zip(out, small, strides))
    zero = jnp.zeros((), x.dtype)
    x = lax.pad(x, zero, ((0, 0, 0),) * 2 + tuple((0, t - p, 0) for t, p in zip(size, x.shape[2:])))
    w = lax.pad(w, jnp.zeros((), w.dtype), ((0, 0, 0),) * 2
                + tuple((0, k * s - kk, 0) for k, s, kk in zip(small, strides, w.shape[2:])))
    perm = (0, 1) + tuple(3 + 2 * i for i in range(rank)) + tuple(2 + 2 * i for i in range(rank))
    phases = math.prod(strides)
    split = sum(((t // s, s) for t, s in zip(size, strides)), ())
    image = tuple(t // s for t, s in zip(size, strides))
    x = x.reshape((n, c) + split).transpose(perm).reshape((n, c * phases) + image)
    taps = sum(((k, s) for k, s in zip(small, strides)), ())
    w = w.reshape((o, c) + taps).transpose(perm).reshape((o, c * phases) + small)
    return x, w
'''


_LAYOUT_STEPS = {"rev": "dimensions", "transpose": "permutation"}  # kernel layout changes the wrapper repeats


def _source_input(program: Program, arg: Any, what: str) -> tuple[Value, list[Op]]:
    """The program input a convolution operand comes from and the ops between them (the operand's prologue):
    dtype conversions; for the image, zero pads of its spatial axes; for the kernel, reversals and transposes
    (a transposed convolution's flipped, in/out-swapped kernel)."""
    prologue: list[Op] = []
    while isinstance(arg, Value):
        if any(arg.id == v.id for v in program.inputs):
            return arg, prologue[::-1]
        producer = program.producer(arg)
        allowed = producer is not None and (
            producer.prim == "convert_element_type"
            or (what == "kernel" and producer.prim in _LAYOUT_STEPS)
            or (what == "image" and producer.prim == "pad" and producer.args[1] == 0
                and all(tuple(c) == (0, 0, 0) for c in producer.params["padding_config"][:2])))
        if not allowed:
            prim = producer.prim if producer else "a constant"
            raise NotRecognised(f"the convolution's {what} is computed inside the reference ({prim}: a prologue, "
                                "as a transposed convolution written over a zero-dilated input is); the offline "
                                "brain fuses epilogues after a convolution of the inputs themselves (through "
                                "zero padding of the image and reversed or transposed kernels)")
        assert producer is not None
        prologue.append(producer)
        arg = producer.args[0]
    raise NotRecognised(f"the convolution's {what} is a literal")


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


def _input_kind(value: Value, main: tuple[int, ...], users: list[Op]) -> str | None:
    """An epilogue input's kind: per channel (never per sample: blocks hold one sample) or a scalar."""
    kind = value_kind(value.shape, main)
    if kind == SCALAR:
        return SCALAR
    if kind != ROW or (len(value.shape) == len(main) and value.shape[0] != 1) or value.shape == (main[0], main[1]):
        return None
    for op in users:  # a vector as long as a spatial axis could be broadcast along it instead
        dims = op.params.get("broadcast_dimensions") if op.prim == "broadcast_in_dim" else None
        if dims is not None and len(value.shape) == 1 and tuple(dims) != (1,):
            return None
    return kind


@dataclass
class ConvCode(BlockCode):
    """Block code on a (channels, positions) tile: FULL is the tile, ROW one value per channel row."""

    conv_main: tuple[int, ...] = ()

    def _kind(self, op: Op) -> str | None:
        if op.prim == "broadcast_in_dim" and isinstance(op.args[0], Value) and op.out.shape == self.conv_main:
            source = op.args[0]
            dims = tuple(op.params.get("broadcast_dimensions", ()))
            lands = {dims[a] for a, d in enumerate(source.shape) if d > 1}
            if not lands <= {0, 1} and self.kind(source) != FULL:
                return None  # broadcast along a spatial axis: not per channel
        return value_kind(op.out.shape, self.conv_main)

    def emit(self, op: Op) -> None:
        if op.prim in _REDUCTIONS:
            self.bind(op.out, self.reduction(op), ROW)
            return
        super().emit(op)

    def reduction(self, op: Op) -> str:
        """A masked reduction over the tile's valid positions (the wide ones are left out)."""
        source = op.args[0]
        spatial = tuple(range(2, len(self.conv_main)))
        if tuple(op.params.get("axes", ())) != spatial or self.kind(source) != FULL:
            raise NotRecognised(f"the reference's {op.prim} over axes {list(op.params.get('axes', ()))} of "
                                f"{list(getattr(source, 'shape', ()))}; the offline brain's convolutions reduce "
                                f"over all the spatial axes {list(spatial)} of the convolution's output")
        identity = _REDUCTIONS[op.prim][1]
        return self.reduced(op.prim, f"jnp.where(mask, {self.ref(source)}, {identity})")


def _depends_on_reduction(ops: list[Op]) -> set[int]:
    """Ids of the values computed from a spatial reduction."""
    tainted: set[int] = set()
    for op in ops:
        if op.prim in _REDUCTIONS or any(isinstance(a, Value) and a.id in tainted for a in op.args):
            tainted.add(op.out.id)
    return tainted


def _mode(ops: list[Op], output: Value, main: tuple[int, ...]) -> str:
    reductions = [op for op in ops if op.prim in _REDUCTIONS]
    if not reductions:
        return TILED
    tainted = _depends_on_reduction(ops)
    full_after = any(op.out.id in tainted and op.prim not in _REDUCTIONS and op.out.shape == main for op in ops)
    fed = any(isinstance(a, Value) and a.id in tainted for op in reductions for a in op.args)
    if value_kind(output.shape, main) == ROW and not full_after and not fed:
        return POOL
    return PLANE


def _dry_run(spec_main: tuple[int, ...], conv_out: Value, operands: tuple[ConvOperand, ...], ops: list[Op]) -> None:
    code = ConvCode(main=(spec_main[1], math.prod(spec_main[2:])), names={}, kinds={}, lines=[], cols="count",
                    conv_main=spec_main)
    code.bind(conv_out, "acc", FULL)
    for o in operands:
        code.bind(o.value, f"e{o.index}", o.kind)
    for op in ops:
        code.emit(op)


def recognise_conv(program: Program, output: Value) -> Conv | None:
    convs = [op for op in program.ops if op.prim == "conv_general_dilated"]
    if not convs:
        return None
    if len(convs) > 1:
        raise NotRecognised(f"the reference has {len(convs)} convolutions; the offline brain writes one "
                            "convolution with its epilogue")
    conv = convs[0]
    rank = _check_form(conv)
    x_v, x_prologue = _source_input(program, conv.args[0], "image")
    w_v, w_prologue = _source_input(program, conv.args[1], "kernel")
    index = program.ops.index(conv)
    prologue_ids = {op.out.id for op in x_prologue + w_prologue}
    before = [op for op in program.ops[:index] if op.prim != "convert_element_type" and op.out.id not in prologue_ids]
    if before:
        raise NotRecognised(f"the reference computes {before[0].prim} before its convolution (a prologue); the "
                            "offline brain fuses epilogues after a convolution of the inputs")
    for v, what in ((x_v, "image"), (w_v, "kernel")):
        if v.dtype not in ("float32", "bfloat16"):
            raise NotRecognised(f"the convolution's {what} is {v.dtype}; the offline brain writes f32 and bf16 "
                                "convolutions")
    epilogue = program.ops[index + 1:]
    main = conv.out.shape
    conv_inputs = {x_v.id, w_v.id}
    feeds = {conv.out.id} | prologue_ids

    def kernel_part(ops: list[Op], written: Value, tail: list[Op]) -> tuple[list[ConvOperand], str]:
        """The epilogue inputs and the mode when the kernel computes `ops` and writes `written`."""
        only_tail = tail_inputs(program, tail)
        operands = []
        for i, value in enumerate(program.inputs):
            users = program.users(value)
            if not users or value.id in only_tail or (value.id in conv_inputs and all(
                    u.out.id in feeds or u.prim == "convert_element_type" for u in users)):
                continue
            kind = _input_kind(value, main, users)
            if kind is None:
                raise NotRecognised(f"input {i} ({value.dtype}{list(value.shape)}) of the convolution's epilogue is "
                                    f"neither per channel nor a scalar of the output {list(main)}")
            operands.append(ConvOperand(i, kind, value))
        if written.dtype not in FLOAT_DTYPES:
            raise NotRecognised(f"the reference returns {written.dtype}")
        if value_kind(written.shape, main) not in (FULL, ROW):
            raise NotRecognised(f"the output {list(written.shape)} is neither the convolution's shape {list(main)} "
                                "nor one value per (sample, channel)")
        for op in tail:
            if op.prim not in TAIL_PRIMS:
                raise unsupported(op.prim, "the reference's last steps")
        _dry_run(main, conv.out, tuple(operands), ops)
        return operands, _mode(ops, written, main)

    ops, written, tail = list(epilogue), output, []
    try:
        operands, mode = kernel_part(ops, written, tail)
    except NotRecognised as whole:
        # The kernel may write an earlier value (conv and epilogue so far) and XLA finish the rest: a window pool,
        # a softmax over channels, a group norm.
        # The narrowest value first (a bf16 one rather than its f32 conversion), then the shortest tail.
        ways = sorted(splits(program, list(epilogue), output), key=lambda way: itemsize(way[1].dtype))
        for ops, written, tail in ways:
            try:
                operands, mode = kernel_part(ops, written, tail)
                break
            except NotRecognised:
                continue
        else:
            raise whole from None
    precision = conv.params.get("precision") or ()
    highest = any("HIGHEST" in str(p) for p in (precision if isinstance(precision, tuple) else (precision,)))
    x_pads = tuple(tuple(tuple(int(n) for n in c) for c in op.params["padding_config"][2:])
                   for op in x_prologue if op.prim == "pad")
    x_pads = tuple(pad for pad in x_pads + (_conv_pad(conv, rank),) if any(any(c) for c in pad))
    w_steps = tuple((op.prim, _ints(op.params[_LAYOUT_STEPS[op.prim]])) for op in w_prologue
                    if op.prim in _LAYOUT_STEPS)
    kernel = conv.args[1]
    assert isinstance(kernel, Value)
    strides = _ints(conv.params.get("window_strides") or (1,) * rank)
    c_in, in_spatial, window = x_v.shape[1], _after_pads(x_v.shape[2:], x_pads), kernel.shape[2:]
    if strides != (1,) * rank:
        c_in, in_spatial, window = _space_to_depth_view(c_in, in_spatial, window, strides)
    return Conv(x=program.inputs.index(x_v), w=program.inputs.index(w_v), rank=rank, batch=x_v.shape[0],
                c_in=c_in, c_out=kernel.shape[0], in_spatial=in_spatial, window=window, x_pads=x_pads,
                w_steps=w_steps, strides=strides if strides != (1,) * rank else (), tail=tuple(tail),
                inputs=tuple(program.inputs),
                dtype=x_v.dtype, w_dtype=w_v.dtype, highest=highest, conv_out=conv.out, operands=tuple(operands),
                ops=tuple(ops), output=written, mode=mode, reduces=mode != TILED, n_inputs=len(program.inputs),
                n_static=len(program.static))


# -- parameters -------------------------------------------------------------------------------------------------
def conv_space(spec: Conv) -> dict[str, tuple[Any, ...]]:
    space: dict[str, tuple[Any, ...]] = {"BLOCK_CO": (64, 128, 256, 512)}
    if spec.mode != PLANE:
        space["BLOCK_P"] = (512, 1024, 2048, 4096, 8192, 16384)  # output positions (lanes) per grid step
    space["CHUNK"] = (256, 512, 1024, 2048)  # positions per MXU dot inside a step
    if spec.mode != POOL:
        space["EPI_ROWS"] = (8, 16, 32, 64)  # channel rows per step of the fused epilogue
    space["FOLD_TAPS"] = (True, False)  # one dot over all taps (a patch in VMEM) or one dot per tap
    space["VMEM_LIMIT_BYTES"] = tuple(m * 2**20 for m in (32, 64, 100, 120))
    space["ELEMENTWISE_DTYPES"] = dtype_space({spec.conv_out.dtype} | {op.out.dtype for op in spec.ops}
                                              | {o.value.dtype for o in spec.operands})
    return space


def _padded_channels(c_in: int) -> int:
    return -(-c_in // 8) * 8


def _wide_positions(spec: Conv) -> int:
    """Output positions the kernel computes per sample and channel (rows as long as the input's)."""
    inner = math.prod(spec.in_spatial[1:])
    return spec.out_spatial[0] * inner


def _flattens_in_vmem(spec: Conv) -> bool:
    """Rows whole lane tiles long, in groups of 8 (the sublane tile): the kernel flattens the image itself."""
    return spec.in_spatial[-1] % 128 == 0 and math.prod(spec.in_spatial[:-1]) % 8 == 0


def writes_planes(spec: Conv) -> bool:
    """Is the per-element output written in its final (N, C, *out_spatial) layout by the kernel? When the input's
    rows below the leading spatial axis are whole lane tiles (W for 2-D, H x W for 3-D), a block is a run of whole
    leading rows (image rows, or depth planes): its wide positions are reshaped in VMEM and cropped as they are
    stored, so XLA neither relayouts the flat (C, positions) result nor crops it in HBM (each a full pass over
    the output). Plane statistics take all the rows in one block."""
    if spec.mode == POOL or value_kind(spec.output.shape, spec.conv_out.shape) != FULL:
        return False
    return math.prod(spec.in_spatial[1:]) % 128 == 0


def _row_unit(spec: Conv) -> int:
    """Leading output rows per block come in multiples of this: a 2-D block's rows are its sublanes."""
    return 8 if spec.rank == 2 else 1


def _vmem_bytes(spec: Conv, block_co: int, block_p: int, chunk: int) -> int:
    halo = sum(off for off in _offset_strides(spec)) + 256
    copies = 3 if _flattens_in_vmem(spec) else 2  # double-buffered, and flattened in VMEM when it is
    x_bytes = copies * max(16, _padded_channels(spec.c_in)) * (math.prod(spec.in_spatial) + halo) \
        * itemsize(spec.dtype)
    patch = spec.taps * _padded_channels(spec.c_in) * chunk * 6  # f32 patch and its bf16 copy for the MXU
    acc = block_co * block_p * 4
    # The epilogue's f32 values: on the whole tile before a pool, on EPI_ROWS rows at a time otherwise (the
    # compiler keeps about one live value per two ops of a long chain).
    rows = block_co if spec.mode == POOL else min(block_co, DEFAULT_EPI_ROWS)
    temporaries = max(4, len(spec.ops) // 2) * rows * block_p * 4
    out = 2 * block_co * block_p * itemsize(spec.output.dtype)
    return x_bytes + patch + acc + temporaries + out


def _offset_strides(spec: Conv) -> tuple[int, ...]:
    """The largest offset each spatial axis adds to a tap (the halo of a flattened position)."""
    strides = [math.prod(spec.in_spatial[a + 1:]) for a in range(spec.rank)]
    return tuple((k - 1) * s for k, s in zip(spec.window, strides, strict=True))


def conv_params(spec: Conv, chip: ChipSpec) -> tuple[dict[str, Any], list[str]]:
    space = conv_space(spec)
    wide = _wide_positions(spec)
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
    chunk = 1024 if spec.taps * _padded_channels(spec.c_in) <= 512 else 512
    lanes = -(-wide // 128) * 128
    block_p = -(-wide // chunk) * chunk if spec.mode == PLANE else min(floor_in(space["BLOCK_P"], 4 * chunk),
                                                                       -(-lanes // chunk) * chunk)
    if writes_planes(spec) and spec.mode != PLANE:  # whole leading rows (see the wrapper's rows_blk)
        inner, unit = math.prod(spec.in_spatial[1:]), _row_unit(spec)
        block_p = min(spec.out_spatial[0], max(unit, block_p // inner // unit * unit)) * inner
    vmem = _vmem_bytes(spec, min(block_co, spec.c_out), block_p, chunk)
    limit = next((v for v in space["VMEM_LIMIT_BYTES"] if v >= 1.25 * vmem), space["VMEM_LIMIT_BYTES"][-1])
    params: dict[str, Any] = {"BLOCK_CO": block_co}
    if "BLOCK_P" in space:
        params["BLOCK_P"] = block_p
    if spec.mode != POOL:
        params["EPI_ROWS"] = DEFAULT_EPI_ROWS
    params.update(CHUNK=chunk, FOLD_TAPS=True, VMEM_LIMIT_BYTES=limit,
                  ELEMENTWISE_DTYPES=default_dtypes(chip.name, space["ELEMENTWISE_DTYPES"]))
    extra = (wide - math.prod(spec.out_spatial)) / math.prod(spec.out_spatial)
    reasons += [
        f"The input of one sample ({spec.c_in} channels x {math.prod(spec.in_spatial)} positions) stays in VMEM "
        "for all its output blocks, so the image is read from HBM once; each tap is a lane shift of it, so no "
        "im2col array is ever written to HBM.",
        f"Output rows are computed as wide as the input's ({wide} positions per plane, {extra:.1%} more MXU work "
        "than the valid ones) so every tap is one shift; the wide positions are masked out of reductions and "
        + ("cropped as each plane is stored in its final layout." if writes_planes(spec)
           else "cropped from a per-element output by XLA."),
        f"The {spec.taps} taps are folded into one contraction of {spec.taps * _padded_channels(spec.c_in)} "
        f"(a patch of {chunk} positions in VMEM), rather than {spec.taps} dots of {spec.c_in}: the MXU "
        "does fewer, deeper passes.",
        f"Blocks of {min(block_co, spec.c_out)} output channels x {block_p} positions: about "
        f"{vmem / MiB:.0f} MiB of VMEM with the input, the patch, the f32 accumulator and the epilogue's "
        f"values, under a {limit // MiB} MiB scoped limit.",
    ]
    if spec.mode == POOL:
        reasons.append("The global pool accumulates across the position axis ('arbitrary'); only [N, C] is "
                       "written back.")
    elif spec.mode == PLANE:
        reasons.append("The per-plane statistics need the whole plane, so one block holds all its positions; "
                       "the conv result never leaves VMEM before it is normalised.")
    if not spec.highest and "float32" in (spec.dtype, spec.w_dtype):
        reasons.append("f32 operands are rounded to bf16 for the MXU with f32 accumulation, as XLA computes a "
                       "default-precision convolution on TPU.")
    return params, reasons


def conv_strategy(spec: Conv) -> str:
    return ("Implicit GEMM in one pallas_call over (sample, output-channel block, position block): the sample's "
            "input in VMEM with positions on the lanes, each tap a shifted window of it stacked into a patch, one "
            "f32-accumulated MXU dot per chunk, and the epilogue fused on the accumulator"
            + {TILED: ".", POOL: "; the global pool accumulates across position blocks.",
               PLANE: "; each block holds a whole plane so its statistics are computed in VMEM."}[spec.mode])


# -- the kernel source ------------------------------------------------------------------------------------------
def _epilogue(spec: Conv, ops: tuple[Op, ...] | list[Op], code: ConvCode | None = None,
              rows: str = "...") -> ConvCode:
    """The epilogue's code on the accumulator's `rows` (all of them, or a chunk of channel rows)."""
    if code is None:
        code = ConvCode(main=(spec.c_out, math.prod(spec.out_spatial)), names={}, kinds={}, lines=[],
                        cols="count", typed=True, conv_main=spec.conv_out.shape)
        code.bind(spec.conv_out, as_typed(f"acc_ref[{rows}]", spec.conv_out.dtype), FULL)
        for o in spec.operands:
            where = rows if o.kind == ROW else "..."
            code.bind(o.value, as_typed(f"e{o.index}_ref[{where}]", o.value.dtype), o.kind)
    for op in ops:
        code.emit(op)
    return code


def _pool_parts(spec: Conv) -> tuple[list[Op], list[Op], list[Op]]:
    tainted = _depends_on_reduction(list(spec.ops))
    reductions = [op for op in spec.ops if op.prim in _REDUCTIONS]
    before = [op for op in spec.ops if op.out.id not in tainted]
    after = [op for op in spec.ops if op.out.id in tainted and op.prim not in _REDUCTIONS]
    return before, reductions, after


def _indent(lines: list[str], pad: str) -> str:
    return "\n".join(pad + line for line in lines)


def _epilogue_text(spec: Conv) -> tuple[str, list[str]]:
    """The kernel's epilogue (after the conv fills acc_ref) and the scratch shapes it needs beyond the patch."""
    if spec.mode != POOL:
        # Channel rows are independent (a plane's statistics are one row's), so the epilogue walks the tile
        # EPI_ROWS rows at a time: its f32 temporaries are a slice, not copies of the whole tile in VMEM.
        code = _epilogue(spec, spec.ops, rows="rows, :")
        body = _indent(code.lines, "        ")
        store = (f"        o_ref[rows, :] = jnp.broadcast_to({code.ref(spec.output)}, o_ref[rows, :].shape)"
                 ".astype(o_ref.dtype)\n")
        if writes_planes(spec):  # each channel's wide rows, reshaped and cropped as they are stored
            store = (f"        block = jnp.broadcast_to({code.ref(spec.output)}, (sub, bp))\n"
                     "        block = block.reshape((sub, bp // math.prod(inner)) + inner)\n"
                     "        o_ref[rows] = block[(slice(None), slice(None)) + tuple(slice(0, o) for o in out_inner)]"
                     ".astype(o_ref.dtype)\n")
        return (f"    def _epilogue(r, carry):\n        rows = pl.ds(pl.multiple_of(r * sub, 8), sub)\n{body}\n"
                f"{store}        return carry\n\n"
                "    lax.fori_loop(0, acc_ref.shape[0] // sub, _epilogue, 0)\n"), []
    before, reductions, after = _pool_parts(spec)
    code = _epilogue(spec, before)
    lines = list(code.lines)
    init, accumulate = [], []
    for k, op in enumerate(reductions):
        partial = code.reduction(op)
        _, identity, combine = _REDUCTIONS[op.prim]
        init.append(f"r{k}_ref[...] = jnp.full_like(r{k}_ref, {identity})")
        joined = f"r{k}_ref[...] + {partial}" if combine == "+" else f"{combine}(r{k}_ref[...], {partial})"
        accumulate.append(f"r{k}_ref[...] = {joined}")
        code.names[op.out.id], code.kinds[op.out.id] = f"r{k}_ref[...]", ROW
    code.lines = []
    _epilogue(spec, after, code)
    text = (f"    @pl.when(pi == 0)\n    def _init():\n{_indent(init, '        ')}\n\n"
            f"{_indent(lines, '    ')}\n{_indent(accumulate, '    ')}\n\n"
            f"    @pl.when(pi == pl.num_programs(2) - 1)\n    def _store():\n{_indent(code.lines, '        ')}\n"
            f"        o_ref[...] = jnp.broadcast_to({code.ref(spec.output)}, o_ref.shape).astype(o_ref.dtype)\n")
    return text, ["pltpu.VMEM((bco, 1), jnp.float32)" for _ in reductions]


def _flops_per_element(spec: Conv) -> tuple[int, int]:
    transcendental = sum(op.prim in _TRANSCENDENTAL for op in spec.ops)
    return max(1, len(spec.ops) - transcendental), transcendental


def conv_source(spec: Conv, params: dict[str, Any], header: str, tunable_text: str) -> str:
    params = {"FOLD_TAPS": True, **params}
    sub_line = "    sub = bco  # the pool's epilogue runs on the whole tile\n" if spec.mode == POOL else \
        "    sub = EPI_ROWS if bco % EPI_ROWS == 0 else bco  # channel rows per epilogue step\n"
    epilogue, reduce_scratch = _epilogue_text(spec)
    needs_mask = spec.mode != TILED
    full_out = value_kind(spec.output.shape, spec.conv_out.shape) == FULL
    refs = ["x_ref", "w_ref"] + [f"e{o.index}_ref" for o in spec.operands] + (["m_ref"] if needs_mask else [])
    n_red = len(reduce_scratch)
    # Rows a whole number of lane tiles long: the kernel flattens the image in VMEM itself, so XLA neither
    # relayouts it to (C, D*H*W) nor pads it in HBM (each a full pass over the input).
    flat = _flattens_in_vmem(spec)
    scratch_names = ["o_ref", "acc_ref", "patch_ref"] + (["flat_ref"] if flat else []) \
        + [f"r{k}_ref" for k in range(n_red)]
    ops_per_element, transcendental = _flops_per_element(spec)
    operand_specs = {ROW: "pl.BlockSpec((bco, 1), lambda n, co, pi: (co, 0))",
                     SCALAR: "pl.BlockSpec((1, 1), lambda n, co, pi: (0, 0))"}
    operand_prep = {ROW: "_padded(a{i}.reshape(-1, 1), 0, c_out_p)", SCALAR: "jnp.reshape(a{i}, (1, 1))"}
    prepared = "".join(f"    e{o.index} = {operand_prep[o.kind].format(i=o.index)}\n" for o in spec.operands)
    operand_args = "".join(f", e{o.index}" for o in spec.operands)
    operand_in = "".join(f", {operand_specs[o.kind]}" for o in spec.operands)
    mask_in = ", pl.BlockSpec((1, bp), lambda n, co, pi: (0, pi))" if needs_mask else ""
    mask_arg = ", _valid_mask(in_spatial, out_spatial, p_pad)" if needs_mask else ""
    mask_line = "    mask = m_ref[...] > 0.5  # [1, bp]: the valid (not wide, not padded) positions\n" \
        if needs_mask else ""
    count = "    count = math.prod(out_spatial)\n"
    to_bf16 = not spec.highest
    mxu = "jnp.bfloat16" if to_bf16 else "jnp.float32"
    precision = "lax.Precision.HIGHEST" if spec.highest else "None"
    if writes_planes(spec):
        out_block = ("pl.BlockSpec((None, bco, rows_blk) + tuple(out_spatial[1:]), "
                     "lambda n, co, pi: (n, co, pi) + (0,) * (len(out_spatial) - 1))")
        out_shape = f"jax.ShapeDtypeStruct((batch, c_out_p) + tuple(out_spatial), jnp.{spec.output.dtype})"
        crop = "    return lax.slice(out, (0,) * out.ndim, (batch, c_out) + tuple(out_spatial))\n"
    elif full_out:
        out_block = "pl.BlockSpec((None, bco, bp), lambda n, co, pi: (n, co, pi))"
        out_shape = f"jax.ShapeDtypeStruct((batch, c_out_p, p_pad), jnp.{spec.output.dtype})"
        crop = ("    out = lax.slice(out, (0, 0, 0), (batch, c_out, wide)).reshape((batch, c_out, out_spatial[0])\n"
                "                                                                  + in_spatial[1:])\n"
                "    return lax.slice(out, (0,) * out.ndim, (batch, c_out) + tuple(out_spatial))\n")
    else:
        out_block = "pl.BlockSpec((None, bco, 1), lambda n, co, pi: (n, co, 0))"
        out_shape = f"jax.ShapeDtypeStruct((batch, c_out_p, 1), jnp.{spec.output.dtype})"
        crop = f"    return lax.slice(out, (0, 0, 0), (batch, c_out, 1)).reshape({_out_shape_expr(spec)})\n"
    semantics = '("parallel", "arbitrary", "arbitrary")' if flat else \
        '("parallel", "parallel", "arbitrary")' if spec.mode == POOL else '("parallel", "parallel", "parallel")'
    block_p = "p_total" if spec.mode == PLANE else "min(_round_up(BLOCK_P, chunk), p_total)"
    if writes_planes(spec):  # blocks of whole leading rows; the chunk divides them
        unit = _row_unit(spec)
        rows = "out_spatial[0]" if spec.mode == PLANE else \
            f"min(out_spatial[0], max({unit}, BLOCK_P // inner // {unit} * {unit}))"
        positions = (f"    inner = math.prod(in_spatial[1:])\n    rows_blk = {rows}\n    bp = rows_blk * inner\n"
                     "    chunk = math.gcd(min(CHUNK, bp), bp)\n    p_total = _round_up(wide, bp)\n")
    else:
        positions = (f"    chunk = min(CHUNK, _round_up(wide, 128))\n    p_total = _round_up(wide, chunk)\n"
                     f"    bp = {block_p}\n")
    if flat:
        flatten = ("\n    @pl.when((pl.program_id(1) == 0) & (pi == 0))\n    def _flatten():  # once per sample: one "
                   "row of positions per channel, zeros past the image and in the padded channels\n"
                   "        flat_ref[...] = jnp.zeros_like(flat_ref)\n"
                   "        c, width = x_ref.shape[0], x_ref.shape[-1]\n"
                   "        lines = x_ref.reshape(c, -1, width) if x_ref.ndim > 3 else x_ref\n\n"
                   "        def _lines(g, carry):  # 8 image rows (all channels) to their places in the flat rows\n"
                   "            group = lines[:, pl.ds(pl.multiple_of(g * 8, 8), 8), :]\n"
                   "            for j in range(8):\n"
                   "                at = pl.multiple_of((g * 8 + j) * width, 128)\n"
                   "                flat_ref[:c, pl.ds(at, width)] = group[:, j, :]\n"
                   "            return carry\n\n"
                   "        lax.fori_loop(0, lines.shape[1] // 8, _lines, 0)\n")
        x_prep = "    xf = x  # flattened in VMEM by the kernel\n"
        x_spec = ("pl.BlockSpec((None, c_in) + tuple(in_spatial), "
                  "lambda n, co, pi: (n,) + (0,) * (len(in_spatial) + 1))")
        flat_scratch = " + [pltpu.VMEM((c_in_p, s_pad), x.dtype)]"
    else:
        flatten = ""
        x_prep = ("    # [N, C_in_p, S_pad]: positions on the lanes; zeros past the end feed only wide or padded "
                  "positions.\n    xf = _padded(_padded(x.reshape(batch, c_in, -1), 1, c_in_p), 2, s_pad)\n")
        x_spec = "pl.BlockSpec((None, c_in_p, s_pad), lambda n, co, pi: (n, 0, 0))"
        flat_scratch = ""
    imports = header.replace("import jax\n", "import functools\nimport itertools\nimport math\n\nimport jax\n", 1)
    return imports + tunable_text + f'''
MODE = {spec.mode!r}  # {dict(tiled="no reduction", pool="a global pool", plane="plane statistics")[spec.mode]}
{to_helper()}{_SPACE_TO_DEPTH if spec.strides else ""}

def _round_up(n, b):
    return -(-n // b) * b


def _padded(x, axis, size):
    # lax.pad even when nothing is added: the program keeps one form at every shape (checked = timed).
    widths = [(0, 0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis], 0)
    return lax.pad(x, jnp.zeros((), x.dtype), widths)


def _valid_mask(in_spatial, out_spatial, p_pad):
    """1.0 where a flattened wide position is a real output position, 0.0 where it is wide or padding."""
    p = jnp.arange(p_pad)
    valid = p < out_spatial[0] * math.prod(in_spatial[1:])
    stride = 1
    for axis in range(len(in_spatial) - 1, 0, -1):
        valid &= (p // stride) % in_spatial[axis] < out_spatial[axis]
        stride *= in_spatial[axis]
    return valid.astype(jnp.float32).reshape(1, p_pad)


def _conv_chunk(x_ref, w_ref, patch_ref, start, offsets, c_in, chunk):
    """[bco, chunk] f32: the convolution at `chunk` positions from `start` (a multiple of 128)."""
    acc = None
    for t, off in enumerate(offsets):
        base = pl.multiple_of(start + off // 128 * 128, 128)
        # Every tap rolls, even one already aligned (by 0): which taps are aligned depends on the image's row
        # length, and the program must keep one form at every shape (the checked one is the one timed).
        window = x_ref[:, pl.ds(base, chunk + 128)].astype(jnp.float32)
        tap = pltpu.roll(window, (chunk + 128 - off % 128) % (chunk + 128), 1)[:, :chunk]  # window[:, q + off % 128]
        if FOLD_TAPS:
            patch_ref[t * c_in:(t + 1) * c_in, :] = tap
        else:
            part = lax.dot_general(w_ref[t], tap.astype({mxu}), (((1,), (0,)), ((), ())),
                                   precision={precision}, preferred_element_type=jnp.float32)
            acc = part if acc is None else acc + part
    if FOLD_TAPS:
        acc = lax.dot_general(w_ref[...], patch_ref[...].astype({mxu}), (((1,), (0,)), ((), ())),
                              precision={precision}, preferred_element_type=jnp.float32)
    return acc


def _kernel({", ".join(refs)}, {", ".join(scratch_names)}, *, offsets, c_in, chunk, count, sub, inner,
            out_inner):
    pi = pl.program_id(2)
    bp = acc_ref.shape[-1]
{flatten}
    def body(c, carry):
        local = pl.multiple_of(c * chunk, 128)
        acc_ref[:, pl.ds(local, chunk)] = _conv_chunk({"flat_ref" if flat else "x_ref"}, w_ref, patch_ref,
                                                      pi * bp + local, offsets, c_in, chunk)
        return carry

    lax.fori_loop(0, bp // chunk, body, 0)
{mask_line}{epilogue}

def computation({", ".join([f"a{i}" for i in range(spec.n_inputs)] + [f"s{i}" for i in range(spec.n_static)])}):
    x, w = a{spec.x}, a{spec.w}
{_prologue_text(spec)}    batch, c_in = x.shape[:2]
    c_out = w.shape[0]
    in_spatial, window = x.shape[2:], w.shape[2:]
    out_spatial = tuple(s - k + 1 for s, k in zip(in_spatial, window))
    strides = [math.prod(in_spatial[a + 1:]) for a in range(len(in_spatial))]
    offsets = tuple(sum(i * s for i, s in zip(tap, strides)) for tap in
                    itertools.product(*(range(k) for k in window)))
    wide = out_spatial[0] * strides[0]
{positions}    p_pad = _round_up(p_total, bp)
    c_in_p = _round_up(c_in, 8)
    bco = c_out if c_out <= BLOCK_CO else BLOCK_CO
    c_out_p = _round_up(c_out, bco)
    s_pad = max(math.prod(in_spatial), p_pad + (max(offsets) // 128 + 1) * 128)
{x_prep}
    wt = jnp.moveaxis(_padded(w, 1, c_in_p), 1, -1).reshape(c_out, len(offsets), c_in_p)  # [C_out, taps, C_in]
    wt = _padded(wt, 0, c_out_p).astype({mxu})
    if FOLD_TAPS:
        wt = wt.reshape(c_out_p, len(offsets) * c_in_p)
        w_spec = pl.BlockSpec((bco, len(offsets) * c_in_p), lambda n, co, pi: (co, 0))
    else:
        wt = jnp.moveaxis(wt, 1, 0)  # [taps, C_out, C_in]
        w_spec = pl.BlockSpec((len(offsets), bco, c_in_p), lambda n, co, pi: (0, co, 0))
{prepared}{count}{sub_line}    kernel = functools.partial(_kernel, offsets=offsets, c_in=c_in_p, chunk=chunk,
                               count=count, sub=sub, inner=tuple(in_spatial[1:]),
                               out_inner=tuple(out_spatial[1:]))
    out = pl.pallas_call(
        kernel,
        grid=(batch, c_out_p // bco, p_pad // bp),
        in_specs=[{x_spec}, w_spec{operand_in}{mask_in}],
        out_specs={out_block},
        out_shape={out_shape},
        scratch_shapes=[pltpu.VMEM((bco, bp), jnp.float32),
                        pltpu.VMEM((len(offsets) * c_in_p if FOLD_TAPS else 8, chunk), jnp.float32)]{flat_scratch}
                       + [{", ".join(reduce_scratch)}],
        compiler_params=pltpu.CompilerParams(dimension_semantics={semantics},
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
        cost_estimate=pl.CostEstimate(
            flops=2 * batch * c_out * p_pad * len(offsets) * c_in + {ops_per_element} * batch * c_out * p_pad,
            transcendentals={transcendental} * batch * c_out * p_pad,
            bytes_accessed=xf.size * xf.dtype.itemsize + wt.size * wt.dtype.itemsize * batch
            + batch * c_out_p * {"p_pad" if full_out else "1"} * {itemsize(spec.output.dtype)}),
    )(xf, wt{operand_args}{mask_arg})
{_with_tail(spec, crop)}'''


def _with_tail(spec: Conv, crop: str) -> str:
    """The wrapper's last lines: the kernel's value cropped to the reference's shape, then the reference's tail."""
    if not spec.tail:
        return crop
    head, _, last = crop.rstrip("\n").rpartition("    return ")
    own = ((1, "1"), (spec.batch, "batch"), (spec.c_out, "c_out")) \
        + tuple((d, f"out_spatial[{j}]") for j, d in enumerate(spec.conv_out.shape[2:]))
    lines, result = wrapper_tail(spec.tail, spec.output, spec.inputs, own)
    return head + f"    out = {last}\n" + "".join(f"    {line}\n" for line in lines) + f"    return {result}\n"


def _prologue_text(spec: Conv) -> str:
    """The reference's image padding / dilation and kernel layout steps, done by XLA before the kernel."""
    lines = []
    for pad in spec.x_pads:
        widths = ((0, 0, 0), (0, 0, 0)) + pad
        lines.append(f"    x = lax.pad(x, jnp.zeros((), x.dtype), {widths})  # the reference's padding / dilation")
    for prim, arg in spec.w_steps:
        lines.append(f"    w = lax.rev(w, {arg})" if prim == "rev" else f"    w = jnp.transpose(w, {arg})")
    if spec.strides:
        lines.append(f"    x, w = _space_to_depth(x, w, {spec.strides})  # the reference's strides")
    return "".join(line + "\n" for line in lines)


def _out_shape_expr(spec: Conv) -> str:
    """The pooled output's shape as code: (batch, c_out) and as many kept unit axes as the reference has."""
    kept = len(spec.output.shape) - 2
    return "(batch, c_out)" + (f" + (1,) * {kept}" if kept else "")


def recognise(program: Program, output: Value) -> Conv | None:
    """The recogniser listed in families.RECOGNISERS."""
    return recognise_conv(program, output)
