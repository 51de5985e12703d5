"""The measured-performance path, run on the CPU backend with pure-JAX candidates."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tpu_runner.timing import measure_pair


def _inputs(n: int, shape: tuple[int, ...]) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(0)
    return [[rng.standard_normal(shape).astype(np.float32)] for _ in range(n)]


def _reference(x):
    return jnp.tanh(x @ x.T) @ x


def test_times_both_from_the_trace_with_median_and_spread(tmp_path: Path) -> None:
    pair = measure_pair(reference=_reference, candidate=lambda x: jnp.tanh(x @ x.T) @ x,
                        input_sets=_inputs(3, (256, 256)), static=(), trace_dir=tmp_path, atol=1e-4, rtol=1e-4,
                        warmup=2, iterations=8)
    for timing in (pair.reference, pair.candidate):
        assert timing.source == "trace:host"
        assert len(timing.samples_ms) == 8 and all(s > 0 for s in timing.samples_ms)
        assert min(timing.samples_ms) <= timing.median_ms <= max(timing.samples_ms)
        assert timing.spread_ms >= 0
    assert pair.mismatches == []
    assert list(tmp_path.glob("**/*.trace.json.gz"))


def test_outputs_produced_while_timing_are_checked(tmp_path: Path) -> None:
    seen: dict[str, np.ndarray] = {}

    def caches_first_answer(x):  # right on the first inputs, stale afterwards
        out = jax.pure_callback(lambda a: seen.setdefault("out", np.asarray(_reference(a))),
                                jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        return out

    pair = measure_pair(reference=_reference, candidate=caches_first_answer, input_sets=_inputs(3, (64, 64)),
                        static=(), trace_dir=tmp_path, atol=1e-4, rtol=1e-4, warmup=1, iterations=6)
    assert pair.mismatches and "mismatch" in pair.mismatches[0]


def test_static_arguments_are_passed_as_static(tmp_path: Path) -> None:
    def ref(x, power):
        return x ** power

    pair = measure_pair(reference=ref, candidate=lambda x, power: x * x if power == 2 else x,
                        input_sets=_inputs(2, (128, 128)), static=(2,), trace_dir=tmp_path, atol=1e-6, rtol=1e-6,
                        warmup=1, iterations=4)
    assert pair.mismatches == []
