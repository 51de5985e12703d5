"""compare_outputs on hand-built outputs; check_configuration on tiny pure-JAX functions (CPU, no Pallas)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpu_runner.checking import CandidateFailed, Comparison, check_configuration, compare_outputs
from tpu_runner.checking.correctness import _fresh
from tpu_runner.tasks import EVALUATOR_CASES, ArgSpec, Configuration, case_inputs


def _f32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


# --- compare_outputs ----------------------------------------------------------------------------------------


def test_equal_arrays_are_ok_with_zero_error():
    x = _f32([[1.0, -2.0], [3.5, 0.0]])
    assert compare_outputs(x, x.copy(), atol=0.0, rtol=0.0) == Comparison(True, 0.0, 0.0)


def test_within_tolerance_is_ok_and_reports_the_errors():
    ref = _f32([1.0, 2.0, 4.0])
    cand = _f32([1.0, 2.001, 4.0])
    result = compare_outputs(cand, ref, atol=1e-3, rtol=1e-3)
    assert result.ok, result.error
    assert result.error is None
    assert result.max_abs_err == pytest.approx(1e-3, rel=1e-3)
    assert result.max_rel_err == pytest.approx(5e-4, rel=1e-3)


def test_rtol_scales_with_the_reference():
    ref = _f32([1000.0])
    assert compare_outputs(_f32([1000.5]), ref, atol=0.0, rtol=1e-3).ok
    assert not compare_outputs(_f32([1001.5]), ref, atol=0.0, rtol=1e-3).ok


def test_beyond_tolerance_is_a_mismatch_naming_the_worst_index():
    ref = np.zeros((3, 4), np.float32)
    cand = ref.copy()
    cand[1, 2] = 0.5
    cand[2, 3] = 0.01
    result = compare_outputs(cand, ref, atol=1e-3, rtol=1e-3)
    assert not result.ok
    assert result.error is not None and result.error.kind == "mismatch"
    assert "(1, 2)" in result.error.detail
    assert "2 of 12 elements" in result.error.detail
    assert result.max_abs_err == pytest.approx(0.5)


def test_mismatch_in_a_later_leaf_names_that_leaf():
    ref = (_f32([1.0]), _f32([1.0, 2.0]))
    cand = (_f32([1.0]), _f32([1.0, 3.0]))
    result = compare_outputs(cand, ref, atol=1e-3, rtol=0.0)
    assert result.error is not None
    assert result.error.kind == "mismatch"
    assert result.error.detail.startswith("output[1] ")
    assert "(1,)" in result.error.detail


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_candidate_where_the_reference_is_finite(bad):
    ref = _f32([[1.0, 2.0], [3.0, 4.0]])
    cand = ref.copy()
    cand[1, 0] = bad
    result = compare_outputs(cand, ref, atol=1.0, rtol=1.0)
    assert not result.ok
    assert result.error is not None and result.error.kind == "nan"
    assert "(1, 0)" in result.error.detail
    assert "1 non-finite" in result.error.detail


def test_finite_candidate_where_the_reference_is_not_is_a_mismatch():
    ref = _f32([1.0, np.nan])
    result = compare_outputs(_f32([1.0, 0.0]), ref, atol=1.0, rtol=1.0)
    assert result.error is not None
    assert result.error.kind == "mismatch"
    assert "finite where the reference is not" in result.error.detail


def test_nan_where_the_reference_is_nan_is_ok():
    ref = _f32([1.0, np.nan])
    assert compare_outputs(ref.copy(), ref, atol=0.0, rtol=0.0).ok


def test_shape_mismatch():
    result = compare_outputs(np.zeros((4, 3), np.float32), np.zeros((3, 4), np.float32), atol=1.0, rtol=1.0)
    assert not result.ok
    assert result.error is not None and result.error.kind == "shape_mismatch"
    assert "(4, 3)" in result.error.detail and "(3, 4)" in result.error.detail


def test_bf16_candidate_against_f32_reference_is_a_dtype_mismatch():
    ref = jnp.ones((2, 2), jnp.float32)
    result = compare_outputs(ref.astype(jnp.bfloat16), ref, atol=1.0, rtol=1.0)
    assert not result.ok
    assert result.error is not None and result.error.kind == "dtype_mismatch"
    assert "bfloat16" in result.error.detail and "float32" in result.error.detail


def test_bf16_outputs_are_compared_in_wide_precision():
    ref = jnp.asarray([1.0, 2.0], jnp.bfloat16)
    cand = jnp.asarray([1.0, 2.015625], jnp.bfloat16)  # one bf16 ulp above 2
    assert compare_outputs(cand, ref, atol=2e-2, rtol=0.0).ok
    assert compare_outputs(cand, ref, atol=2e-2, rtol=0.0).max_abs_err == 0.015625
    result = compare_outputs(cand, ref, atol=1e-2, rtol=0.0)
    assert result.error is not None and result.error.kind == "mismatch"


def test_tuple_against_single_array_is_output_structure():
    x = _f32([1.0, 2.0])
    result = compare_outputs((x, x), x, atol=1.0, rtol=1.0)
    assert not result.ok
    assert result.error is not None and result.error.kind == "output_structure"
    assert compare_outputs(x, (x,), atol=1.0, rtol=1.0).error.kind == "output_structure"


def test_integer_outputs_are_compared_exactly():
    ref = np.array([[1, 2], [3, 4]], np.int32)
    cand = ref.copy()
    cand[0, 1] = 3
    result = compare_outputs(cand, ref, atol=10.0, rtol=10.0)
    assert not result.ok
    assert result.error is not None and result.error.kind == "mismatch"
    assert "(0, 1)" in result.error.detail
    assert compare_outputs(ref.copy(), ref, atol=0.0, rtol=0.0).ok


def test_bool_outputs_are_compared_exactly():
    ref = np.array([True, False])
    assert not compare_outputs(np.array([True, True]), ref, atol=1.0, rtol=1.0).ok


def test_truth_widens_the_tolerance_by_twice_the_reference_error():
    ref = _f32([1.0, 2.0])
    truth = np.array([1.0, 2.05])  # the reference itself is 0.05 off at index 1
    cand = _f32([1.0, 2.09])  # 0.09 from the reference: inside atol + 2 * 0.05
    plain = compare_outputs(cand, ref, atol=1e-3, rtol=0.0)
    assert plain.error is not None and plain.error.kind == "mismatch"
    assert compare_outputs(cand, ref, atol=1e-3, rtol=0.0, truth=truth).ok


def test_truth_does_not_excuse_a_candidate_far_beyond_the_reference_error():
    ref = _f32([1.0, 2.0])
    truth = np.array([1.0, 2.05])
    cand = _f32([1.0, 2.5])  # 0.5 off: more than atol + 2 * 0.05
    result = compare_outputs(cand, ref, atol=1e-3, rtol=0.0, truth=truth)
    assert result.error is not None and result.error.kind == "mismatch"
    assert "(1,)" in result.error.detail


def test_truth_of_the_wrong_structure_is_ignored():
    ref = _f32([1.0, 2.0])
    cand = _f32([1.0, 2.09])
    truth = (np.array([1.0, 2.05]), np.array([0.0]))  # two leaves for one output
    assert not compare_outputs(cand, ref, atol=1e-3, rtol=0.0, truth=truth).ok


# --- check_configuration ------------------------------------------------------------------------------------

CONFIG = Configuration(dynamic=(ArgSpec((8, 16), "float32"),), static=(2.0,))


def _reference(x, scale):
    return jnp.tanh(x) * scale


def _check(candidate, config: Configuration = CONFIG, reference=_reference, atol=1e-5, rtol=1e-5):
    return check_configuration(name="cfg", config=config, reference=reference, candidate=candidate, atol=atol,
                               rtol=rtol, interpret=False, candidate_path="candidate.py")


def test_correct_candidate_passes_every_evaluator_case():
    def candidate(x, scale):
        return scale * (2.0 / (1.0 + jnp.exp(-2.0 * x)) - 1.0)  # tanh written another way

    results = _check(candidate, atol=1e-4, rtol=1e-4)
    assert [r.name for r in results] == ["cfg/normal", "cfg/uniform", "cfg/large"]
    assert all(r.status == "passed" for r in results)
    assert all(r.max_abs_err is not None and r.max_abs_err < 1e-4 for r in results)


def test_task_case_runs_when_the_configuration_carries_values():
    x = np.linspace(-1.0, 1.0, 8 * 16, dtype=np.float32).reshape(8, 16)
    config = Configuration(dynamic=CONFIG.dynamic, static=CONFIG.static, values=(x,))
    results = _check(_reference, config=config)
    assert [r.name for r in results] == ["cfg/task", "cfg/normal", "cfg/uniform", "cfg/large"]
    assert all(r.max_abs_err == 0.0 for r in results)


def test_nondeterministic_candidate_is_caught_on_the_first_case():
    calls = []

    def noise() -> np.ndarray:  # differs on every run, far below atol
        calls.append(1)
        return np.float32(len(calls) * 1e-7)

    def candidate(x, scale):
        jitter = jax.pure_callback(noise, jax.ShapeDtypeStruct((), jnp.float32))
        return _reference(x, scale) + jitter

    with pytest.raises(CandidateFailed) as info:
        _check(candidate)
    assert info.value.error.kind == "nondeterministic"
    assert info.value.error.detail.startswith("cfg/normal: ")
    assert len(calls) == 2


def test_candidate_returning_zeros_fails_with_mismatch():
    with pytest.raises(CandidateFailed) as info:
        _check(lambda x, scale: jnp.zeros_like(x))
    error = info.value.error
    assert error.kind == "mismatch"
    assert error.detail.startswith("cfg/normal (inputs: float32[8,16], 2.0): ")


def test_candidate_replaying_a_memorised_output_fails_on_the_second_distribution():
    normal = next(c for c in EVALUATOR_CASES if c.name == "normal")
    (x_seen,) = case_inputs(CONFIG, normal)
    memorised = np.asarray(_reference(jnp.asarray(x_seen), 2.0))  # the answer for the first inputs it saw

    def candidate(x, scale):
        return jnp.asarray(memorised) + 0.0 * x

    with pytest.raises(CandidateFailed) as info:
        _check(candidate)
    assert info.value.error.kind == "mismatch"
    assert info.value.error.detail.startswith("cfg/uniform ")


def test_lower_precision_output_fails_with_dtype_mismatch():
    def candidate(x, scale):
        return _reference(x, scale).astype(jnp.bfloat16)

    with pytest.raises(CandidateFailed) as info:
        _check(candidate, atol=1.0, rtol=1.0)
    assert info.value.error.kind == "dtype_mismatch"


def test_candidate_that_raises_is_a_runtime_error_with_the_case_label():
    def candidate(x, scale):
        raise ZeroDivisionError("boom")

    with pytest.raises(CandidateFailed) as info:
        _check(candidate)
    assert info.value.error.kind == "runtime_error"
    assert info.value.error.stage == "correctness"
    assert info.value.error.detail.startswith("cfg/normal: ")
    assert "boom" in info.value.error.detail


def test_large_case_scales_atol_with_the_output():
    config = Configuration(dynamic=(ArgSpec((8, 16), "float32"),), static=())

    def reference(x):
        return x * 3.0

    def candidate(x):
        return x * 3.0 + 1e-3  # a constant offset: within atol at unit scale and the scaled atol at x64

    results = check_configuration(name="cfg", config=config, reference=reference, candidate=candidate,
                                  atol=2e-3, rtol=0.0, interpret=False, candidate_path="candidate.py")
    large = results[-1]
    assert large.name == "cfg/large"
    assert large.note.startswith("atol scaled to ")
    assert results[0].note == ""


def test_integer_candidate_off_by_one_fails_despite_tolerance():
    config = Configuration(dynamic=(ArgSpec((16,), "int32", (0, 9)),), static=())

    with pytest.raises(CandidateFailed) as info:
        check_configuration(name="ints", config=config, reference=lambda i: i * 2,
                            candidate=lambda i: i * 2 + 1, atol=10.0, rtol=10.0, interpret=False,
                            candidate_path="candidate.py")
    assert info.value.error.kind == "mismatch"


def test_reference_not_finite_on_a_case_is_skipped():
    config = Configuration(dynamic=(ArgSpec((8, 16), "float32"),), static=())

    def reference(x):
        return jnp.log(x)  # NaN for negative inputs: every evaluator case has some

    results = check_configuration(name="cfg", config=config, reference=reference, candidate=reference,
                                  atol=1e-5, rtol=1e-5, interpret=False, candidate_path="candidate.py")
    assert [r.status for r in results] == ["skipped", "skipped", "skipped"]
    assert jax.numpy.isnan(reference(jnp.asarray(-1.0)))



def test_a_case_goes_to_the_device_without_a_host_copy_and_never_aliases_the_judges_inputs():
    # At production shapes a host copy of every input first was GiBs more at once in the candidate's child.
    import tracemalloc

    host = np.ones((2048, 4096), np.float32)  # 32 MiB
    tracemalloc.start()
    try:
        (on_device,) = _fresh([host], ())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < host.nbytes / 4
    host[0, 0] = 5.0  # the judge's array changes; the candidate's copy does not (and the reverse: no alias)
    assert float(on_device[0, 0]) == 1.0
