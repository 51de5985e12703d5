"""benchmarks/fit_kernel_model.py on kernels' estimates kept from an earlier run: the vector rate that puts the
elementwise-bound kernels at their measured times, its leave-one-out fidelity and band, written beside the chip's
XLA factors without touching them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
V5E_CLOCK = 1.5e9


def _kernel(compute_ms: float, memory_ms: float, vector_elements: float, measured_ms: float) -> dict:
    """One kernel's estimate as the evaluator's profile records it, and its measured time."""
    op = {"name": "k", "compute_before_vector": compute_ms / 1e3, "memory": memory_ms / 1e3, "fixed": 1e-6,
          "repeat": 1, "vector_elements": vector_elements}
    profile = {"candidate": {"by_class": {"kernel": max(compute_ms, memory_ms) / 1e3 + 1e-6, "copy": 0.0},
                             "kernel_ops": [op]}, "roofline": {"seconds": 1e-5}}
    return {"profile": profile, "measured_s": measured_ms / 1e3}


def test_the_rate_that_puts_elementwise_bound_kernels_at_their_times_is_fitted_and_kept(tmp_path: Path) -> None:
    at_4096 = 4096 * V5E_CLOCK / 1e3  # elements per ms at 4096 a cycle
    estimates = {
        "tasks/streaming": _kernel(0.1, 1.0, 1e8, 1.02),
        "tasks/gemm": _kernel(2.0, 0.5, 1e9, 2.1),
        "measured/conv_gelu": _kernel(0.2, 0.2, 1.8 * at_4096, 1.8),  # its elementwise work is its time
        "measured/attention": _kernel(0.5, 0.3, 3.0 * at_4096, 3.1),
    }
    (tmp_path / "estimates.json").write_text(json.dumps(estimates))
    fitted = tmp_path / "fitted"
    fitted.mkdir()
    xla_fit = {"target": "v5e", "workloads": 2, "factors": {"xla/matmul": 0.9}, "hbm_efficiency": 0.8,
               "bands": {"matmul": [0.9, 1.1]}, "default_band": [0.85, 1.2], "held_out": {"a": 1.0, "b": 1.0}}
    (fitted / "v5e.json").write_text(json.dumps(xla_fit))
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "fit_kernel_model.py"), "--measured-log",
                          str(tmp_path / "unused.jsonl"), "--target", "v5e", "--estimates",
                          str(tmp_path / "estimates.json"), "--write", "--fitted", str(fitted)],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert "vector rate: 4096 elements per cycle" in run.stdout, run.stdout
    assert "before: 2/4 within" in run.stdout and "fitted: 4/4 within" in run.stdout, run.stdout
    assert "leave-one-out: 4/4 within" in run.stdout, run.stdout
    kept = json.loads((fitted / "v5e.json").read_text())
    assert {k: kept[k] for k in xla_fit} == xla_fit  # the XLA factors as they were
    kernel = kept["kernel"]
    assert kernel["vpu_elements_per_cycle"] == 4096 and kernel["kernels"] == 4
    assert set(kernel["held_out"]) == set(estimates)
    low, high = kernel["band"]
    assert low <= 0.9 and high >= 1.1 and all(low <= 1 / r <= high for r in kernel["held_out"].values())


def test_too_few_measured_kernels_is_said_and_nothing_is_written(tmp_path: Path) -> None:
    (tmp_path / "estimates.json").write_text(json.dumps({"tasks/one": _kernel(1.0, 1.0, 0.0, 1.0)}))
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "fit_kernel_model.py"), "--measured-log",
                          str(tmp_path / "unused.jsonl"), "--target", "v5e", "--estimates",
                          str(tmp_path / "estimates.json"), "--write", "--fitted", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert run.returncode != 0 and "1 measured kernels: too few to fit" in run.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["estimates.json"]
