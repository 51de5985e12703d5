"""The measured-performance path, run on the CPU backend with pure-JAX candidates."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from tpu_runner.checking import Comparison, compare_outputs
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


def _off_by(delta: float):
    def candidate(x):
        return _reference(x) + delta

    return candidate


def test_a_difference_while_timing_is_judged_once_per_input_set(tmp_path: Path) -> None:
    asked: list[int] = []

    def forgiving(k, cand, ref):  # as the float64 truth would say of an honest rounding difference
        asked.append(k)
        return Comparison(True, 0.5, 0.0), "within the task's sensitivity"

    pair = measure_pair(reference=_reference, candidate=_off_by(0.5), input_sets=_inputs(2, (64, 64)), static=(),
                        trace_dir=tmp_path, atol=1e-4, rtol=1e-4, warmup=1, iterations=6, judge=forgiving)
    assert pair.mismatches == []
    assert sorted(asked) == [0, 1]  # iterations 2-5 give the same outputs on the same two input sets
    assert len(pair.notes) == 2 and "within the task's sensitivity" in pair.notes[0]


def test_a_judge_that_refuses_keeps_the_mismatch_of_every_iteration(tmp_path: Path) -> None:
    def strict(k, cand, ref):
        return compare_outputs(cand, ref, 1e-4, 1e-4), ""

    pair = measure_pair(reference=_reference, candidate=_off_by(0.5), input_sets=_inputs(2, (64, 64)), static=(),
                        trace_dir=tmp_path, atol=1e-4, rtol=1e-4, warmup=1, iterations=4, judge=strict)
    assert [m.split(":")[0] for m in pair.mismatches] == [f"iteration {i}" for i in range(4)]
    assert pair.notes == []


def test_the_candidates_child_keeps_differences_in_values_for_the_evaluator(tmp_path: Path) -> None:
    from tpu_runner.candidate.child import keeping_judge
    from tpu_runner.checking import load_outputs
    from tpu_runner.tasks import TIMING_CASES

    files: list[tuple[str, str]] = []
    judge = keeping_judge(tmp_path, 1e-4, 1e-4, files)
    pair = measure_pair(reference=_reference, candidate=_off_by(0.5), input_sets=_inputs(2, (64, 64)), static=(),
                        trace_dir=tmp_path / "trace", atol=1e-4, rtol=1e-4, warmup=1, iterations=4, judge=judge)
    assert pair.mismatches == [] and pair.kept == [(0, [0, 2]), (1, [1, 3])]
    assert files == [(f"{c.name}.candidate.npz", f"{c.name}.reference.npz") for c in TIMING_CASES[:2]]
    cand, ref = (load_outputs(tmp_path / name).leaves[0] for name in files[0])
    assert np.allclose(cand - ref, 0.5)
    # A second pair on a set already kept, and a difference that is not in values alone, are judged here.
    assert judge(0, jnp.ones(4), jnp.zeros(4)) is not None
    comparison, _ = judge(2, jnp.full(4, jnp.nan), jnp.zeros(4))
    assert not comparison.ok and comparison.error is not None and comparison.error.kind != "mismatch"
    assert len(files) == 2


def test_timing_inputs_are_sized_to_the_chip_and_the_host() -> None:
    from tpu_runner.candidate.child import TIMING_CASES, timing_input_sets, timing_sets_plan
    from tpu_runner.tasks import ArgSpec, Configuration

    gib = 2**30
    chip = int(15.7 * gib)  # a v5e's HBM
    # 15p: three inputs of 128 MiB; all three sets, drawn while the candidate is checked.
    assert timing_sets_plan(3 * gib // 8, chip, 8 * gib) == (len(TIMING_CASES), True)
    # 5p: 2.8 GB a set. Three (and a copy per call) beside a reference that holds 8.6 GB would not fit the chip;
    # one does. And 2.8 GB is more than a quarter of 6 GiB left on the host: drawn after the checks.
    assert timing_sets_plan(int(2.8e9), chip, 6 * gib) == (1, False)
    assert timing_sets_plan(int(2.8e9), chip, 20 * gib) == (1, True)
    # Without a chip (or without a limit) nothing changes.
    assert timing_sets_plan(int(2.8e9), None, None) == (len(TIMING_CASES), True)
    config = Configuration(dynamic=(ArgSpec((4, 8), "float32"), ArgSpec((16,), "bfloat16")), static=(2,))
    assert sum(a.nbytes for a in config.dynamic) == 4 * 8 * 4 + 16 * 2  # what the plan is given
    assert len(timing_input_sets(config, 1)) == 1 and len(timing_input_sets(config)) == len(TIMING_CASES)


def test_the_candidates_child_draws_its_timing_inputs_as_planned(monkeypatch) -> None:
    import tpu_runner.candidate.child as child
    from tpu_runner.reports import CandidateReport
    from tpu_runner.tasks import ArgSpec, Configuration

    config = Configuration(dynamic=(ArgSpec((64, 64), "float32"),), static=())
    stages = object.__new__(child.CandidateStages)  # only what drawing the timing inputs uses
    stages.report, stages.on_device = CandidateReport(stage="performance"), False
    drawn = stages.timing_inputs(config, ahead=True)
    assert drawn is not None and len(drawn.result()) == len(child.TIMING_CASES) and stages.report.notes == []
    monkeypatch.setattr(child, "timing_sets_plan", lambda *_: (1, False))  # too large to draw beside the checks
    assert stages.timing_inputs(config, ahead=True) is None
    later = stages.timing_inputs(config, ahead=False)
    assert later is not None and len(later.result()) == 1
    assert stages.report.notes == ["timed on 1 input set instead of 3: 3 would not fit the chip's memory beside the "
                                   "programs"]
