"""Recognising a convolution with its epilogue: one conv_general_dilated of the inputs themselves (through dtype
conversions, zero padding of the image, reversed or transposed kernels) in a layout and form the kernel writes,
then the elementwise, per-channel and spatially reducing work after it; what the kernel cannot take is left to
XLA as a tail where a split allows."""

from __future__ import annotations

import math
from typing import Any

from agents.offline.conv.epilogue import REDUCTIONS, ConvCode, depends_on_reduction
from agents.offline.conv.family import Conv
from agents.offline.conv.helpers import _phase_taps
from agents.offline.conv.shape import PLANE, POOL, TILED, ConvOperand, dilates, value_kind
from agents.offline.expr import FLOAT_DTYPES, FULL, ROW, SCALAR, NotRecognised, unsupported
from agents.offline.program import Op, Program, Value, itemsize
from agents.offline.tail import TAIL_PRIMS, splits, tail_inputs

_LAYOUTS = {2: ((0, 1, 2, 3), "NCHW / OIHW"), 3: ((0, 1, 2, 3, 4), "NCDHW / OIDHW")}


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



def _one_pad(pads: tuple[tuple[tuple[int, int, int], ...], ...]) -> tuple[tuple[int, int, int], ...] | None:
    """Pads applied in turn as one (lo, hi, interior) per axis, when they compose: none crops and only the first
    dilates (a scatter into zeros, then the convolution's own padding)."""
    if any(lo < 0 or hi < 0 for pad in pads for lo, hi, _ in pad) or any(dilates((pad,)) for pad in pads[1:]):
        return None
    return tuple((sum(p[a][0] for p in pads), sum(p[a][1] for p in pads), pads[0][a][2])
                 for a in range(len(pads[0])))


def _phase_view(c_out: int, spatial: tuple[int, ...], window: tuple[int, ...], pad: tuple[tuple[int, int, int], ...]
                ) -> tuple[int, tuple[int, ...], tuple[int, ...], tuple[tuple[int, int, int], ...]]:
    """The stride-1 convolution of the undilated image that computes a transposed one's output phases as groups
    of output channels (helpers._stride_phases): channels, image and window sizes, and the phases."""
    phases = tuple((i + 1, lo, (s - 1) * (i + 1) + 1 + lo + hi - k + 1)
                   for s, (lo, hi, i), k in zip(spatial, pad, window, strict=True))
    taps = [_phase_taps(d, lo, k) for (d, lo, _), k in zip(phases, window, strict=True)]
    window = tuple(width for _, width in taps)
    image = tuple(-(-length // d) + width - 1 for (d, _, length), width in zip(phases, window, strict=True))
    return c_out * math.prod(d for d, _, _ in phases), image, window, phases


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
            raise NotRecognised(f"the convolution's {what} is computed inside the reference ({prim}: a prologue); "
                                "the offline brain fuses epilogues after a convolution of the inputs themselves "
                                "(through zero padding or dilation of the image - a scatter into zeros at strided "
                                "positions included - and reversed or transposed kernels)")
        assert producer is not None
        prologue.append(producer)
        arg = producer.args[0]
    raise NotRecognised(f"the convolution's {what} is a literal")


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



def _mode(ops: list[Op], output: Value, main: tuple[int, ...]) -> str:
    reductions = [op for op in ops if op.prim in REDUCTIONS]
    if not reductions:
        return TILED
    tainted = depends_on_reduction(ops)
    full_after = any(op.out.id in tainted and op.prim not in REDUCTIONS and op.out.shape == main for op in ops)
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
    c_in, c_out, in_spatial, window = x_v.shape[1], kernel.shape[0], _after_pads(x_v.shape[2:], x_pads), \
        kernel.shape[2:]
    if strides != (1,) * rank:
        c_in, in_spatial, window = _space_to_depth_view(c_in, in_spatial, window, strides)
    phases: tuple[tuple[int, int, int], ...] = ()
    # A transposed convolution multiplies the dilation's zeros: (s^rank - 1) / s^rank of the dense form's MXU work
    # and tap shifts. Its output phases are a stride-1 convolution of the undilated image instead, written phase by
    # phase as channel groups and interleaved by XLA; an epilogue reducing over positions would span the groups.
    if mode == TILED and dilates(x_pads) and (pad := _one_pad(x_pads)) is not None:
        c_out, in_spatial, window, phases = _phase_view(c_out, x_v.shape[2:], window, pad)
        x_pads = ()
    return Conv(x=program.inputs.index(x_v), w=program.inputs.index(w_v), rank=rank, batch=x_v.shape[0],
                c_in=c_in, c_out=c_out, in_spatial=in_spatial, window=window, x_pads=x_pads, phases=phases,
                w_steps=w_steps, strides=strides if strides != (1,) * rank else (), tail=tuple(tail),
                inputs=tuple(program.inputs),
                dtype=x_v.dtype, w_dtype=w_v.dtype, highest=highest, conv_out=conv.out, operands=tuple(operands),
                ops=tuple(ops), output=written, mode=mode, reduces=mode != TILED, n_inputs=len(program.inputs),
                n_static=len(program.static))



def recognise(program: Program, output: Value) -> Conv | None:
    """The recogniser listed in families.RECOGNISERS."""
    return recognise_conv(program, output)
