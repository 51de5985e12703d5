"""Estimates, chips and rooflines, the profile summary and hints, and error classification: pure functions."""

from __future__ import annotations

import textwrap
from dataclasses import asdict, replace

import pytest

from tpu_runner.analysis import PallasCallTraffic, TrafficReport
from tpu_runner.hardware import CHIPS, UnknownTarget, chip_for_device_kind, get_chip, roofline
from tpu_runner.reports import candidate_line, classify_text, from_exception
from tpu_runner.timing import (
    DEFAULT_SCOPED_VMEM,
    PHYSICS_MARGIN,
    TimeEstimate,
    candidate_hbm_bytes,
    estimate,
    hints,
    kernel_facts,
    performance_flags,
    summarise,
    traffic_flags,
)

MIB = 2**20
V6E = CHIPS["v6e"]


def _call(name: str = "matmul_kernel", *, hbm_bytes: int = 48 * MIB, io_bytes: int = 24 * MIB,
          grid: tuple[int, ...] = (4, 8), vmem_bytes: int = 12 * MIB, claimed_bytes: float | None = None,
          multiplicity: int = 1, exact: bool = True) -> PallasCallTraffic:
    steps = 1
    for g in grid:
        steps *= g
    return PallasCallTraffic(name=name, grid=grid, grid_steps=steps, operands=(), scratch_bytes=0,
                             vmem_bytes=vmem_bytes, hbm_bytes=hbm_bytes, io_bytes=io_bytes,
                             claimed_bytes=claimed_bytes, claimed_flops=None, exact=exact,
                             multiplicity=multiplicity)


# --- hardware -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["v5e", "v6e", "v5p"])
def test_chip_table_entries_are_complete(name):
    chip = get_chip(name)
    assert chip.name == name
    assert chip.peak_flops["bf16"] > 1e14
    assert chip.peak_flops["int8"] == 2 * chip.peak_flops["bf16"]
    assert 5e11 < chip.hbm_bandwidth < 5e12
    assert chip.vmem_bytes in (64 * MIB, 128 * MIB)
    assert chip.hbm_bytes > chip.vmem_bytes
    assert chip_for_device_kind(chip.device_kind) is chip
    assert name in DEFAULT_SCOPED_VMEM and DEFAULT_SCOPED_VMEM[name] < chip.vmem_bytes


def test_published_figures():
    assert (CHIPS["v5e"].peak_flops["bf16"], CHIPS["v5e"].hbm_bandwidth) == (197e12, 819e9)
    assert CHIPS["v5p"].vmem_bytes == 64 * MIB
    assert V6E.vmem_bytes == 128 * MIB


def test_unknown_target_lists_the_choices():
    with pytest.raises(UnknownTarget) as info:
        get_chip("v4")
    assert "'v4'" in str(info.value)
    for name in ("v5e", "v6e", "v5p"):
        assert name in str(info.value)
    assert isinstance(info.value, ValueError)


def test_unknown_device_kind_is_none():
    assert chip_for_device_kind("TPU v4") is None


def test_peak_for_dtype():
    assert V6E.peak_for("int8") == V6E.peak_flops["int8"]
    assert V6E.peak_for("float32") == V6E.peak_flops["bf16"]
    assert V6E.peak_for("bfloat16") == V6E.peak_flops["bf16"]


def test_cycle_rate_by_mode():
    assert V6E.cycle_rate("fast") == V6E.fast_forward_rate
    assert V6E.cycle_rate("exact") == V6E.clock_hz


def test_roofline_memory_bound():
    roof = roofline(V6E, flops=1e9, bytes_moved=1.64e9, dtype_name="float32")
    assert roof.bound == "memory"
    assert roof.memory_seconds == pytest.approx(1e-3)
    assert roof.seconds == roof.memory_seconds
    assert roof.intensity == pytest.approx(1e9 / 1.64e9)


def test_roofline_compute_bound():
    n = 4096
    roof = roofline(V6E, flops=2 * n**3, bytes_moved=3 * n * n * 2, dtype_name="bfloat16")
    assert roof.bound == "compute"
    assert roof.seconds == pytest.approx(2 * n**3 / 918e12)
    assert roof.intensity == pytest.approx(2 * n**3 / (6 * n * n))


def test_roofline_intensity_without_bytes_is_infinite():
    assert roofline(V6E, flops=1.0, bytes_moved=0.0, dtype_name="float32").intensity == float("inf")


# --- estimate -----------------------------------------------------------------------------------------------


def test_estimate_is_the_larger_of_compute_and_memory():
    est = estimate(V6E, cycles=4_240_000, hbm_bytes=1.64e9 / 2, mode="fast")
    assert est.compute_seconds == pytest.approx(1e-3)
    assert est.memory_seconds == pytest.approx(0.5e-3)
    assert est.seconds == pytest.approx(1e-3)
    assert est.bound == "compute"


def test_estimate_uses_the_clock_in_exact_mode():
    est = estimate(V6E, cycles=1_810_000, hbm_bytes=1.64e10, mode="exact")
    assert est.compute_seconds == pytest.approx(1e-3)
    assert est.memory_seconds == pytest.approx(1e-2)
    assert est.bound == "memory"


def test_candidate_hbm_bytes_without_xla_bytes_is_the_pallas_traffic():
    report = TrafficReport(calls=(_call(hbm_bytes=1000, multiplicity=3),))
    assert candidate_hbm_bytes(report, {}) == 3000.0


def test_candidate_hbm_bytes_replaces_the_kernels_share_of_xla_bytes():
    report = TrafficReport(calls=(_call(hbm_bytes=5000, io_bytes=2000),))
    # XLA counted the custom call as its io bytes (2000) plus 700 of surrounding ops.
    assert candidate_hbm_bytes(report, {"bytes accessed": 2700.0}) == 5700.0


def test_candidate_hbm_bytes_ignores_an_understated_cost_estimate():
    honest = TrafficReport(calls=(_call(hbm_bytes=5000, io_bytes=2000),))
    claims_little = TrafficReport(calls=(_call(hbm_bytes=5000, io_bytes=2000, claimed_bytes=10.0),))
    # XLA takes the claimed 10 bytes for the custom call: 710 accessed in total.
    assert candidate_hbm_bytes(claims_little, {"bytes accessed": 710.0}) == 5700.0
    assert candidate_hbm_bytes(honest, {"bytes accessed": 2700.0}) == 5700.0


def test_candidate_hbm_bytes_never_subtracts_below_the_traffic():
    report = TrafficReport(calls=(_call(hbm_bytes=5000, io_bytes=2000),))
    assert candidate_hbm_bytes(report, {"bytes accessed": 100.0}) == 5000.0


def test_faster_than_physics_is_flagged():
    roof = roofline(V6E, flops=0.0, bytes_moved=1.64e9, dtype_name="float32")  # 1 ms memory-bound
    flags = performance_flags(candidate_seconds=0.5e-3, roofline=roof)
    assert len(flags) == 1
    assert flags[0].startswith("faster_than_physics")
    assert "memory roofline" in flags[0]
    assert performance_flags(candidate_seconds=PHYSICS_MARGIN * 1e-3 * 1.001, roofline=roof) == []
    assert performance_flags(candidate_seconds=2e-3, roofline=roof) == []


def test_an_estimate_is_faster_than_physics_only_when_the_kernel_moves_less_than_the_task_must():
    roof = roofline(V6E, flops=0.0, bytes_moved=1.64e9, dtype_name="float32")
    skipped = traffic_flags(candidate_bytes=0.25 * 1.64e9, roofline=roof, chip_bandwidth=V6E.hbm_bandwidth)
    assert len(skipped) == 1 and skipped[0].startswith("faster_than_physics") and "410 MB" in skipped[0]
    assert traffic_flags(candidate_bytes=1.64e9, roofline=roof, chip_bandwidth=V6E.hbm_bandwidth) == []


# --- profile ------------------------------------------------------------------------------------------------


def _profile(*, calls: tuple[PallasCallTraffic, ...] = (_call(),), cand_cycles: int = 2_000_000,
             cand_bytes: float = 60 * MIB, vmem_limits: list[int | None] | None = None) -> dict:
    """The dict Child.performance builds, from the same functions."""
    chip = V6E
    c_est = estimate(chip, cycles=cand_cycles, hbm_bytes=cand_bytes)
    r_est = estimate(chip, cycles=4_000_000, hbm_bytes=30 * MIB)
    roof = roofline(chip, flops=2 * 2048**3, bytes_moved=24 * MIB, dtype_name="bfloat16")
    traffic = TrafficReport(calls=calls)
    return {
        "method": "estimated", "target": chip.name,
        "candidate": {**asdict(c_est), "seconds": c_est.seconds, "bound": c_est.bound,
                      "ops": [("fusion.1", cand_cycles // 4), ("matmul_kernel", cand_cycles * 3 // 4)]},
        "reference": {**asdict(r_est), "seconds": r_est.seconds, "bound": r_est.bound,
                      "ops": [("dot", 4_000_000)]},
        "roofline": {"seconds": roof.seconds, "bound": roof.bound, "flops": roof.flops, "bytes": roof.bytes,
                     "intensity": roof.intensity},
        "kernels": kernel_facts(traffic, chip, vmem_limits or [None] * len(calls)),
    }


def test_kernel_facts_defaults_to_the_chips_scoped_vmem_limit():
    (facts,) = kernel_facts(TrafficReport(calls=(_call(multiplicity=2),)), V6E, [None])
    assert facts["vmem_limit_bytes"] == 32 * MIB
    assert facts["grid"] == [4, 8] and facts["grid_steps"] == 32
    assert facts["hbm_bytes"] == 96 * MIB and facts["io_bytes"] == 48 * MIB
    (explicit,) = kernel_facts(TrafficReport(calls=(_call(),)), V6E, [64 * MIB])
    assert explicit["vmem_limit_bytes"] == 64 * MIB


def test_summary_mentions_bound_grid_vmem_and_refetch():
    text = summarise(_profile())
    lines = text.splitlines()
    assert lines[0].startswith("estimated on v6e: candidate ")
    assert "-> compute-bound." in text
    assert "roofline: " in text and ", compute-bound (" in text
    assert "kernel matmul_kernel: grid (4, 8) = 32 steps" in text
    assert "VMEM 12.0 MiB of 32.0 MiB scoped limit" in text
    assert "(2.00x its operands)" in text
    assert "top ops by estimated time: matmul_kernel 75%, fusion.1 25%." in text
    refetch = [line for line in lines if line.startswith("hint: matmul_kernel reads 2.0x its operands")]
    assert len(refetch) == 1


def test_speedup_in_the_summary():
    profile = _profile()
    expected = profile["reference"]["seconds"] / profile["candidate"]["seconds"]
    assert f"(x{expected:.2f})" in summarise(profile).splitlines()[0]


def test_no_refetch_hint_at_or_below_one_and_a_half_times_the_operands():
    profile = _profile(calls=(_call(hbm_bytes=36 * MIB, io_bytes=24 * MIB),))
    assert not any("its operands:" in h for h in hints(profile))
    assert "(1.50x its operands)" in summarise(profile)


def test_vmem_hint_near_the_limit():
    profile = _profile(calls=(_call(vmem_bytes=30 * MIB),))
    (vmem_hint,) = [h for h in hints(profile) if "VMEM limit" in h]
    assert "94%" in vmem_hint


def test_grid_steps_hint_for_a_compute_bound_kernel_with_a_huge_grid():
    profile = _profile(calls=(_call(grid=(128, 64), hbm_bytes=24 * MIB),))
    assert profile["candidate"]["bound"] == "compute"
    assert any("8,192 grid steps" in h for h in hints(profile))


def test_memory_bound_task_with_a_compute_bound_kernel():
    profile = _profile(calls=(_call(hbm_bytes=24 * MIB),))
    half = profile["candidate"]["seconds"] / 2
    profile["roofline"] = {**profile["roofline"], "bound": "memory", "seconds": half}
    assert any("memory-bound but the kernel is compute-bound" in h for h in hints(profile))


def test_manual_dma_kernel_is_marked_as_a_lower_bound():
    text = summarise(_profile(calls=(_call(exact=False),)))
    assert "(lower bound: manual DMA)" in text


def test_summary_of_a_pure_jax_candidate_has_no_kernel_lines():
    text = summarise(_profile(calls=()))
    assert not any(line.startswith("kernel ") for line in text.splitlines())
    assert not any(line.startswith("hint: ") for line in text.splitlines())


def test_measured_profile_skips_the_estimate_line():
    profile = _profile()
    profile["method"] = "measured"
    text = summarise(profile)
    assert text.startswith("measured on v6e")
    assert "static cycles" not in text


def test_summary_of_a_zero_second_estimate():
    profile = _profile(calls=(), cand_cycles=0, cand_bytes=0.0)
    assert profile["candidate"]["seconds"] == 0.0
    assert "estimated on v6e" in summarise(profile)


# --- errors -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "kind"), [
    ("XlaRuntimeError: INTERNAL: CompileTimeScopedVmemOom: scoped allocation too large", "vmem_oom"),
    ("RESOURCE_EXHAUSTED: Ran out of memory in memory space vmem. Used 40.00M of 32.00M", "vmem_oom"),
    ("E2003 CompileTimeMosaicUnprovenMemoryAccessAlignment: cannot prove alignment", "alignment"),
    ("ValueError: The Pallas TPU lowering currently requires that the last two dimensions of your block "
     "shape are divisible by 8 and 128 respectively", "block_shape"),
    ("NotImplementedError: Unimplemented primitive in Pallas TPU lowering: cumsum", "unsupported_primitive"),
    ("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm", "hbm_oom"),
    ("ConcretizationTypeError: Abstract tracer value encountered", "tracer_error"),
    ("MLIR verification failed", "mosaic_error"),
])
def test_classify_text(text, kind):
    assert classify_text(text) == kind


def test_classify_text_falls_back_to_the_default():
    assert classify_text("something else entirely") == "error"
    assert classify_text("something else entirely", default="runtime_error") == "runtime_error"


CANDIDATE = textwrap.dedent("""\
    def helper(x):
        return x / 0


    def computation(x):
        y = x + 1
        return helper(y)
""")


def _raise_from_candidate(path: str) -> BaseException:
    namespace: dict = {}
    exec(compile(CANDIDATE, path, "exec"), namespace)
    try:
        namespace["computation"](1)
    except ZeroDivisionError as exc:
        return exc
    raise AssertionError("the candidate did not raise")


def test_candidate_line_picks_the_deepest_candidate_frame():
    path = "/evals/abc/candidate.py"
    exc = _raise_from_candidate(path)
    assert candidate_line(exc, path) == 2
    assert candidate_line(exc, "/evals/other/candidate.py") is None


def test_candidate_line_follows_the_cause():
    path = "/evals/abc/candidate.py"
    cause = _raise_from_candidate(path)
    try:
        raise RuntimeError("lowering failed") from cause
    except RuntimeError as exc:
        assert candidate_line(exc, path) == 2


def test_candidate_line_from_the_message():
    exc = ValueError("block shape error\n  at /evals/abc/candidate.py:17:3 in kernel")
    assert candidate_line(exc, "/evals/abc/candidate.py") == 17


def test_from_exception_builds_a_structured_error():
    path = "/evals/abc/candidate.py"
    error = from_exception(_raise_from_candidate(path), stage="correctness", candidate_path=path)
    assert (error.kind, error.line, error.stage) == ("zero_division_error", 2, "correctness")
    assert error.detail == "ZeroDivisionError: division by zero"


def test_from_exception_trims_huge_compiler_errors():
    exc = RuntimeError("Mosaic failed\n" + "x" * 10_000 + "\nthe useful tail")
    error = from_exception(exc, stage="compile", candidate_path="c.py", default_kind="compile_error")
    assert error.kind == "mosaic_error"
    assert len(error.detail) < 4000
    assert error.detail.startswith("RuntimeError: Mosaic failed")
    assert error.detail.endswith("the useful tail")


def test_time_estimate_is_frozen():
    est = TimeEstimate(cycles=1, hbm_bytes=0.0, compute_seconds=1.0, memory_seconds=0.0)
    assert replace(est, memory_seconds=2.0).bound == "memory"
    with pytest.raises(AttributeError):
        est.cycles = 2  # type: ignore[misc]


def test_vmem_window_allocation_overflow_is_vmem_oom() -> None:
    text = ("RESOURCE_EXHAUSTED: Allocation (size=268435456) would exceed memory (size=134217728) :: #allocation3 "
            "[shape = 'u8[268435456]{0}', space=vmem, size = 0x10000000, scoped, tag = 'input window allocation']")
    assert classify_text(text) == "vmem_oom"
