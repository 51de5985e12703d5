"""Evaluator-owned inputs: shapes and dtypes come from the task, values from seeds the candidate never sees."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass

import numpy as np

from tpu_runner.tasks.task import ArgSpec, Configuration


@dataclass(frozen=True)
class Case:
    name: str
    distribution: str  # "task" (the task's own values), "normal", "uniform", "large"
    seed: int


# One case per distribution; "large" is the adversarial one (numerically unstable kernels overflow on it).
EVALUATOR_CASES: tuple[Case, ...] = (
    Case("task", "task", 0),
    Case("normal", "normal", 7919),
    Case("uniform", "uniform", 104729),
    Case("large", "large", 1299709),
)
# The timing's input sets, apart from the correctness cases: outputs that differ on them are judged against a
# float64 run of the reference on the same draw (reference.store), so the reference's child draws them too.
TIMING_CASES: tuple[Case, ...] = tuple(Case(f"timing{i}", "normal", 7 + i) for i in range(3))
CASES_BY_NAME: dict[str, Case] = {c.name: c for c in (*EVALUATOR_CASES, *TIMING_CASES)}
LARGE_SCALE = 64.0
# Which draw made a case's values: part of the key of the reference's outputs kept for them (reference.store), so
# outputs kept for another draw are never compared against these inputs.
DRAW = "float32-v1"


# Elements drawn at a time: the float32 draw of one chunk is all that exists beside the result, whose dtype it is
# written in (a 2 GiB bf16 bias drawn whole took 4 GiB more in float32). numpy's generators give the same stream
# chunk by chunk as in one call, so the values do not depend on it.
DRAW_CHUNK = 1 << 22


def _draw(spec: ArgSpec, distribution: str, rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(spec.dtype)
    if dtype == np.bool_:
        return rng.random(spec.shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        lo, hi = spec.int_range if spec.int_range else (0, min(np.iinfo(dtype).max, 127))
        return rng.integers(lo, hi + 1, size=spec.shape, dtype=np.int64).astype(dtype)
    out = np.empty(spec.shape, dtype)
    flat = out.reshape(-1)
    for start in range(0, flat.size, DRAW_CHUNK):
        flat[start:start + DRAW_CHUNK] = _floats(min(DRAW_CHUNK, flat.size - start), distribution, spec, rng)
    return out


def _floats(n: int, distribution: str, spec: ArgSpec, rng: np.random.Generator) -> np.ndarray:
    """`n` values of the distribution, drawn in float32 and scaled in place (float64 only for a float64 input: a
    float64 draw and its copies took ~7x a bf16 input's size)."""
    wide = np.float64 if np.dtype(spec.dtype) == np.float64 else np.float32
    if distribution == "uniform":
        values = rng.random(n, dtype=wide)
        values *= 2.0
        values -= 1.0
    else:
        values = rng.standard_normal(n, dtype=wide)
        if distribution == "large":
            values *= LARGE_SCALE
    if spec.nonnegative:  # the task's values are all >= 0 (a variance): a negative draw is no test of the kernel
        np.abs(values, out=values)
    return values


def _integer(spec: ArgSpec) -> bool:
    dtype = np.dtype(spec.dtype)
    return bool(np.issubdtype(dtype, np.integer) or dtype == np.bool_)


def case_inputs(config: Configuration, case: Case) -> list[np.ndarray] | None:
    """Host arrays for one case, or None when the case does not apply (no task values to reuse).

    Where the configuration carries the task's own values, its integer inputs are kept in every case: they
    are indices, lengths or group sizes whose meaning a random draw would break (group sizes must add up)."""
    if case.distribution == "task":
        if config.values is None:
            return None
        return [np.array(v) for v in config.values]
    rng = np.random.default_rng(case.seed)
    drawn = [_draw(spec, case.distribution, rng) for spec in config.dynamic]
    if config.values is not None:
        drawn = [np.array(v) if _integer(spec) else x for spec, v, x in zip(config.dynamic, config.values, drawn,
                                                                           strict=True)]
    return drawn


def drawn_ahead(config: Configuration, cases: Sequence[Case], helper: Executor
                ) -> Iterator[tuple[Case, Future[list[np.ndarray] | None]]]:
    """Each case with its inputs as `helper` draws them (`case_inputs`), the next case's asked for before this one
    is handed out: while the caller runs a case (on a chip), the next case's inputs are being drawn."""
    upcoming = helper.submit(case_inputs, config, cases[0]) if cases else None
    for k, case in enumerate(cases):
        assert upcoming is not None
        current = upcoming
        upcoming = helper.submit(case_inputs, config, cases[k + 1]) if k + 1 < len(cases) else None
        yield case, current
