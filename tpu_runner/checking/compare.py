"""Compare a candidate's outputs with the reference's, leaf by leaf, with numpy only.

This runs in the evaluator's own process, which never imports candidate code: outputs arrive as files
(`tpu_runner.checking.arrays`), so nothing the candidate did to its own process can change the verdict.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from tpu_runner.checking.arrays import OutputSet
from tpu_runner.reports import EvalError


@dataclass
class Comparison:
    ok: bool
    max_abs_err: float
    max_rel_err: float
    error: EvalError | None = None


def as_output_set(value: Any) -> OutputSet:
    """An OutputSet as it is, or a pytree of arrays flattened into one."""
    if isinstance(value, OutputSet):
        return value
    import jax

    leaves, tree = jax.tree.flatten(value)
    return OutputSet(tree=str(tree), leaves=tuple(np.asarray(x) for x in leaves))


def floating(dtype: np.dtype) -> bool:
    """A floating dtype, numpy's own or bfloat16 (ml_dtypes)."""
    return dtype.kind == "f" or dtype.name in ("bfloat16", "float16")


def wide(x: Any) -> np.ndarray:
    arr = np.asarray(x)
    return arr.astype(np.float64) if floating(arr.dtype) else arr


def _fail(kind: str, detail: str, abs_err: float = float("inf"), rel_err: float = float("inf")) -> Comparison:
    return Comparison(False, abs_err, rel_err, EvalError(kind, detail))


@dataclass
class _Block:
    """What one block of a floating leaf contributes to its comparison (indices are flat, into the whole leaf)."""

    new_nonfinite: int = 0  # candidate not finite where the reference is
    first_new_nonfinite: int = -1
    nonfinite_differs: bool = False  # finite in one, not in the other (either way)
    abs_err: float = 0.0
    rel_err: float = 0.0
    over: int = 0  # elements beyond the allowed difference
    worst_excess: float = -np.inf  # the largest (diff - allowed), and where
    worst_at: int = -1


def _compare_block(ch: np.ndarray, rh: np.ndarray, th: np.ndarray | None, start: int, atol: float,
                   rtol: float) -> _Block:
    ch, rh = wide(ch), wide(rh)
    c_bad, r_bad = ~np.isfinite(ch), ~np.isfinite(rh)
    block = _Block()
    new_bad = c_bad & ~r_bad
    block.new_nonfinite = int(np.count_nonzero(new_bad))
    if block.new_nonfinite:
        block.first_new_nonfinite = start + int(np.argmax(new_bad))
    block.nonfinite_differs = bool((c_bad != r_bad).any())
    both = ~c_bad & ~r_bad
    diff = np.where(both, np.abs(ch - rh), 0.0)
    ref_abs = np.abs(np.where(both, rh, 0.0))
    allowed = atol + rtol * ref_abs
    if th is not None:
        th = np.asarray(th, dtype=np.float64)
        allowed += 2.0 * np.where(both & np.isfinite(th), np.abs(rh - th), 0.0)
    block.abs_err = float(diff.max(initial=0.0))
    significant = ref_abs > max(atol, 1e-30)
    if significant.any():
        block.rel_err = float((diff[significant] / ref_abs[significant]).max())
    excess = diff - allowed
    block.over = int(np.count_nonzero(excess > 0))
    if excess.size:
        at = int(np.argmax(excess))
        block.worst_excess, block.worst_at = float(excess[at]), start + at
    return block


_BLOCK = 1 << 18  # elements compared at a time: a few MB of float64 temporaries, in cache, spread over threads
# Its threads start on first use: a process that compares only small outputs, or none, starts none.
_COMPARERS = ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1), thread_name_prefix="compare")


def _compare_leaf(c: np.ndarray, r: np.ndarray, t: np.ndarray | None, atol: float, rtol: float) -> list[_Block]:
    cf, rf = np.ascontiguousarray(c).reshape(-1), np.ascontiguousarray(r).reshape(-1)
    tf = np.ascontiguousarray(t).reshape(-1) if t is not None else None
    starts = range(0, cf.size, _BLOCK)

    def one(start: int) -> _Block:
        end = start + _BLOCK
        return _compare_block(cf[start:end], rf[start:end], tf[start:end] if tf is not None else None, start, atol,
                              rtol)

    if len(starts) <= 1:
        return [one(start) for start in starts]
    return list(_COMPARERS.map(one, starts))


def compare_outputs(candidate: Any, reference: Any, atol: float, rtol: float, truth: Any = None) -> Comparison:
    """Structure, shape and dtype of every leaf, then values within atol + rtol * |reference|.

    With `truth` (the reference evaluated in float64), the candidate may also be off by twice the reference's
    own rounding error: on ill-conditioned inputs an honest kernel that sums in another order is as right as
    the reference is, and no more wrong than that is accepted. Floating leaves are compared block by block on
    several threads (a production output of 100M elements in well under a second on a TPU host).
    """
    cand, ref = as_output_set(candidate), as_output_set(reference)
    t_leaves: tuple[Any, ...] = as_output_set(truth).leaves if truth is not None else ()
    if len(t_leaves) != len(ref.leaves):
        t_leaves = (None,) * len(ref.leaves)
    if cand.tree != ref.tree:
        return _fail("output_structure", f"the candidate returns {cand.tree}; the reference returns {ref.tree}")
    worst_abs = worst_rel = 0.0
    for i, (c, r, t) in enumerate(zip(cand.leaves, ref.leaves, t_leaves, strict=True)):
        if c.shape != r.shape:
            return _fail("shape_mismatch", f"output[{i}] has shape {c.shape}; the reference's is {r.shape}")
        if c.dtype != r.dtype:
            return _fail("dtype_mismatch", f"output[{i}] has dtype {c.dtype}; the reference's is {r.dtype} "
                         "(a lower-precision result is not the same computation)")
        if not floating(c.dtype):
            ch, rh = np.asarray(c), np.asarray(r)
            bad = ch != rh
            if bad.any():
                idx = tuple(int(k) for k in np.argwhere(bad)[0])
                return _fail("mismatch", f"output[{i}] at {idx}: candidate {ch[idx]}, reference {rh[idx]}")
            continue
        truth_leaf = t if t is not None and np.shape(t) == r.shape else None
        blocks = _compare_leaf(c, r, truth_leaf, atol, rtol)
        new_bad = sum(b.new_nonfinite for b in blocks)
        if new_bad:
            idx = _index(next(b.first_new_nonfinite for b in blocks if b.new_nonfinite), c.shape)
            return _fail("nan", f"output[{i}] has {new_bad} non-finite values where the reference is finite, first "
                         f"at {idx} (candidate {wide(c[idx])}, reference {wide(r[idx])}); an uninitialised "
                         "accumulator, a part of the output never written, or an overflow")
        abs_err = max((b.abs_err for b in blocks), default=0.0)
        rel_err = max((b.rel_err for b in blocks), default=0.0)
        worst_abs, worst_rel = max(worst_abs, abs_err), max(worst_rel, rel_err)
        over = sum(b.over for b in blocks)
        if over or any(b.nonfinite_differs for b in blocks):
            if over:
                worst = max(blocks, key=lambda b: b.worst_excess)
                idx = _index(worst.worst_at, c.shape)
                ch, rh = float(wide(c[idx])), float(wide(r[idx]))
                diff = abs(ch - rh)
                detail = (f"output[{i}] differs at {over} of {c.size} elements; worst at {idx}: "
                          f"candidate {ch:.6g}, reference {rh:.6g}, |diff| {diff:.3g} > "
                          f"atol + rtol*|ref| = {diff - worst.worst_excess:.3g}")
            else:
                detail = f"output[{i}] is finite where the reference is not"
            return _fail("mismatch", detail, worst_abs, worst_rel)
    return Comparison(True, worst_abs, worst_rel)


def _index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(k) for k in np.unravel_index(flat, shape)) if shape else ()


def bitwise_equal(a: OutputSet, b: OutputSet) -> bool:
    """The same values (NaN equal to NaN): byte for byte first, which is what two runs of a deterministic kernel
    give, by value only when the bytes differ (a -0.0 for a 0.0 is the same value)."""
    return a.tree == b.tree and len(a.leaves) == len(b.leaves) and all(
        x.shape == y.shape and (same_bytes(x, y) or np.array_equal(wide(x), wide(y), equal_nan=True))
        for x, y in zip(a.leaves, b.leaves, strict=True))


def same_bytes(x: np.ndarray, y: np.ndarray) -> bool:
    """Byte for byte the same array: shape, dtype and every bit (NaNs alike, -0.0 not 0.0); ~10x faster than a value
    comparison on production-sized arrays."""
    return x.shape == y.shape and x.dtype == y.dtype and np.array_equal(np.ascontiguousarray(x).view(np.uint8),
                                                                       np.ascontiguousarray(y).view(np.uint8))


def output_scale(outputs: OutputSet) -> float:
    """Root-mean-square magnitude of the floating outputs."""
    squares = []
    for x in outputs.leaves:
        if floating(x.dtype) and x.size:
            flat = wide(x).reshape(-1)
            squares.append(float(flat @ flat) / flat.size)  # one pass, by BLAS, instead of square then mean
    return float(np.sqrt(np.mean(squares))) if squares else 0.0


def all_finite(outputs: OutputSet) -> bool:
    return all(np.isfinite(x.astype(np.float32) if x.dtype.name in ("bfloat16", "float16") else x).all()
               for x in outputs.leaves if floating(x.dtype))


def within_sensitivity(candidate: OutputSet, truth: OutputSet, perturbed: OutputSet) -> tuple[bool, str]:
    """Is the candidate as far from the float64 truth as the task's own output moves when its inputs are
    rounded at their precision (`perturbed`), normwise per leaf? On ill-conditioned inputs (attention logits
    scaled up until the softmax is one-hot) an honest kernel that rounds an intermediate once, as production
    kernels do, lands on other elements than the reference: no elementwise tolerance is fair there, but the
    task's sensitivity is a bound no wrong kernel meets on every case."""
    if not (len(candidate.leaves) == len(truth.leaves) == len(perturbed.leaves)):
        return False, ""
    worst = ""
    for i, (c, t, p) in enumerate(zip(candidate.leaves, truth.leaves, perturbed.leaves, strict=True)):
        ch, th, ph = wide(c), wide(t), wide(p)
        if ch.dtype.kind != "f" or ch.shape != th.shape or ph.shape != th.shape:
            continue
        both = np.isfinite(ch) & np.isfinite(th) & np.isfinite(ph)
        if not both.all() and (np.isfinite(th) & ~np.isfinite(ch)).any():
            return False, ""
        off = float(np.linalg.norm((ch - th)[both]))
        moves = float(np.linalg.norm((ph - th)[both]))
        if off > 2.0 * moves:
            return False, ""
        worst = f"output[{i}] is {off:.3g} from the float64 truth (2-norm), within twice the {moves:.3g} the " \
                "truth moves when the inputs are rounded at their precision"
    return bool(worst), worst
