"""The profile chart's right panel follows the profile: op by op for programs of several ops, the roofline for
single-op (or measured) programs; and the chart draws every kind of panel."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tpu_runner.hardware import CHIPS
from tpu_runner.timing import TOP_OPS, render_profile_chart, right_panel

PNG = b"\x89PNG\r\n\x1a\n"


def estimated(cand_ops: list[tuple[str, int]], ref_ops: list[tuple[str, int]], *,
              classes: dict[str, str] | None = None) -> dict[str, Any]:
    """An estimated profile as `performance.estimated_performance` writes it (ops in ns)."""
    def program(ops: list[tuple[str, int]], hbm: float) -> dict[str, Any]:
        seconds = sum(ns for _, ns in ops) * 1e-9
        return {"seconds": seconds, "compute_seconds": seconds / 4, "memory_seconds": seconds, "hbm_bytes": hbm,
                "bound": "memory", "cycles": 1000, "ops": ops, "op_classes": dict(classes or {})}

    return {"method": "estimated", "target": "v6e", "band": [1.6, 2.5],
            "candidate": program(cand_ops, 256e6), "reference": program(ref_ops, 512e6),
            "roofline": {"seconds": 150e-6, "bound": "memory", "flops": 3e8, "bytes": 256e6, "intensity": 3e8 / 256e6},
            "kernels": [{"name": "_softmax_kernel", "grid": [64], "grid_steps": 64, "vmem_bytes": 1 << 24,
                         "vmem_limit_bytes": 1 << 26, "hbm_bytes": 256e6, "io_bytes": 256e6, "exact": True,
                         "multiplicity": 1}]}


def test_programs_of_several_ops_are_shown_op_by_op_for_both() -> None:
    profile = estimated([("_softmax.1", 160_000), ("copy.2", 20_000)],
                        [("fusion.1", 100_000), ("fusion", 110_000), ("reduce_max.7", 120_000)],
                        classes={"_softmax.1": "kernel", "copy.2": "copy", "fusion": "elementwise"})
    panel = right_panel(profile)
    assert panel.kind == "ops"
    assert [(b.program, b.name, b.kind) for b in panel.bars] == [
        ("candidate", "_softmax.1", "kernel"), ("candidate", "copy.2", "copy"),
        ("reference", "reduce_max.7", "op"), ("reference", "fusion", "elementwise"), ("reference", "fusion.1", "op")]
    assert panel.bars[0].seconds == pytest.approx(160e-6) and panel.bars[0].share == pytest.approx(160 / 180)
    assert sum(b.share for b in panel.bars if b.program == "reference") == pytest.approx(1.0)


def test_many_ops_keep_the_largest_and_sum_the_rest() -> None:
    ref = [(f"fusion.{i}", 1000 * (i + 1)) for i in range(TOP_OPS + 3)] + [("fusion.0", 500)]  # one op twice
    panel = right_panel(estimated([("k", 5000), ("copy", 100)], ref))
    reference = [b for b in panel.bars if b.program == "reference"]
    assert len(reference) == TOP_OPS + 1 and reference[-1].name == "3 other ops"
    assert reference[-1].seconds == pytest.approx((1000 + 500 + 2000 + 3000) * 1e-9)  # fusion.0 added up
    assert reference[0].name == f"fusion.{TOP_OPS + 2}"


def test_single_op_programs_sit_on_the_roofline() -> None:
    profile = estimated([("_softmax.1", 160_000)], [("fusion", 320_000)])
    panel = right_panel(profile)
    assert panel.kind == "roofline"
    chip = CHIPS["v6e"]
    assert (panel.peak_flops, panel.bandwidth) == (chip.peak_flops["bf16"], chip.hbm_bandwidth)
    cand, ref = panel.points
    assert (cand.label, ref.label) == ("candidate", "reference")
    assert cand.intensity == pytest.approx(3e8 / 256e6) and ref.intensity == pytest.approx(3e8 / 512e6)
    assert cand.flops_per_second == pytest.approx(3e8 / 160e-6)
    assert cand.flops_per_second / ref.flops_per_second == pytest.approx(2.0)  # the speedup, as the same work


def test_a_measured_profile_has_no_ops_and_is_placed_on_the_roofline_by_its_kernels_traffic() -> None:
    profile = estimated([], [])
    profile.update(method="measured", candidate={"seconds": 200e-6, "spread": 1e-6, "ops": []},
                   reference={"seconds": 400e-6, "spread": 2e-6, "ops": []})
    panel = right_panel(profile)
    assert panel.kind == "roofline"
    assert panel.points[0].intensity == pytest.approx(3e8 / 256e6)  # the kernel's bytes
    assert panel.points[1].intensity == pytest.approx(3e8 / 256e6)  # the task's compulsory bytes


def test_without_work_or_a_known_chip_the_panel_falls_back() -> None:
    no_flops = estimated([("copy", 1000)], [("copy.1", 2000)])
    no_flops["roofline"]["flops"] = 0.0
    assert right_panel(no_flops).kind == "ops"
    unknown = estimated([], [])
    unknown.update(target="v9x", method="measured", candidate={"seconds": 1e-4, "ops": []},
                   reference={"seconds": 2e-4, "ops": []})
    panel = right_panel(unknown)
    assert panel.kind == "kernels" and panel.kernels == (("_softmax_kernel", 256e6),)


@pytest.mark.parametrize("case", ["ops", "roofline", "kernels"])
def test_every_panel_is_drawn(case: str, tmp_path: Path) -> None:
    profile = {
        "ops": estimated([("k", 5000), ("copy", 100)], [("a", 3000), ("b", 4000)]),
        "roofline": estimated([("k", 5000)], [("a", 9000)]),
        "kernels": {**estimated([], []), "target": "v9x", "method": "measured",
                    "candidate": {"seconds": 1e-4, "ops": []}, "reference": {"seconds": 2e-4, "ops": []}},
    }[case]
    assert right_panel(profile).kind == case
    path = render_profile_chart(profile, tmp_path / "chart.png", title="softmax on v6e")
    assert path.read_bytes()[:8] == PNG


def test_charts_drawn_from_several_threads_at_once_all_come_out(tmp_path: Path) -> None:
    # matplotlib's text layout is shared by every figure: unguarded, most of 32 such charts in 8 threads failed
    # (pyparsing's ParseException on the log axis's tick labels, 'pop from empty list'), as evaluations in threads did
    failures: list[BaseException] = []

    def draw(i: int) -> None:
        for j in range(2):
            try:
                render_profile_chart(estimated([("k", 5000 + i)], [("a", 9000 + j)]), tmp_path / f"{i}_{j}.png",
                                     title="softmax on v6e")
            except Exception as exc:  # noqa: BLE001 - every failure is collected and shown
                failures.append(exc)

    threads = [threading.Thread(target=draw, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[:3]
    assert sorted(p.read_bytes()[:8] for p in tmp_path.glob("*.png")) == [PNG] * 8
