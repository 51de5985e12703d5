"""The evaluator against a corpus: known-good kernels get `ok`; every trick gets its verdict, stage and kind."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from storage.settings import EvalLimits, Settings
from tests.conftest import CORPUS, TASKS
from tpu_runner.evaluation import EvalRequest, evaluate_many
from tpu_runner.reports import EvalResult

GOOD = ["softmax", "layer_norm", "rms_norm", "fused_elementwise", "cross_entropy", "matmul_bf16", "batched_matmul",
        "causal_attention"]

# Honest kernels in the style other people's pipelines write (tests/corpus/third_party/): kernel file -> task.
THIRD_PARTY = {"softmax_generated": "softmax"}

# kernel file -> (task, verdict, stage, error kind)
BAD: dict[str, tuple[str, str, str, str]] = {
    "syntax_error": ("softmax", "rejected", "static", "syntax_error"),
    "wrong_signature": ("softmax", "rejected", "static", "wrong_signature"),
    "file_access": ("softmax", "rejected", "static", "forbidden_import"),
    "network_access": ("softmax", "rejected", "static", "forbidden_import"),
    "process_spawn": ("softmax", "rejected", "static", "forbidden_import"),
    "hidden_thread": ("softmax", "rejected", "static", "forbidden_import"),
    "dynamic_code": ("softmax", "rejected", "static", "forbidden_call"),
    "timer_patch": ("softmax", "rejected", "static", "monkeypatch"),
    "not_a_kernel": ("softmax", "rejected", "static", "no_pallas_call"),
    "swallow_errors": ("softmax", "rejected", "static", "broad_except"),
    "cache_on_identity": ("softmax", "rejected", "static", "global_state"),
    "host_callback": ("softmax", "rejected", "static", "forbidden_attribute"),
    "dead_pallas_call": ("softmax", "rejected", "static", "no_pallas_call"),
    "input_alias": ("softmax", "rejected", "static", "input_output_alias"),
    "misaligned_block": ("softmax", "lowering_error", "lower", "block_shape"),
    "unsupported_primitive": ("softmax", "lowering_error", "lower", "unsupported_primitive"),
    "vmem_overflow": ("softmax", "compile_error", "compile", "vmem_oom"),
    "bf16_math_softmax": ("softmax", "incorrect", "correctness", "mismatch"),
    "partial_output_at_scale": ("softmax", "incorrect", "correctness", "partial_output"),
    "precomputed_answer": ("softmax", "incorrect", "correctness", "mismatch"),
    "constant_output": ("softmax", "incorrect", "correctness", "mismatch"),
    "naive_softmax": ("softmax", "incorrect", "correctness", "nan"),
    "bf16_output": ("softmax", "incorrect", "correctness", "dtype_mismatch"),
    "out_of_bounds": ("softmax", "incorrect", "correctness", "out_of_bounds"),
    "uninitialized_accumulator": ("matmul_bf16", "incorrect", "correctness", "nan"),
    "hang": ("softmax", "timeout", "lower", "timeout"),
    "memory_bomb": ("softmax", "crashed", "lower", "memory_limit"),
    "reads_runner_home": ("softmax", "lowering_error", "lower", "import_error"),  # Landlock refuses the read
}


def _by_name(requests: list[EvalRequest], results: list[EvalResult | Exception]) -> dict[str, EvalResult]:
    out = {}
    for req, res in zip(requests, results, strict=True):
        kernel, task = req.kernel, req.task  # files, in these requests
        assert isinstance(res, EvalResult), f"{kernel}: {res!r}"
        out[kernel.stem if kernel.parent.name != "solutions" else task.name] = res
    return out


@pytest.fixture(scope="module")
def good_results(settings: Settings) -> dict[str, EvalResult]:
    requests = [EvalRequest(TASKS / t, TASKS / t / "solutions" / "pallas.py", "v6e") for t in GOOD]
    requests += [EvalRequest(TASKS / t, CORPUS / "third_party" / f"{name}.py", "v6e")
                 for name, t in THIRD_PARTY.items()]
    return _by_name(requests, evaluate_many(requests, settings, workers=2))


# Stopped by the sandbox's limits, set tight here so the test does not wait long.
RUNAWAY = ("hang", "memory_bomb")


@pytest.fixture(scope="module")
def bad_results(verdict_settings: Settings) -> dict[str, EvalResult]:
    settings = verdict_settings  # each stops before it is estimated: no static profile to wait for
    def requests(names: list[str]) -> list[EvalRequest]:
        return [EvalRequest(TASKS / BAD[n][0], CORPUS / "bad" / f"{n}.py", "v6e") for n in names]

    honest_limits = dataclasses.replace(settings, limits=EvalLimits(wall_seconds=240, memory_mib=6144))
    # The hang is stopped by a short clock; the memory bomb by the memory limit, with time to get there on a
    # loaded machine (it allocates at import, after the child has loaded the task).
    short_clock = dataclasses.replace(settings, limits=EvalLimits(wall_seconds=20, memory_mib=3072))
    small_memory = dataclasses.replace(settings, limits=EvalLimits(wall_seconds=120, memory_mib=3072))
    tricks = requests([n for n in BAD if n not in RUNAWAY])
    hang, bomb = requests(["hang"]), requests(["memory_bomb"])
    return {**_by_name(tricks, evaluate_many(tricks, honest_limits, workers=2)),
            **_by_name(hang, evaluate_many(hang, short_clock, workers=1)),
            **_by_name(bomb, evaluate_many(bomb, small_memory, workers=1))}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(THIRD_PARTY))
def test_third_party_kernels_are_judged_on_their_merits(good_results: dict[str, EvalResult], name: str) -> None:
    """Reflection on their own objects, object.__setattr__ in a frozen dataclass, JAX's internals, a helper nothing
    calls: none of it is harm, and the kernel is ok."""
    result = good_results[name]
    assert result.verdict == "ok", result.message


@pytest.mark.slow
def test_what_the_static_check_lets_through_the_sandbox_stops(bad_results: dict[str, EvalResult]) -> None:
    """JAX's own path helper reads files; the candidate's reads are confined (Landlock), so listing the runner's
    home - the database, the reference's outputs - fails in the candidate's process."""
    error = bad_results["reads_runner_home"].error
    assert error is not None and "PermissionError" in error.detail, error


@pytest.mark.slow
@pytest.mark.parametrize("task", GOOD)
def test_known_good_kernel_is_ok(good_results: dict[str, EvalResult], task: str) -> None:
    result = good_results[task]
    assert result.verdict == "ok", result.message
    assert result.stage == "done"
    assert result.correctness is not None and result.correctness.status == "passed"
    assert sum(c.status == "passed" for c in result.correctness.cases) >= 3
    perf = result.performance
    assert perf is not None and perf.method == "estimated" and perf.unit == "ms"
    assert perf.candidate > 0 and perf.reference > 0
    assert perf.speedup == pytest.approx(perf.reference / perf.candidate)
    assert 0 < (perf.roofline_fraction or 0) <= 1.0  # nothing beats physics
    assert not [f for f in perf.flags if f.startswith("faster_than_physics")]
    assert Path(result.artifacts["profile_chart"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "bound" in result.profile["summary"] and "grid" in result.profile["summary"]
    saved = json.loads(Path(result.artifacts["result"]).read_text())
    assert saved["verdict"] == "ok" and saved["task"] == task


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BAD))
def test_bad_kernel_gets_its_verdict(bad_results: dict[str, EvalResult], name: str) -> None:
    _, verdict, stage, kind = BAD[name]
    result = bad_results[name]
    assert (result.verdict, result.stage, result.error and result.error.kind) == (verdict, stage, kind), result.message
    assert result.performance is None
    assert result.message.startswith(verdict)


@pytest.mark.slow
def test_errors_point_at_the_candidate_line(bad_results: dict[str, EvalResult]) -> None:
    assert bad_results["syntax_error"].error.line == 3
    assert bad_results["file_access"].error.line == 1
    assert bad_results["swallow_errors"].error.line == 8
    assert "sort" in bad_results["unsupported_primitive"].error.detail
    assert bad_results["unsupported_primitive"].error.line == 23  # the kernel that uses it
