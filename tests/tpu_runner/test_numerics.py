"""The reference run as a TPU computes it and in float64, on programs with calls inside (jax.nn.relu is a
custom_jvp call): each equation rewritten, the rest bound as jax itself binds it."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from tpu_runner.checking import OutputSet, as_on_tpu, case_truth, judged, widened, widened_program
from tpu_runner.reports import MEMORY_LIMIT_ENV
from tpu_runner.sandbox import rss_mib
from tpu_runner.tasks import EVALUATOR_CASES, ArgSpec, Configuration


def _dense_relu(x: jax.Array, w: jax.Array, precision: lax.Precision | None = None) -> jax.Array:
    return jax.nn.relu(jnp.dot(x, w, precision=precision)) + jax.nn.softplus(x[:, :1])


def _inputs() -> list[np.ndarray]:
    kx, kw = jax.random.split(jax.random.PRNGKey(0))
    return [np.asarray(jax.random.normal(kx, (64, 96), jnp.float32)),
            np.asarray(jax.random.normal(kw, (96, 32), jnp.float32))]


def test_a_default_precision_f32_dot_before_a_custom_jvp_call_gets_bf16_operands() -> None:
    x, w = _inputs()
    got = np.asarray(as_on_tpu(_dense_relu, ())(x, w))
    rounded = [np.asarray(jnp.asarray(a).astype(jnp.bfloat16).astype(jnp.float32)) for a in (x, w)]
    want = np.maximum(rounded[0].astype(np.float64) @ rounded[1], 0) + np.log1p(np.exp(x[:, :1]))
    assert got.dtype == np.float32 and got.shape == (64, 32)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    full = np.asarray(_dense_relu(jnp.asarray(x), jnp.asarray(w), lax.Precision.HIGHEST))
    assert np.abs(got - full).max() > 1e-3  # the rounding is there: bf16 operands are not f32 ones


def test_highest_precision_is_left_as_the_reference_wrote_it() -> None:
    x, w = _inputs()
    def fn(a: jax.Array, b: jax.Array) -> jax.Array:
        return _dense_relu(a, b, lax.Precision.HIGHEST)
    np.testing.assert_array_equal(np.asarray(as_on_tpu(fn, ())(x, w)), np.asarray(jax.jit(fn)(x, w)))


def test_the_float64_truth_runs_through_a_custom_jvp_call() -> None:
    x, w = _inputs()
    wide = np.asarray(widened(_dense_relu, (), [x, w]))
    assert wide.dtype == np.float64
    want = np.maximum(x.astype(np.float64) @ w.astype(np.float64), 0) + np.log1p(np.exp(x[:, :1].astype(np.float64)))
    np.testing.assert_allclose(wide, want, rtol=1e-12, atol=1e-12)


def _retention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """15p's shape of program: [b, h, n, n] f32 scores, decayed and normalised per row, then times v."""
    s = jnp.einsum("bhnd,bhmd->bhnm", q, k, preferred_element_type=jnp.float32)
    s = s * jnp.tril(jnp.ones(s.shape[-2:], jnp.float32))
    s = s / jnp.maximum(jnp.sum(jnp.abs(s), axis=-1, keepdims=True), 1.0)
    return jnp.einsum("bhnm,bhmd->bhnd", s.astype(v.dtype), v)


def test_a_widened_program_needs_its_largest_value_several_times_over() -> None:
    """XLA's count of a program did not hold on a TPU host (JAX 0.10.2): 15p's float32 truth, counted 2 GiB, took
    10 GiB, its 4 GiB of scores alive in several values at once, and the reference's child was stopped at the
    memory limit. The need is sized from the program's largest value too (compiled only: nothing runs here)."""
    qkv = [np.zeros((4, 16, 4096, 256), jnp.bfloat16) for _ in range(3)]
    scores = 4 * 16 * 4096 * 4096
    _, narrow = widened_program(_retention, (), qkv, np.float32)
    _, wide = widened_program(_retention, (), qkv, np.float64)
    assert narrow >= 3 * scores * 4 and wide >= 3 * scores * 8


def _scores(x: jax.Array) -> jax.Array:
    """A reference whose widened program needs much memory: its [n, n] output."""
    return jnp.tanh(x @ x.T)


def test_the_truth_narrows_to_float32_where_float64_would_pass_the_memory_limit(monkeypatch) -> None:
    """The truth is sized before it runs: XLA's own count of what the widened program needs, against what is left
    under the child's memory limit. Where float64 would not fit, float32 (still far finer than the kernels' bf16)
    with a note that says so; where neither would, no truth (a note why, which the mismatch then carries) rather
    than a child killed for memory."""
    x = np.asarray(jax.random.normal(jax.random.PRNGKey(3), (2048, 64), jnp.float32))
    _, wide_need = widened_program(_scores, (), [x], np.float64)
    _, narrow_need = widened_program(_scores, (), [x], np.float32)
    assert wide_need > narrow_need >= 3 * 2048 * 2048 * 4  # its [n, n] scores, three times over
    config = Configuration(dynamic=(ArgSpec(x.shape, "float32"),), static=())
    case = EVALUATOR_CASES[1]  # drawn inputs (`host` gives them)

    def truth_with(room: int) -> OutputSet | None:
        limit_mib = (room / 2**20 + rss_mib(os.getpid())) / 0.9  # `room` bytes left under the limit
        monkeypatch.setenv(MEMORY_LIMIT_ENV, str(int(limit_mib)))
        return case_truth(config=config, reference=_scores, case=case, host=[x])

    exact = np.tanh(x.astype(np.float64) @ x.T.astype(np.float64))
    full = truth_with(wide_need * 2)
    assert full is not None and full.note == ""
    np.testing.assert_allclose(full.leaves[0], exact, rtol=1e-12)
    narrow = truth_with((wide_need + narrow_need) // 2)
    assert narrow is not None and narrow.note.startswith("its float32 truth: float64 would need")
    np.testing.assert_allclose(narrow.leaves[0], exact, rtol=1e-5, atol=1e-5)  # f32 rounding of sums of 64 terms
    neither = truth_with(narrow_need // 2)
    assert neither is not None and neither.leaves == () and "float32 would not fit either" in neither.note
    # A difference judged without it says why (not a bare mismatch).
    off = OutputSet("tree", (exact.astype(np.float32) + 1.0,))
    comparison, _ = judged(off, OutputSet("tree", (exact.astype(np.float32),)), 1e-3, 1e-3, lambda: neither,
                           lambda: None)
    assert not comparison.ok and comparison.error is not None
    assert comparison.error.detail.endswith(f"({neither.note})")
    # Past the truth, a difference the task's sensitivity would judge says why that was not measured either.
    near = OutputSet("tree", (exact.astype(np.float32) + 0.01,))
    comparison, _ = judged(near, OutputSet("tree", (exact.astype(np.float32),)), 1e-3, 1e-3, lambda: full,
                           lambda: OutputSet("", (), "its float64 run on this host's CPU stopped: out of time"))
    assert not comparison.ok and comparison.error is not None
    assert comparison.error.detail.endswith("(the task's sensitivity to its inputs' rounding was not measured: "
                                            "its float64 run on this host's CPU stopped: out of time)")


def _head_scores(q: jax.Array) -> jax.Array:
    """Each head's [n, n] scores (the program's largest values), then [n, d] outputs: independent head by head."""
    return jnp.einsum("hnm,hmd->hnd", jnp.tanh(jnp.einsum("hnd,hmd->hnm", q, q)), q)


def test_a_truth_too_large_whole_is_made_slice_by_slice_where_the_reference_allows(monkeypatch) -> None:
    """5p's float64 truth would need ~108 GiB whole; head by head it fits. Made in slices, it is the truth itself."""
    q = np.asarray(jax.random.normal(jax.random.PRNGKey(4), (8, 512, 16), jnp.float32))
    _, narrow_need = widened_program(_head_scores, (), [q], np.float32)
    config = Configuration(dynamic=(ArgSpec(q.shape, "float32"),), static=())
    limit_mib = (narrow_need // 2 / 2**20 + rss_mib(os.getpid())) / 0.9  # not even float32 fits whole
    monkeypatch.setenv(MEMORY_LIMIT_ENV, str(int(limit_mib)))
    sliced = case_truth(config=config, reference=_head_scores, case=EVALUATOR_CASES[1], host=[q])
    assert sliced is not None and sliced.leaves, sliced
    assert sliced.note.startswith("its float64 truth, made in ") and "of 8 along the inputs' axis 0" in sliced.note
    wide = q.astype(np.float64)
    exact = np.einsum("hnm,hmd->hnd", np.tanh(np.einsum("hnd,hmd->hnm", wide, wide)), wide)
    np.testing.assert_allclose(sliced.leaves[0], exact, rtol=1e-10)


def test_the_sensitivity_moves_each_input_by_one_unit_roundoff_a_chunk_at_a_time() -> None:
    """A bf16 input moved by 1 +- 2^-8 is exact in float32 (5p's 1G-element bias, moved whole in float64 with its
    signs, took 25 GB); a float32 one needs float64. The move is the same on every call with the same seed."""
    import tracemalloc

    from tpu_runner.checking.correctness import _perturbed
    from tpu_runner.tasks import DRAW_CHUNK

    rng = np.random.default_rng(1)
    half = rng.standard_normal(3 * DRAW_CHUNK).astype(jnp.bfloat16)
    single = rng.standard_normal(1000).astype(np.float32)
    tracemalloc.start()
    moved_half, moved_single = _perturbed([half, single], 5)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert moved_half.dtype == np.float32 and moved_single.dtype == np.float64
    assert peak < moved_half.nbytes + 24 * DRAW_CHUNK  # the result and one chunk's work, not the whole in float64
    nonzero = half != 0
    ratio = moved_half[nonzero] / half[nonzero].astype(np.float64) - 1
    assert set(np.unique(ratio * 2**8)) == {-1.0, 1.0}
    assert set(np.unique(moved_single / single.astype(np.float64) - 1) * 2**24) == {-1.0, 1.0}
    assert np.array_equal(_perturbed([half], 5)[0], moved_half)
