"""Evaluator-owned inputs: shapes and dtypes come from the task, values from seeds the candidate never sees."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from tpu_runner.tasks import ArgSpec, Configuration


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
LARGE_SCALE = 64.0


# How the floating values are drawn: part of every cached reference output's key (reference_data.output_key), so
# outputs cached for other draws are never compared with these.
DRAW = "chunked-f32-v1"
_CHUNK = 1 << 20  # elements per independently seeded block: the values do not depend on how many threads draw
_drawers: ThreadPoolExecutor | None = None
_drawers_guard = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _drawers
    with _drawers_guard:
        if _drawers is None:
            _drawers = ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1), thread_name_prefix="draw")
        return _drawers


def _floats(spec: ArgSpec, distribution: str, seed: tuple[int, ...]) -> np.ndarray:
    """Floating values in blocks of `_CHUNK`, each from its own stream, drawn in float32 by a pool of threads
    (numpy releases the GIL while it fills): production inputs of 100M elements take a fraction of a second, not
    seconds, which on a TPU host is time the chip would wait."""
    dtype = np.dtype(spec.dtype)
    out = np.empty(spec.shape, dtype=dtype)
    flat = out.reshape(-1)

    def block(start: int) -> None:
        rng = np.random.default_rng(np.random.SeedSequence([*seed, start // _CHUNK]))
        n = min(_CHUNK, flat.size - start)
        if distribution == "uniform":
            values = rng.random(n, dtype=np.float32) * np.float32(2.0) - np.float32(1.0)
        else:
            values = rng.standard_normal(n, dtype=np.float32)
            if distribution == "large":
                values *= np.float32(LARGE_SCALE)
        if spec.nonnegative:  # the task's values are all >= 0 (a variance): a negative draw is no test of the kernel
            np.abs(values, out=values)
        flat[start:start + n] = values.astype(dtype)

    starts = range(0, flat.size, _CHUNK)
    if len(starts) <= 1:
        for start in starts:
            block(start)
    else:
        for done in [_pool().submit(block, start) for start in starts]:
            done.result()
    return out


def _draw(spec: ArgSpec, distribution: str, rng: np.random.Generator, seed: tuple[int, ...]) -> np.ndarray:
    dtype = np.dtype(spec.dtype)
    if dtype == np.bool_:
        return rng.random(spec.shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        lo, hi = spec.int_range if spec.int_range else (0, min(np.iinfo(dtype).max, 127))
        return rng.integers(lo, hi + 1, size=spec.shape, dtype=np.int64).astype(dtype)
    return _floats(spec, distribution, seed)


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
    rng = np.random.default_rng(case.seed)  # integers and flags, in order; floating values per argument and block
    drawn = [_draw(spec, case.distribution, rng, (case.seed, i)) for i, spec in enumerate(config.dynamic)]
    if config.values is not None:
        drawn = [np.array(v) if _integer(spec) else x for spec, v, x in zip(config.dynamic, config.values, drawn,
                                                                           strict=True)]
    return drawn
