"""Stage 4: run candidate and reference on evaluator-owned inputs and compare every output leaf.

On a CPU host the candidate runs in Pallas TPU interpret mode with uninitialised memory as NaN and
out-of-bounds reads raising. Every call gets freshly built device arrays; inputs are compared with copies
afterwards; the first case is run twice to check determinism.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from tpu_runner.inputs import EVALUATOR_CASES, Case, case_inputs
from tpu_runner.result import CorrectnessCase, EvalError
from tpu_runner.tasks import Configuration, TaskError


class CandidateFailed(Exception):
    def __init__(self, error: EvalError):
        super().__init__(error.detail)
        self.error = error


@contextlib.contextmanager
def interpret_mode(enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return
    from jax.experimental.pallas import tpu as pltpu

    params = pltpu.InterpretParams(uninitialized_memory="nan", out_of_bounds_reads="raise")
    try:
        with pltpu.force_tpu_interpret_mode(params):
            yield
    finally:
        pltpu.reset_tpu_interpret_mode_state()


def _host(x: Any) -> np.ndarray:
    arr = np.asarray(x)
    return arr.astype(np.float64) if arr.dtype.kind == "f" or arr.dtype.name == "bfloat16" else arr


@dataclass
class Comparison:
    ok: bool
    max_abs_err: float
    max_rel_err: float
    error: EvalError | None = None


def compare_outputs(candidate: Any, reference: Any, atol: float, rtol: float, truth: Any = None) -> Comparison:
    """Structure, shape and dtype of every leaf, then values within atol + rtol * |reference|.

    With `truth` (the reference evaluated in float64), the candidate may also be off by twice the reference's
    own rounding error: on ill-conditioned inputs an honest kernel that sums in another order is as right as
    the reference is, and no more wrong than that is accepted.
    """
    c_leaves, c_tree = jax.tree.flatten(candidate)
    r_leaves, r_tree = jax.tree.flatten(reference)
    t_leaves = jax.tree.leaves(truth) if truth is not None else [None] * len(r_leaves)
    if len(t_leaves) != len(r_leaves):
        t_leaves = [None] * len(r_leaves)
    if c_tree != r_tree:
        return Comparison(False, float("inf"), float("inf"), EvalError(
            "output_structure", f"the candidate returns {c_tree}; the reference returns {r_tree}"))
    worst_abs = worst_rel = 0.0
    for i, (c, r, t) in enumerate(zip(c_leaves, r_leaves, t_leaves, strict=True)):
        c_shape, r_shape = tuple(np.shape(c)), tuple(np.shape(r))
        if c_shape != r_shape:
            return Comparison(False, float("inf"), float("inf"), EvalError(
                "shape_mismatch", f"output[{i}] has shape {c_shape}; the reference's is {r_shape}"))
        c_dtype, r_dtype = np.asarray(c).dtype, np.asarray(r).dtype
        if c_dtype != r_dtype:
            return Comparison(False, float("inf"), float("inf"), EvalError(
                "dtype_mismatch", f"output[{i}] has dtype {c_dtype}; the reference's is {r_dtype} "
                "(a lower-precision result is not the same computation)"))
        ch, rh = _host(c), _host(r)
        if ch.dtype.kind != "f":
            bad = ch != rh
            if bad.any():
                idx = tuple(int(k) for k in np.argwhere(bad)[0])
                return Comparison(False, float("inf"), float("inf"), EvalError(
                    "mismatch", f"output[{i}] at {idx}: candidate {ch[idx]}, reference {rh[idx]}"))
            continue
        c_nan = ~np.isfinite(ch)
        r_nan = ~np.isfinite(rh)
        if (c_nan & ~r_nan).any():
            idx = tuple(int(k) for k in np.argwhere(c_nan & ~r_nan)[0])
            count = int((c_nan & ~r_nan).sum())
            return Comparison(False, float("inf"), float("inf"), EvalError(
                "nan", f"output[{i}] has {count} non-finite values where the reference is finite, first at {idx} "
                f"(candidate {ch[idx]}, reference {rh[idx]}); an uninitialised accumulator or an overflow"))
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
            return Comparison(False, worst_abs, worst_rel, EvalError("mismatch", detail))
    return Comparison(True, worst_abs, worst_rel)


def _fresh(host_inputs: list[np.ndarray], static: tuple[Any, ...]) -> list[Any]:
    return [jax.numpy.asarray(np.array(x)) for x in host_inputs] + list(static)


def _float64_truth(reference: Callable[..., Any], host: list[np.ndarray], config: Configuration) -> Any:
    """The reference evaluated in float64 on the same inputs, or None where it cannot run that way."""
    wide = [x.astype(np.float64) if np.asarray(x).dtype.kind == "f" or np.asarray(x).dtype.name == "bfloat16"
            else x for x in host]
    try:
        with jax.enable_x64(True):
            fn = jax.jit(reference, static_argnums=config.static_argnums)
            out = fn(*[jax.numpy.asarray(x) for x in wide], *config.static)
            return jax.tree.map(lambda x: np.asarray(x, dtype=np.float64) if np.asarray(x).dtype.kind == "f" else None,
                                out)
    except Exception:
        return None


def _output_scale(tree: Any) -> float:
    """Root-mean-square magnitude of the floating outputs."""
    squares = [np.mean(np.square(_host(x))) for x in jax.tree.leaves(tree) if _host(x).dtype.kind == "f"]
    return float(np.sqrt(np.mean(squares))) if squares else 0.0


def _bitwise_equal(a: Any, b: Any) -> bool:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        if not np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True):
            return False
    return True


def check_configuration(
    *, name: str, config: Configuration, reference: Callable[..., Any], candidate: Callable[..., Any],
    atol: float, rtol: float, interpret: bool, candidate_path: str, cases: tuple[Case, ...] = EVALUATOR_CASES,
) -> list[CorrectnessCase]:
    """Check one configuration; raise CandidateFailed at the first failing case."""
    from tpu_runner.errors import from_exception

    ref_fn = jax.jit(reference, static_argnums=config.static_argnums)
    cand_fn = jax.jit(candidate, static_argnums=config.static_argnums)
    results: list[CorrectnessCase] = []
    checked_determinism = False
    baseline_scale: float | None = None
    for case in cases:
        host = case_inputs(config, case)
        if host is None:
            continue
        label = f"{name}/{case.name}"
        expected = jax.block_until_ready(ref_fn(*_fresh(host, config.static)))
        finite = all(np.isfinite(_host(x)).all() for x in jax.tree.leaves(expected) if _host(x).dtype.kind == "f")
        if not finite and case.distribution == "task":
            raise TaskError(f"the reference produces NaN or inf on the task's own inputs ({config.describe()}); "
                            "fix reference.py or its inputs before evaluating kernels against it")
        if not finite:
            results.append(CorrectnessCase(label, "skipped", note="the reference is not finite on these inputs"))
            continue
        args = _fresh(host, config.static)
        try:
            with interpret_mode(interpret):
                got = jax.block_until_ready(cand_fn(*args))
                again = None
                if not checked_determinism:
                    again = jax.block_until_ready(cand_fn(*_fresh(host, config.static)))
        except Exception as exc:
            error = from_exception(exc, stage="correctness", candidate_path=candidate_path,
                                   default_kind="runtime_error")
            raise CandidateFailed(EvalError(error.kind, f"{label}: {error.detail}", error.line, "correctness")) from exc
        for k, (arg, original) in enumerate(zip(args, host, strict=False)):
            if arg.is_deleted():
                raise CandidateFailed(EvalError("input_donated", f"{label}: input {k} was donated/deleted by the "
                                                "candidate; inputs must be left untouched"))
            if not np.array_equal(np.asarray(arg), original, equal_nan=True):
                raise CandidateFailed(EvalError("input_mutated", f"{label}: input {k} changed during the call"))
        # atol is set for the task's own input scale; scaled inputs (the "large" case) scale it with the output,
        # so an honest kernel's different summation order is not called wrong on a 4096x larger matmul.
        scale = _output_scale(expected)
        baseline_scale = baseline_scale or scale
        case_atol = atol * max(1.0, scale / baseline_scale) if baseline_scale else atol
        comparison = compare_outputs(got, expected, case_atol, rtol)
        if not comparison.ok and comparison.error and comparison.error.kind == "mismatch":
            truth = _float64_truth(reference, host, config)
            if truth is not None:
                comparison = compare_outputs(got, expected, case_atol, rtol, truth)
        if not comparison.ok:
            assert comparison.error is not None
            err = comparison.error
            raise CandidateFailed(EvalError(err.kind, f"{label} (inputs: {config.describe()}): {err.detail}"))
        if again is not None:
            checked_determinism = True
            if not _bitwise_equal(got, again):
                raise CandidateFailed(EvalError("nondeterministic", f"{label}: two runs on the same inputs differ"))
        note = f"atol scaled to {case_atol:.3g} with the output" if case_atol != atol else ""
        results.append(CorrectnessCase(label, "passed", comparison.max_abs_err, comparison.max_rel_err, note))
    return results
