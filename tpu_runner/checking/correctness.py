"""Stage 4: run candidate and reference on evaluator-owned inputs and judge every output leaf.

Three steps, each of which the evaluator runs in a different process:
- `run_candidate_case` (the candidate's sandboxed child): on a CPU host in Pallas TPU interpret mode with
  uninitialised memory as NaN and out-of-bounds reads raising; freshly built arrays for every call, inputs
  compared with copies afterwards, the first case run twice for determinism.
- `run_reference_case` (a child that never imports the candidate): the reference as XLA computes it on the
  target (`numerics.as_on_tpu`) and in float64, the truth that widens the tolerance by the reference's own error.
- `judge_case` (the evaluator's process, numpy only): the outputs compared, case by case, in order.
`check_configuration` runs all three in one process, for tests and tools that trust both functions.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import jax
import numpy as np

from tpu_runner.checking.arrays import OutputSet, load_outputs
from tpu_runner.checking.compare import (
    Comparison,
    all_finite,
    as_output_set,
    bitwise_equal,
    compare_outputs,
    floating,
    output_scale,
    same_bytes,
    within_sensitivity,
)
from tpu_runner.checking.numerics import sliced_widened_program, widened_program
from tpu_runner.reports import MEMORY_LIMIT_ENV, CorrectnessCase, EvalError, from_exception, interpreter_limitation
from tpu_runner.sandbox import rss_mib
from tpu_runner.tasks import DRAW_CHUNK, EVALUATOR_CASES, Case, Configuration, Task, TaskError, case_inputs, with_values

INTERPRETER_LIMIT = "interpret_unsupported"  # the simulator, not the kernel, failed: correctness not checkable here


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


def _fresh(host_inputs: list[np.ndarray], static: tuple[Any, ...]) -> list[Any]:
    # Copied straight into the device's memory (on a CPU never aliasing the host arrays, which judge the call's
    # inputs afterwards), without a host copy first: at production shapes that was GiBs more at once.
    return [jax.numpy.array(x, copy=True) for x in host_inputs] + list(static)


@dataclass
class CandidateRun:
    case: Case
    outputs: OutputSet | None = None
    again: OutputSet | None = None  # a second run on the same inputs (the first case only)
    error: EvalError | None = None  # the call raised, or it changed or donated its inputs


@dataclass
class ReferenceRun:
    case: Case
    expected: OutputSet
    truth: OutputSet | None  # float64, None where the reference cannot run that way or it is made `later`
    # float64 on inputs rounded once more at their precision (the task's sensitivity): asked for only when an
    # elementwise comparison fails, since it costs another float64 run of the reference
    perturbed: Callable[[], OutputSet | None] | None = None
    # the truth, where it was not made with the outputs (large dots at production shapes): made when first asked
    later: Callable[[], OutputSet | None] | None = None

    def float64(self) -> OutputSet | None:
        """The float64 truth, made now if it is made only when needed."""
        if self.truth is None and self.later is not None:
            self.truth, self.later = self.later(), None
        return self.truth


def run_candidate_case(*, label: str, config: Configuration, candidate: Callable[..., Any], case: Case,
                       interpret: bool, candidate_path: str, twice: bool,
                       host: list[np.ndarray] | None = None) -> CandidateRun | None:
    """The candidate's outputs on one case (None when the case does not apply to this configuration); `host`, the
    case's inputs when drawn already."""
    host = host if host is not None else case_inputs(config, case)
    if host is None:
        return None
    fn = jax.jit(candidate, static_argnums=config.static_argnums)
    args = _fresh(host, config.static)
    try:
        with interpret_mode(interpret):
            got = as_output_set(jax.block_until_ready(fn(*args)))
            again = as_output_set(jax.block_until_ready(fn(*_fresh(host, config.static)))) if twice else None
    except Exception as exc:
        limit = interpreter_limitation(exc) if interpret else None
        if limit is not None:
            return CandidateRun(case, error=EvalError(INTERPRETER_LIMIT, f"{label}: {limit}", None, "correctness"))
        error = from_exception(exc, stage="correctness", candidate_path=candidate_path, default_kind="runtime_error")
        return CandidateRun(case, error=EvalError(error.kind, f"{label}: {error.detail}", error.line, "correctness"))
    for k, (arg, original) in enumerate(zip(args, host, strict=False)):
        if arg.is_deleted():
            return CandidateRun(case, error=EvalError("input_donated", f"{label}: input {k} was donated/deleted by "
                                                      "the candidate; inputs must be left untouched"))
        if not same_bytes(np.asarray(arg), original):  # a -0.0 written over a 0.0 is a change too
            return CandidateRun(case, error=EvalError("input_mutated", f"{label}: input {k} changed during the call"))
    return CandidateRun(case, outputs=got, again=again)


# Unit roundoff of each floating dtype: how far one rounding at that precision can move a value, relatively.
UNIT_ROUNDOFF = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -24, "float64": 2.0 ** -53}


def with_kept_values(task: Task, config: Configuration, values_from: str | None, kept: Path | None) -> Configuration:
    """The configuration with the task's own values: those kept with the reference's outputs (`kept`, the file a
    child was handed: what the outputs were computed on), else from get_inputs() / get_test_inputs() again."""
    if kept is not None:
        values = load_outputs(kept).leaves
        if tuple(np.shape(v) for v in values) == tuple(a.shape for a in config.dynamic):
            return Configuration(config.dynamic, config.static, tuple(values))
    return with_values(task, config, values_from)


def _perturbed(host: list[np.ndarray], seed: int) -> list[np.ndarray]:
    """Each floating input moved by one unit roundoff of its dtype, with a random sign per element, a chunk at a
    time (5p's 1G-element bias, moved whole in float64 with its signs, took 25 GB). A 16-bit float moved so is
    exact in float32 (its 8 or 11 bits of mantissa times 1 +- u), a wider one needs float64."""
    rng = np.random.default_rng(seed)
    out = []
    for x in host:
        x = np.asarray(x)
        if not floating(x.dtype):
            out.append(x)
            continue
        u = UNIT_ROUNDOFF.get(x.dtype.name, 2.0 ** -24)
        moved = np.empty(x.shape, np.float32 if x.dtype.itemsize <= 2 else np.float64)
        flat, source = moved.reshape(-1), x.reshape(-1)
        for start in range(0, flat.size, DRAW_CHUNK):
            part = source[start:start + DRAW_CHUNK].astype(moved.dtype)
            signs = rng.integers(0, 2, size=part.size).astype(moved.dtype)
            part *= 1.0 + u * (2.0 * signs - 1.0)
            flat[start:start + DRAW_CHUNK] = part
        out.append(moved)
    return out


def memory_allowance() -> int | None:
    """Bytes this process may still take under its sandbox's memory limit, less a tenth of it kept for what the
    caller holds beside; None where no limit is known (not in a sandboxed child)."""
    limit = os.environ.get(MEMORY_LIMIT_ENV)
    return int((int(limit) * 0.9 - rss_mib(os.getpid())) * 2**20) if limit else None


def _truth(reference: Callable[..., Any], host: list[np.ndarray], config: Configuration) -> OutputSet | None:
    """The reference evaluated in float64 on the same inputs - in float32 where float64 would not fit under this
    process's memory limit (still ~2^-24 against bf16's 2^-8), with a note saying so; None where it cannot run
    that way, and no leaves with a note saying why where neither would fit (`_made` tells them apart)."""
    dynamic = [np.asarray(x) for x in host]
    allowance, note = memory_allowance(), ""
    needs: dict[Any, int] = {}
    try:
        for dtype in (np.float64, np.float32):
            run, needs[dtype] = widened_program(reference, config.static, dynamic, dtype)
            if allowance is not None and needs[dtype] > allowance:
                note = note or (f"float64 would need ~{needs[dtype] / 2**30:.1f} GiB, beyond the "
                                f"{allowance / 2**30:.1f} GiB this evaluation has left")
                continue
            return _widened_truth(run(), dtype, note)
    except Exception:  # noqa: BLE001 - a reference that cannot run so simply has no truth
        return None
    # Neither fits whole: a slice at a time, where the reference computes its outputs independently along an axis
    # (5p's attention, head by head: ~108 GiB whole in float64).
    assert allowance is not None
    why = "float32 would not fit either, nor a slice of it"
    try:
        for dtype in (np.float64, np.float32):
            if (sliced := sliced_widened_program(reference, config.static, dynamic, dtype, allowance,
                                                 needs[dtype])) is not None:
                run, how = sliced
                return _widened_truth(run(), dtype, f"{note}; {how}" if dtype == np.float32 else how)
    except Exception as exc:  # noqa: BLE001 - said in the note: the judgement goes on without a truth
        why = f"float32 would not fit either, and running it in slices failed: {type(exc).__name__}: {exc}"[:300]
    # Neither fits: no leaves, and the note says why, for the judgement that asked.
    return OutputSet("", (), f"no float64 truth to judge it by: {note}; {why}")


def _widened_truth(outputs: Any, dtype: Any, note: str) -> OutputSet:
    out = as_output_set(outputs)
    leaves = tuple(np.asarray(x, np.float64) if np.asarray(x).dtype.kind == "f" else x for x in out.leaves)
    if dtype == np.float32:
        return OutputSet(out.tree, leaves, f"its float32 truth: {note}")
    return OutputSet(out.tree, leaves, f"its float64 truth, {note}" if note else "")


def _made(truth: OutputSet | None) -> OutputSet | None:
    """A truth that was made (None for one that could not be, or did not fit)."""
    return truth if truth is not None and truth.leaves else None


def run_reference_case(*, config: Configuration, reference: Callable[..., Any], case: Case,
                       as_target: Callable[..., Any] | None = None, truth: bool = True,
                       host: list[np.ndarray] | None = None) -> ReferenceRun | None:
    """The reference's outputs on one case: as the target computes (`as_target`, the dynamic arguments only)
    when given, else as written on this process's default device (a TPU's own numerics on a TPU); and, with
    `truth`, the float64 truth (on this process's default device: the reference's child on a TPU makes it on the
    CPU itself, `case_truth`, a TPU having no float64). `host`: the case's inputs, when drawn already."""
    host = host if host is not None else case_inputs(config, case)
    if host is None:
        return None
    if as_target is not None:
        expected = as_output_set(jax.block_until_ready(as_target(*_fresh(host, ()))))
    else:
        fn = jax.jit(reference, static_argnums=config.static_argnums)
        expected = as_output_set(jax.block_until_ready(fn(*_fresh(host, config.static))))
    wide = None
    if truth:
        wide = _made(_truth(reference, host, config))
    return ReferenceRun(case, expected, wide, lambda: perturbed_truth(config=config, reference=reference, case=case))


def case_truth(*, config: Configuration, reference: Callable[..., Any], case: Case,
               host: list[np.ndarray] | None = None) -> OutputSet | None:
    """The reference in float64 on the case's own inputs (None where the case does not apply or it cannot run so);
    `host`, those inputs when drawn already."""
    host = host if host is not None else case_inputs(config, case)
    return None if host is None else _truth(reference, host, config)


def perturbed_truth(*, config: Configuration, reference: Callable[..., Any], case: Case,
                    host: list[np.ndarray] | None = None) -> OutputSet | None:
    """The reference in float64 on the case's inputs moved by one unit roundoff of their dtypes; `host`, those
    inputs when drawn already."""
    host = host if host is not None else case_inputs(config, case)
    return None if host is None else _truth(reference, _perturbed(host, case.seed + 1), config)


def _mismatch(comparison: Comparison) -> bool:
    return not comparison.ok and comparison.error is not None and comparison.error.kind == "mismatch"


def _with_reason(comparison: Comparison, why: str) -> Comparison:
    """A failed comparison whose detail ends with why it could not be judged further."""
    assert comparison.error is not None
    return replace(comparison, error=replace(comparison.error, detail=f"{comparison.error.detail} ({why})"))


def judged(candidate: Any, expected: Any, atol: float, rtol: float, truth: Callable[[], OutputSet | None],
           perturbed: Callable[[], OutputSet | None]) -> tuple[Comparison, str]:
    """The candidate's outputs against the reference's, elementwise; where only values differ, again with the
    float64 truth (the reference's own error widens the tolerance), then against the task's sensitivity to its
    inputs' rounding (`within_sensitivity`). `truth` and `perturbed` are asked for only when needed: each is
    another float64 run of the reference. Returns the comparison and a note on how it passed."""
    comparison = compare_outputs(candidate, expected, atol, rtol)
    if not _mismatch(comparison) or (asked := truth()) is None:
        return comparison, ""
    if (wide := _made(asked)) is None:  # too large to make here: judged elementwise, and the detail says why
        return _with_reason(comparison, asked.note), ""
    comparison = compare_outputs(candidate, expected, atol, rtol, wide)
    if not _mismatch(comparison):
        narrower = comparison.ok and wide.note  # passed by a float32 truth: the note says why not float64
        return comparison, f"within the reference's own error ({wide.note})" if narrower else ""
    if (moved := _made(asked_moved := perturbed())) is None:  # no sensitivity to judge by: the detail says why
        why = asked_moved.note if asked_moved is not None and asked_moved.note else "the reference does not run " \
            "in float64"
        return _with_reason(comparison, f"the task's sensitivity to its inputs' rounding was not measured: {why}"), ""
    sensitive, note = within_sensitivity(as_output_set(candidate), wide, moved)
    if sensitive:
        comparison = Comparison(True, comparison.max_abs_err, comparison.max_rel_err)
    return comparison, note


def scaled_atol(atol: float, scale: float, baseline: float | None) -> float:
    """atol is set for the task's own input scale (its outputs' `baseline` magnitude); inputs drawn at another
    scale (the "large" case, unscaled "normal" draws of a task whose own weights are scaled) scale it with the
    output, so an honest kernel's different summation order is not called wrong on a larger matmul."""
    return atol * max(1.0, scale / baseline) if baseline else atol


@dataclass
class Judge:
    """Judges the cases of one configuration in order; remembers the scale of the first case's outputs."""

    name: str
    config: Configuration
    atol: float
    rtol: float
    baseline_scale: float | None = None

    def case(self, cand: CandidateRun, ref: ReferenceRun) -> CorrectnessCase:
        label = f"{self.name}/{cand.case.name}"
        if not all_finite(ref.expected):
            if cand.case.distribution == "task":
                raise TaskError(f"the reference produces NaN or inf on the task's own inputs "
                                f"({self.config.describe()}); fix reference.py or its inputs before evaluating "
                                "kernels against it")
            return CorrectnessCase(label, "skipped", note="the reference is not finite on these inputs")
        if cand.error is not None and cand.error.kind == INTERPRETER_LIMIT:
            return CorrectnessCase(label, "skipped", note=cand.error.detail)
        if cand.error is not None:
            raise CandidateFailed(cand.error)
        assert cand.outputs is not None
        scale = output_scale(ref.expected)
        self.baseline_scale = self.baseline_scale or scale
        atol = scaled_atol(self.atol, scale, self.baseline_scale)
        comparison, note = judged(cand.outputs, ref.expected, atol, self.rtol, ref.float64,
                                  ref.perturbed or (lambda: None))
        if not comparison.ok:
            assert comparison.error is not None
            err = comparison.error
            raise CandidateFailed(EvalError(err.kind, f"{label} (inputs: {self.config.describe()}): {err.detail}"))
        if cand.again is not None and not bitwise_equal(cand.outputs, cand.again):
            raise CandidateFailed(EvalError("nondeterministic", f"{label}: two runs on the same inputs differ"))
        if atol != self.atol:
            note = "; ".join(filter(None, [f"atol scaled to {atol:.3g} with the output", note]))
        return CorrectnessCase(label, "passed", comparison.max_abs_err, comparison.max_rel_err, note)


def check_configuration(
    *, name: str, config: Configuration, reference: Callable[..., Any], candidate: Callable[..., Any],
    atol: float, rtol: float, interpret: bool, candidate_path: str, cases: tuple[Case, ...] = EVALUATOR_CASES,
) -> list[CorrectnessCase]:
    """Check one configuration in this process; raise CandidateFailed at the first failing case."""
    judge = Judge(name, config, atol, rtol)
    results: list[CorrectnessCase] = []
    twice = True
    for case in cases:
        ref = run_reference_case(config=config, reference=reference, case=case)
        if ref is None:
            continue
        if not all_finite(ref.expected):
            results.append(judge.case(CandidateRun(case), ref))
            continue
        cand = run_candidate_case(label=f"{name}/{case.name}", config=config, candidate=candidate, case=case,
                                  interpret=interpret, candidate_path=candidate_path, twice=twice)
        assert cand is not None
        twice = False
        results.append(judge.case(cand, ref))
    return results
