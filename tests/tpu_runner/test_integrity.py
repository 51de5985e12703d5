"""The last line against `harness_tamper`: whatever the static check lets through, a watched function of JAX, numpy
or the pipeline replaced (or given other code) while the candidate ran is found after it."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from tpu_runner.sandbox import integrity
from tpu_runner.timing import measure


def test_a_replaced_or_recoded_function_is_named_and_a_restored_one_is_not() -> None:
    import jax.profiler  # noqa: F401 - watched once imported, as in the child

    import tpu_runner.candidate.child  # noqa: F401 - loaded as in the child (it binds measure_pair too): the
    # names found must not depend on which tests ran before in this process

    snapshot = integrity.take_snapshot()
    assert integrity.changes_since(snapshot) == []
    save, asarray, stop_trace = np.save, jnp.asarray, jax.profiler.stop_trace
    original_code = measure.measure_pair.__code__
    try:
        np.save = lambda *a, **k: None  # outputs never written
        jnp.asarray = lambda x, *a, **k: x
        measure.measure_pair.__code__ = (lambda *a, **k: None).__code__  # the timing loop emptied in place
        assert integrity.changes_since(snapshot) == ["jax.numpy.asarray", "numpy.save",
                                                     "tpu_runner.candidate.child.measure_pair",
                                                     "tpu_runner.timing.measure.measure_pair"]
        del jax.profiler.stop_trace  # a removed function counts too
        assert "jax.profiler.stop_trace" in integrity.changes_since(snapshot)
    finally:
        np.save, jnp.asarray, jax.profiler.stop_trace = save, asarray, stop_trace
        measure.measure_pair.__code__ = original_code
    assert integrity.changes_since(snapshot) == []


def test_the_evaluator_reads_only_plain_file_names_from_the_candidates_report(tmp_path) -> None:
    """The report naming the outputs is the candidate's process's word: a path out of its outputs directory is a
    tamper, not a file to read."""
    import pytest

    from tpu_runner.checking import CandidateFailed
    from tpu_runner.evaluation.evaluate import _child_file

    assert _child_file(tmp_path, "timing0.candidate.npz") == tmp_path / "timing0.candidate.npz"
    for name in ("../reference_outputs/x.npz", "/etc/passwd", "sub/x.npz", "..", ""):
        with pytest.raises(CandidateFailed) as refused:
            _child_file(tmp_path, name)
        assert refused.value.error.kind == "harness_tamper"
