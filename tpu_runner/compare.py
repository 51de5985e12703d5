"""Compare a candidate's outputs with the reference's, leaf by leaf, with numpy only.

This runs in the evaluator's own process, which never imports candidate code: outputs arrive as files
(`tpu_runner.arrays`), so nothing the candidate did to its own process can change the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tpu_runner.arrays import OutputSet
from tpu_runner.result import EvalError


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


def wide(x: Any) -> np.ndarray:
    arr = np.asarray(x)
    return arr.astype(np.float64) if arr.dtype.kind == "f" or arr.dtype.name in ("bfloat16", "float16") else arr


def _fail(kind: str, detail: str, abs_err: float = float("inf"), rel_err: float = float("inf")) -> Comparison:
    return Comparison(False, abs_err, rel_err, EvalError(kind, detail))


def compare_outputs(candidate: Any, reference: Any, atol: float, rtol: float, truth: Any = None) -> Comparison:
    """Structure, shape and dtype of every leaf, then values within atol + rtol * |reference|.

    With `truth` (the reference evaluated in float64), the candidate may also be off by twice the reference's
    own rounding error: on ill-conditioned inputs an honest kernel that sums in another order is as right as
    the reference is, and no more wrong than that is accepted.
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
        ch, rh = wide(c), wide(r)
        if ch.dtype.kind != "f":
            bad = ch != rh
            if bad.any():
                idx = tuple(int(k) for k in np.argwhere(bad)[0])
                return _fail("mismatch", f"output[{i}] at {idx}: candidate {ch[idx]}, reference {rh[idx]}")
            continue
        c_nan, r_nan = ~np.isfinite(ch), ~np.isfinite(rh)
        if (c_nan & ~r_nan).any():
            idx = tuple(int(k) for k in np.argwhere(c_nan & ~r_nan)[0])
            count = int((c_nan & ~r_nan).sum())
            return _fail("nan", f"output[{i}] has {count} non-finite values where the reference is finite, first "
                         f"at {idx} (candidate {ch[idx]}, reference {rh[idx]}); an uninitialised accumulator, a "
                         "part of the output never written, or an overflow")
        both = ~c_nan & ~r_nan
        diff = np.where(both, np.abs(ch - rh), 0.0)
        allowed = atol + rtol * np.abs(np.where(both, rh, 0.0))
        if t is not None and np.shape(t) == rh.shape:
            th = np.asarray(t, dtype=np.float64)
            allowed = allowed + 2.0 * np.where(both & np.isfinite(th), np.abs(rh - th), 0.0)
        abs_err = float(diff.max(initial=0.0))
        significant = both & (np.abs(rh) > max(atol, 1e-30))
        rel_err = float((diff[significant] / np.abs(rh[significant])).max(initial=0.0))
        worst_abs, worst_rel = max(worst_abs, abs_err), max(worst_rel, rel_err)
        over = diff > allowed
        if over.any() or (c_nan != r_nan).any():
            if over.any():
                idx = tuple(int(k) for k in np.unravel_index(int(np.argmax(diff - allowed)), diff.shape))
                detail = (f"output[{i}] differs at {int(over.sum())} of {diff.size} elements; worst at {idx}: "
                          f"candidate {ch[idx]:.6g}, reference {rh[idx]:.6g}, |diff| {diff[idx]:.3g} > "
                          f"atol + rtol*|ref| = {allowed[idx]:.3g}")
            else:
                detail = f"output[{i}] is finite where the reference is not"
            return _fail("mismatch", detail, worst_abs, worst_rel)
    return Comparison(True, worst_abs, worst_rel)


def bitwise_equal(a: OutputSet, b: OutputSet) -> bool:
    return a.tree == b.tree and len(a.leaves) == len(b.leaves) and all(
        x.shape == y.shape and np.array_equal(wide(x), wide(y), equal_nan=True) for x, y in zip(a.leaves, b.leaves,
                                                                                               strict=True))


def output_scale(outputs: OutputSet) -> float:
    """Root-mean-square magnitude of the floating outputs."""
    squares = [np.mean(np.square(wide(x))) for x in outputs.leaves if wide(x).dtype.kind == "f" and x.size]
    return float(np.sqrt(np.mean(squares))) if squares else 0.0


def all_finite(outputs: OutputSet) -> bool:
    return all(np.isfinite(wide(x)).all() for x in outputs.leaves if wide(x).dtype.kind == "f")


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
