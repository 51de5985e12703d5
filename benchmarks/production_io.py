"""The CPU work around a check at production shapes, in one run: drawing the inputs, and comparing an output before
and after the comparison was made blockwise and parallel.

On a TPU host candidates are checked at their production shapes: every case's inputs are drawn (in the reference's
child and the candidate's, now while the chip works on the case before) and every output is compared with the
reference's (in the evaluator). This times both for one production-sized workload - a bf16 GEMM's operands
(4096x8192, 8192x8192) and its 4096x8192 output: the draw as it is (`tpu_runner.tasks.case_inputs`; its
values are what every cached reference output was computed on, so it is unchanged), and the comparison as it was (one
thread, float64 temporaries over whole arrays: the baseline, kept here) and as it is
(`tpu_runner.checking.compare_outputs`).

    .venv/bin/python benchmarks/production_io.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

from tpu_runner.checking import OutputSet, compare_outputs  # noqa: E402
from tpu_runner.tasks import EVALUATOR_CASES, ArgSpec, Configuration, case_inputs  # noqa: E402

OPERANDS = (ArgSpec((4096, 8192), "bfloat16"), ArgSpec((8192, 8192), "bfloat16"))
CASES = [c for c in EVALUATOR_CASES if c.distribution != "task"]


def compare_before(c: np.ndarray, r: np.ndarray, atol: float, rtol: float) -> tuple[bool, float]:
    """The comparison as it was: whole-array float64 temporaries, one thread."""
    ch, rh = c.astype(np.float64), r.astype(np.float64)
    c_bad, r_bad = ~np.isfinite(ch), ~np.isfinite(rh)
    both = ~c_bad & ~r_bad
    diff = np.where(both, np.abs(ch - rh), 0.0)
    allowed = atol + rtol * np.abs(np.where(both, rh, 0.0))
    significant = both & (np.abs(rh) > max(atol, 1e-30))
    float((diff[significant] / np.abs(rh[significant])).max(initial=0.0))
    return not (diff > allowed).any(), float(diff.max(initial=0.0))


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    config = Configuration(OPERANDS, ())
    elements = sum(int(np.prod(s.shape)) for s in OPERANDS)
    print(f"{os.cpu_count()} CPUs; best of {args.repeat}")
    for case in CASES:
        took = best_of(args.repeat, lambda case=case: case_inputs(config, case))
        print(f"draw {case.name:<8} {elements / 1e6:.0f}M bf16 values: {took:.2f} s (overlapped with the chip's work)")
    rng = np.random.default_rng(0)
    ref32 = rng.standard_normal((4096, 8192), dtype=np.float32)
    cand = (ref32 * (1 + 1e-3 * rng.standard_normal(ref32.shape, dtype=np.float32))).astype(ml_dtypes.bfloat16)
    ref = ref32.astype(ml_dtypes.bfloat16)
    ok_before, worst_before = compare_before(cand, ref, 2e-2, 2e-2)
    now_result = compare_outputs(OutputSet("*", (cand,)), OutputSet("*", (ref,)), 2e-2, 2e-2)
    assert (ok_before, worst_before) == (now_result.ok, now_result.max_abs_err), "the two comparisons disagree"
    before = best_of(args.repeat, lambda: compare_before(cand, ref, 2e-2, 2e-2))
    now = best_of(args.repeat, lambda: compare_outputs(OutputSet("*", (cand,)), OutputSet("*", (ref,)), 2e-2, 2e-2))
    print(f"compare one {ref.size / 1e6:.0f}M-element bf16 output: before {before:.2f} s, now {now:.2f} s "
          f"(x{before / now:.1f}; same verdict and worst difference)")


if __name__ == "__main__":
    main()
