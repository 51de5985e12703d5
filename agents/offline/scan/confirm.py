"""Confirming `lax.associative_scan` by numbers: the flat program holds it as strided slices, pads and
concatenations along one axis, so its ops are run in numpy (float64, along the scan axis only, the other axes kept
at 1) beside a prefix sum and beside the recurrence h_t = a_t * h_(t-1) + x_t, in both directions and with either
input as `a`; anything merely shaped like a scan is refused. Numpy only: this runs where the program is recognised.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agents.offline.expr import FLOAT_DTYPES, FULL, NotRecognised
from agents.offline.program import Op, Program, Value
from agents.offline.scan.family import Cumsum, Recurrence
from agents.offline.scan.shape import SCANS_WRITTEN


def _run_along(program: Program, axis: int, values: list[np.ndarray]) -> np.ndarray:
    """Run the program's ops in float64 on arrays that keep only the scan axis (the others are 1), checking that
    every op acts on whole lines along the other axes; raises NotRecognised when one does not."""
    main = program.inputs[0].shape
    env: dict[int, np.ndarray] = {v.id: a for v, a in zip(program.inputs, values, strict=True)}

    def arg(a: Any) -> Any:
        return env[a.id] if isinstance(a, Value) else float(a)

    def whole(op: Op) -> None:
        shape = op.out.shape
        if len(shape) != len(main) or any(d != m for i, (d, m) in enumerate(zip(shape, main, strict=True))
                                          if i != axis):
            raise NotRecognised(f"the reference's {op.prim} gives {list(shape)}, which does not keep the other axes "
                                f"of {list(main)} whole")

    for op in program.ops:
        whole(op)
        p = op.params
        if op.prim == "slice":
            start, limit = p["start_indices"], p["limit_indices"]
            strides = p.get("strides") or (1,) * len(main)
            out = arg(op.args[0])[(slice(None),) * axis + (slice(start[axis], limit[axis], strides[axis]),)]
        elif op.prim == "pad":
            config = p["padding_config"]
            if any(tuple(c) != (0, 0, 0) for d, c in enumerate(config) if d != axis):
                raise NotRecognised("the reference pads across the scan axis")
            out = _pad(arg(op.args[0]), axis, tuple(config[axis]), arg(op.args[1]))
        elif op.prim == "concatenate":
            if int(p["dimension"]) != axis:
                raise NotRecognised("the reference concatenates across the scan axis")
            out = np.concatenate([np.broadcast_to(arg(a), (1,) * len(main)) if not isinstance(a, Value) else arg(a)
                                  for a in op.args], axis=axis)
        elif op.prim == "rev":
            if tuple(p["dimensions"]) != (axis,):
                raise NotRecognised("the reference reverses an axis other than the scan's")
            out = np.flip(arg(op.args[0]), axis=axis)
        elif op.prim in ("add", "mul"):
            left, right = arg(op.args[0]), arg(op.args[1])
            out = left + right if op.prim == "add" else left * right
        elif op.prim == "convert_element_type":
            out = np.asarray(arg(op.args[0]), dtype=np.float64)
        else:
            raise NotRecognised(f"the reference's associative scan uses {op.prim}")
        env[op.out.id] = np.broadcast_to(out, tuple(1 if i != axis else d for i, d in enumerate(op.out.shape)))
    result = program.outputs[0]
    return env[result.id] if isinstance(result, Value) else np.asarray(float(result))


def _pad(x: np.ndarray, axis: int, config: tuple[int, int, int], value: float) -> np.ndarray:
    low, high, interior = config
    moved = np.moveaxis(x, axis, 0)
    n = moved.shape[0]
    spread = np.full(((n - 1) * (interior + 1) + 1 if n else 0,) + moved.shape[1:], value, dtype=np.float64)
    spread[::interior + 1] = moved
    spread = np.concatenate([np.full((low,) + moved.shape[1:], value), spread]) if low >= 0 else spread[-low:]
    spread = np.concatenate([spread, np.full((high,) + moved.shape[1:], value)]) if high >= 0 else spread[:high]
    return np.moveaxis(spread, 0, axis)


def _recurrence_model(a: np.ndarray, x: np.ndarray, axis: int, reverse: bool) -> np.ndarray:
    a, x = np.moveaxis(a, axis, 0), np.moveaxis(x, axis, 0)
    h = np.zeros_like(x)
    carry = np.zeros(x.shape[1:])
    steps = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
    for t in steps:
        carry = a[t] * carry + x[t]
        h[t] = carry
    return np.moveaxis(h, 0, axis)


def _agrees(got: np.ndarray, want: np.ndarray) -> bool:
    return got.shape == want.shape and bool(np.all(np.abs(got - want) <= 1e-9 * (1.0 + np.abs(want))))


def confirm_associative(program: Program, output: Value, axis: int) -> Cumsum | Recurrence:
    """What a `lax.associative_scan` along `axis` computes, by its numbers: a prefix sum (one input) or the linear
    recurrence (two), in either direction and with either input as `a`; NotRecognised for anything else."""
    used = [v for v in program.inputs if program.users(v)]
    main = used[0].shape if used else ()
    if not used or any(v.shape != main for v in used) or len(used) > 2 or output.shape != main:
        raise NotRecognised("an associative scan whose inputs and output are not one or two arrays of one shape; "
                            f"the offline brain writes {SCANS_WRITTEN}")
    if any(v.dtype not in FLOAT_DTYPES for v in used):
        raise NotRecognised("an associative scan of non-float arrays")
    n = main[axis]
    rng = np.random.default_rng(20261203)
    line = tuple(1 if d != axis else n for d in range(len(main)))
    positions = {v.id: i for i, v in enumerate(program.inputs)}

    def run(arrays: dict[int, np.ndarray]) -> np.ndarray:
        return _run_along(program, axis, [arrays.get(v.id, np.zeros(line)) for v in program.inputs])

    if len(used) == 1:
        x = rng.standard_normal(line)
        got = run({used[0].id: x})
        for reverse in (False, True):
            want = np.flip(np.cumsum(np.flip(x, axis), axis), axis) if reverse else np.cumsum(x, axis)
            if _agrees(got, want):
                return Cumsum(shape=main, axis=axis, reverse=reverse,
                              operands=((positions[used[0].id], used[0], FULL),),
                              pre=(), scan_in=used[0], scan_out=output, post=(), output=output,
                              n_inputs=len(program.inputs), n_static=len(program.static))
    else:
        for a_v, x_v in (used, used[::-1]):
            a, x = rng.uniform(0.5, 1.0, line), rng.standard_normal(line)
            got = run({a_v.id: a, x_v.id: x})
            for reverse in (False, True):
                if _agrees(got, _recurrence_model(a, x, axis, reverse)):
                    return Recurrence(shape=main, axis=axis, reverse=reverse, a=positions[a_v.id],
                                      x=positions[x_v.id], dtype=x_v.dtype, out_dtype=output.dtype,
                                      n_inputs=len(program.inputs), n_static=len(program.static))
    raise NotRecognised(f"the reference scans along axis {axis} with lax.associative_scan, but its numbers are "
                        f"neither a prefix sum nor h_t = a_t * h_(t-1) + x_t; the offline brain writes {SCANS_WRITTEN}")
