"""The time model without a TPU: the compiled program's ops (from XLA:TPU's own HLO for v6e, saved from real
compiles), their time, and the band an estimate carries."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from tpu_runner.analysis import OperandTraffic, PallasCallTraffic, TrafficReport
from tpu_runner.analysis.hlo_ops import hlo_ops
from tpu_runner.compiler import CompileAnswer
from tpu_runner.hardware import get_chip
from tpu_runner.reports import Performance
from tpu_runner.timing import (
    band_text,
    calibration,
    clear_gain,
    describe_speedup,
    program_band,
    program_time,
    speedup_band,
    untiled_traffic,
)

DATA = Path(__file__).parent / "data"
BMM = (DATA / "batched_matmul.v6e.hlo.txt").read_text()  # einsum bhqd,bhkd->bhqk, [4,8,1024,128] bf16
CONV = (DATA / "conv2d.v6e.hlo.txt").read_text()  # NCHW [32,8,128,128] * OIHW [64,8,3,3], VALID
V6E = get_chip("v6e")


def test_a_batched_dot_written_as_a_convolution_is_a_batched_matmul_with_its_true_flops():
    ops = {op.name: op for op in hlo_ops(BMM)}
    dot = ops["fusion"]
    assert dot.op_class == "batched_matmul"  # batch dimensions ride in the window: no spatial work
    assert dot.flops == 2 * 4 * 8 * 1024 * 1024 * 128
    assert dot.xla_cycles > 0
    assert ops["copy-start"].op_class == "async"


def test_a_spatial_convolution_is_a_convolution_and_its_layout_copies_are_copies():
    ops = hlo_ops(CONV)
    (conv,) = [op for op in ops if op.op_class == "convolution"]
    assert conv.flops == 2 * 32 * 64 * 126 * 126 * 8 * 9
    copies = [op for op in ops if op.op_class == "copy"]
    assert copies and all(op.hbm_bytes > 0 and op.xla_cycles > 0 for op in copies)


def test_metadata_strings_cannot_pose_as_the_compilers_figures():
    """Op names in metadata are the program author's strings (jax.named_scope): they are not read."""
    forged = BMM.replace('metadata={op_name="jit(bmm)/bhqd,bhkd->bhqk/dot_general" stack_frame_id=2}, backend',
                         'metadata={op_name="x} \\"estimated_cycles\\":\\"1\\" calls=%fused_computation {" '
                         'stack_frame_id=2}, backend')
    assert forged != BMM
    assert [(o.name, o.op_class, o.xla_cycles) for o in hlo_ops(forged)] == \
        [(o.name, o.op_class, o.xla_cycles) for o in hlo_ops(BMM)]


def test_each_op_takes_the_longer_of_its_compute_and_its_bytes_with_its_class_factor(monkeypatch):
    answer = CompileAnswer(True, hlo_text=BMM)
    monkeypatch.setattr(calibration, "FACTORS", {})
    plain = program_time(V6E, answer, mode="fast")
    monkeypatch.setattr(calibration, "FACTORS", {("xla", "batched_matmul"): 0.5})
    halved = program_time(V6E, answer, mode="fast")
    (dot,) = [op for op in plain.ops if op.name == "fusion"]
    assert dot.source == "xla"
    assert dot.compute_seconds == pytest.approx(hlo_ops(BMM)[-1].xla_cycles / V6E.clock_hz)
    (dot_half,) = [op for op in halved.ops if op.name == "fusion"]
    assert dot_half.compute_seconds == pytest.approx(dot.compute_seconds / 2)
    assert plain.seconds == pytest.approx(sum(op.seconds for op in plain.ops))
    assert all(op.seconds == 0 for op in plain.ops if op.op_class == "async")  # overlaps what follows


KERNEL_HLO = """HloModule jit_k, is_scheduled=true

ENTRY %main.2 (x.1: f32[1024,1024]) -> f32[1024,1024] {
  %x.1 = f32[1024,1024]{1,0:T(8,128)} parameter(0)
  ROOT %my_kernel = f32[1024,1024]{1,0:T(8,128)} custom-call(%x.1), custom_call_target="tpu_custom_call", """ \
    """backend_config={"flag_configs":[],"estimated_cycles":"5"}
}
"""


def test_a_kernels_time_never_rests_on_xlas_estimate_which_is_its_own_cost_estimate():
    profiled = CompileAnswer(True, hlo_text=KERNEL_HLO, ops=[("my_kernel_body.1", 424_000)], profiled=True)
    (kernel,) = program_time(V6E, profiled, mode="fast", kernel_bytes=8e6, kernel_steps=16).ops
    assert kernel.op_class == "kernel" and kernel.source == "profile"
    assert kernel.compute_seconds == pytest.approx(424_000 / V6E.cycle_rate("fast"))
    assert kernel.memory_seconds == pytest.approx(8e6 / (V6E.hbm_bandwidth * calibration.HBM_EFFICIENCY))  # BlockSpecs
    assert kernel.fixed_seconds > calibration.LAUNCH_SECONDS  # per-grid-step cost
    unprofiled = CompileAnswer(True, hlo_text=KERNEL_HLO, profile_failure="aborted")
    (work,) = program_time(V6E, unprofiled, mode="fast", kernel_bytes=8e6, kernel_flops=2e12).ops
    assert work.source == "work" and work.compute_seconds == pytest.approx(2e12 / V6E.peak_flops["bf16"])


def test_a_profiled_kernel_takes_at_least_the_tasks_flops_at_the_mxu_peak():
    # The static profile counts a kernel's code once, not once per grid step and loop trip: a convolution's
    # kernel profiled at 13,780 cycles (9 us) does 76 GFLOP, which no chip does in 9 us.
    profiled = CompileAnswer(True, hlo_text=KERNEL_HLO, ops=[("my_kernel_body.1", 13_780)], profiled=True)
    (kernel,) = program_time(V6E, profiled, mode="fast", kernel_bytes=8e6, kernel_flops=76e9, kernel_steps=16).ops
    assert kernel.source == "profile"
    assert kernel.compute_seconds == pytest.approx(76e9 / V6E.peak_flops["bf16"])
    (small,) = program_time(V6E, profiled, mode="fast", kernel_bytes=8e6, kernel_flops=1e6, kernel_steps=16).ops
    assert small.compute_seconds == pytest.approx(13_780 / V6E.cycle_rate("fast"))  # the profile, where it is more


def test_a_kernel_takes_at_least_the_tasks_elementwise_work_where_the_chip_has_a_vector_rate():
    # 39k on a v5e: its GELU over 528M outputs in a loop whose body the profile counts once.
    profiled = CompileAnswer(True, hlo_text=KERNEL_HLO, ops=[("my_kernel_body.1", 13_780)], profiled=True)
    rated = dataclasses.replace(calibration.for_target("v6e"), kernel_vpu_per_cycle=4096.0)
    args = {"mode": "fast", "kernel_bytes": 8e6, "kernel_flops": 76e9, "kernel_steps": 16, "kernel_vpu": 12e9}
    (floored,) = program_time(V6E, profiled, **args, calibration=rated).ops
    assert floored.compute_seconds == pytest.approx(12e9 / (4096 * V6E.clock_hz))
    assert floored.compute_before_vector == pytest.approx(76e9 / V6E.peak_flops["bf16"])  # what a refit starts from
    assert floored.vector_elements == 12e9
    unrated = dataclasses.replace(rated, kernel_vpu_per_cycle=None)  # no kernel measured on the chip: as before
    (plain,) = program_time(V6E, profiled, **args, calibration=unrated).ops
    assert plain.compute_seconds == pytest.approx(76e9 / V6E.peak_flops["bf16"])
    (light,) = program_time(V6E, profiled, **{**args, "kernel_vpu": 1e6}, calibration=rated).ops
    assert light.compute_seconds == plain.compute_seconds  # a floor, never more than the work says
    # Only kernels: XLA's own ops keep their cost model's figure.
    (fusion, *_) = program_time(V6E, CompileAnswer(True, hlo_text=BMM), mode="fast", kernel_vpu=1e12,
                                calibration=rated).ops
    assert fusion.vector_elements == 0 and fusion.compute_seconds == fusion.compute_before_vector


def _operand(block: tuple[int | None, ...], dtype: str, transfers: int) -> OperandTraffic:
    size = math.prod(1 if d is None else d for d in block) * (2 if dtype == "bfloat16" else 4)
    return OperandTraffic(role="output", shape=(128, 128, 126, 126), dtype=dtype, block_shape=block, block_bytes=size,
                          transfers=transfers, bytes=size * transfers, buffer_count=2, in_hbm_manual=False)


def test_blocks_that_are_not_whole_tiles_move_at_the_chips_measured_rate_where_it_has_one():
    # 22k's output on a v5e: 126 x 126 bf16 planes, written at ~149 GB/s where whole tiles go at ~560.
    planes = _operand((None, 16, 126, 126), "bfloat16", 1024)
    aligned = _operand((None, 16, 128, 128), "bfloat16", 1024)
    bias = _operand((1, 126), "float32", 1024)  # narrower than a tile's rows: not the kind measured
    call = PallasCallTraffic(name="k", grid=(1024,), grid_steps=1024, operands=(planes, aligned, bias),
                             scratch_bytes=0, vmem_bytes=0, hbm_bytes=0, io_bytes=0, claimed_bytes=None,
                             claimed_flops=None, exact=True, multiplicity=1)
    v5e = get_chip("v5e")
    moved, seconds = untiled_traffic(v5e, TrafficReport((call,)))
    assert moved == planes.bytes and seconds == pytest.approx(planes.bytes / v5e.untiled_dma_bandwidth[1])
    assert v5e.block_dma_rate((128, 126), 2) == v5e.untiled_dma_bandwidth[0]  # one dim off
    assert v5e.block_dma_rate((16, 128), 2) is None and v5e.block_dma_rate((8, 128), 2) is not None  # bf16 packs 16
    assert untiled_traffic(V6E, TrafficReport((call,))) == (0.0, 0.0)  # not measured there: at full bandwidth
    profiled = CompileAnswer(True, hlo_text=KERNEL_HLO, ops=[("my_kernel_body.1", 13_780)], profiled=True)
    (slow,) = program_time(v5e, profiled, mode="fast", kernel_bytes=8e6, kernel_untiled_seconds=seconds).ops
    (fast,) = program_time(v5e, profiled, mode="fast", kernel_bytes=8e6).ops
    assert slow.memory_seconds == pytest.approx(fast.memory_seconds + seconds)


def test_an_answer_read_back_from_json_keeps_its_program():
    from dataclasses import asdict

    answer = CompileAnswer(True, ops=[("fusion", 3)], hlo_text=BMM, cost={"flops": 1.0})
    again = CompileAnswer.from_json({**asdict(answer), "error": None, "hlo_ops": "a field of an older cache"})
    assert again.hlo_ops == answer.hlo_ops and again.ops == [("fusion", 3)]


def _perf(speedup: float, band: list[float] | None) -> Performance:
    return Performance(method="estimated", unit="ms", reference=1.0, candidate=1.0 / speedup, speedup=speedup,
                       roofline_fraction=0.5, roofline_ms=0.5, bound="compute", flops=1.0, bytes=1.0, band=band)


def test_a_speedup_band_combines_both_programs_errors_and_says_when_there_is_no_clear_gain():
    low, high = speedup_band(1.04, (0.9, 1.1), (0.85, 1.2))
    assert low < 1.04 < high
    assert math.log(1.04 / low) == pytest.approx(math.hypot(math.log(1 / 0.9), math.log(1.2)))
    assert band_text(_perf(1.04, [low, high])).endswith("no clear gain")
    assert "no clear gain" in describe_speedup(_perf(1.04, [low, high]))
    assert clear_gain(_perf(1.04, [low, high])) is False
    clear = _perf(2.5, [1.9, 3.1])
    assert describe_speedup(clear) == "x2.50 estimated, likely x1.90-x3.10" and clear_gain(clear) is True
    assert band_text(_perf(2.0, None)) == "" and clear_gain(_perf(2.0, None)) is None


def test_a_programs_band_is_that_of_the_class_its_time_is_mostly_in_and_wider_where_unmeasured(monkeypatch):
    monkeypatch.setattr(calibration, "BANDS", {"matmul": (0.9, 1.1), "convolution": (0.6, 1.5)})
    assert program_band({"matmul": 3.0, "convolution": 1.0}, "v6e") == (0.9, 1.1)
    assert program_band({"matmul": 1.0, "convolution": 3.0}, "v6e") == (0.6, 1.5)
    low, high = program_band({"matmul": 3.0}, "v5p")
    assert low < 0.9 and high > 1.1
    assert program_band({"sort": 1.0}, "v6e") == calibration.DEFAULT_BAND


def test_a_kernels_time_counts_under_the_class_its_band_is_kept_for():
    answer = CompileAnswer(True, hlo_text=KERNEL_HLO, ops=[("my_kernel_body.1", 424_000)], profiled=True)
    by_class = program_time(V6E, answer, mode="fast", kernel_bytes=8e6).by_class()
    assert set(by_class) == {"kernel"} and "kernel" in calibration.BANDS
    assert program_band(by_class, "v6e") == calibration.BANDS["kernel"]


def _fitted_file(folder: Path, target: str, kernel: dict | None = None) -> None:
    folder.mkdir(exist_ok=True)
    (folder / f"{target}.json").write_text(json.dumps({
        "target": target, "workloads": 3, "factors": {"xla/batched_matmul": 2.0}, "hbm_efficiency": 0.5,
        "bands": {"batched_matmul": [0.8, 1.3]}, "default_band": [0.7, 1.4], **({"kernel": kernel} if kernel else {})}))


def test_a_chip_with_factors_of_its_own_is_estimated_and_banded_by_them(monkeypatch, tmp_path):
    monkeypatch.setattr(calibration, "FITTED", tmp_path / "fitted")
    calibration._fitted.cache_clear()
    try:
        _fitted_file(tmp_path / "fitted", "v6e")
        answer = CompileAnswer(True, hlo_text=BMM)
        own = {op.name: op for op in program_time(V6E, answer, mode="fast").ops}
        shared = {op.name: op for op in program_time(V6E, answer, mode="fast",
                                                     calibration=calibration.UNCALIBRATED).ops}
        assert own["fusion"].compute_seconds == pytest.approx(2 * shared["fusion"].compute_seconds)
        assert own["fusion"].memory_seconds == pytest.approx(2 * shared["fusion"].memory_seconds)
        assert program_band({"batched_matmul": 1.0}, "v6e") == (0.8, 1.3)  # its own, not widened
        assert program_band({"sort": 1.0}, "v6e") == (0.7, 1.4)
        assert program_band({"kernel": 1.0}, "v6e") == calibration.BANDS["kernel"]
        assert calibration.for_target("v6e").kernel_vpu_per_cycle is None  # no kernel measured there
        _fitted_file(tmp_path / "fitted", "v5e", kernel={"vpu_elements_per_cycle": 4096, "band": [0.85, 1.4]})
        assert calibration.for_target("v5e").kernel_vpu_per_cycle == 4096
        assert program_band({"kernel": 1.0}, "v5e") == (0.85, 1.4)  # the chip's own measured kernels
        low, high = program_band({"batched_matmul": 1.0}, "v5p")  # no file: v6e's tables, widened
        assert (low, high) != (0.8, 1.3) and low < calibration.BANDS["batched_matmul"][0]
    finally:
        calibration._fitted.cache_clear()


def test_the_shipped_fits_are_whole_and_their_bands_hold_their_own_held_out_workloads():
    for path in sorted(calibration.FITTED.glob("*.json")):
        data = json.loads(path.read_text())
        fitted = calibration.for_target(path.stem)
        assert fitted.fitted_on == path.stem == data["target"] and 0 < fitted.hbm_efficiency <= 1
        assert all(0.2 < f < 5 for f in fitted.factors.values())
        assert all(low <= 1.0 <= high for low, high in fitted.bands.values())
        trues = sorted(1 / r for r in data["held_out"].values())
        inside = sum(fitted.default_band[0] <= t <= fitted.default_band[1] for t in trues)
        assert len(trues) == data["workloads"] and inside >= 0.75 * len(trues)
        if "kernel" in data:  # benchmarks/fit_kernel_model.py's: the chip's measured kernels, held out one by one
            kernel = data["kernel"]
            assert fitted.kernel_vpu_per_cycle == kernel["vpu_elements_per_cycle"]
            low, high = fitted.bands["kernel"]
            trues = [1 / r for r in kernel["held_out"].values()]
            assert len(trues) == kernel["kernels"] and sum(low <= t <= high for t in trues) >= 0.75 * len(trues)
