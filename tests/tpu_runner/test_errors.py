"""Errors that blame the right party and say something: an exception without a message says its type and where it
was raised; memory the checking machine ran out of is not the kernel's fault."""

from __future__ import annotations

from tpu_runner.evaluation import checker_ran_out, task_beyond_limits
from tpu_runner.reference import ReferenceStopped
from tpu_runner.reports import EvalError, from_exception


def _allocate() -> None:
    raise MemoryError


def test_an_exception_without_a_message_says_its_type_and_where_it_was_raised() -> None:
    try:
        _allocate()
    except MemoryError as exc:
        error = from_exception(exc, stage="lower", candidate_path="/nowhere/kernel.py")
    assert error.kind == "memory_error"
    assert error.detail.startswith("MemoryError (no message) raised at ") and __file__ in error.detail
    assert error.detail.endswith("(_allocate)")


def test_running_out_of_memory_off_the_chip_is_the_checkers_limit_and_on_it_the_kernels() -> None:
    oom = EvalError("hbm_oom", "RESOURCE_EXHAUSTED: Out of memory allocating 25770067152 bytes", None, "correctness")
    assert checker_ran_out(oom, "cpu") and not checker_ran_out(oom, "tpu")
    assert not checker_ran_out(EvalError("mismatch", "differs", None, "correctness"), "cpu")


def test_a_candidate_stopped_where_the_reference_stops_too_is_told_as_the_tasks_size_with_both_reasons() -> None:
    candidate = EvalError("memory_limit", "the evaluation used more than 24576 MiB of memory in the correctness stage "
                          "and was stopped", None, "correctness")
    reference = ReferenceStopped("the reference of task big used more than 24576 MiB of memory (reference outputs "
                                 "big-0a1b); raise KERNELBOT_EVAL_MEMORY_MIB to evaluate it", "memory_limit")

    said = task_beyond_limits(candidate, reference)

    assert said.kind == "memory_limit" and said.stage == "correctness"
    assert said.detail.startswith(candidate.detail) and str(reference) in said.detail
    assert "says nothing of the kernel" in said.detail and "KERNELBOT_EVAL_MEMORY_MIB" in said.detail
