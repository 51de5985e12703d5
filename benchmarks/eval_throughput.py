"""How fast the evaluator gets through candidates on this machine.

Evaluates the suite's known-good kernels with 1 and then 2 workers (each evaluation a fresh sandboxed child)
and prints evaluations per minute and the share of each evaluation spent outside compiling and running
(process start, imports, I/O), for cold children (started when needed: the baseline) and warm spares
(started while the previous evaluation runs). Reference compiles are cached per task, so a warm-up pass fills that cache
first, as it would be in a long search.

    .venv/bin/python benchmarks/eval_throughput.py [--tasks softmax,layer_norm,...] [--rounds 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from storage.settings import load_settings
from tpu_runner.evaluation import EvalRequest, evaluate_many
from tpu_runner.reports import EvalResult

TASKS = Path(__file__).resolve().parent.parent / "tasks"
DEFAULT_TASKS = "softmax,layer_norm,rms_norm,fused_elementwise,cross_entropy,matmul_bf16"


def run(requests: list[EvalRequest], home: Path, workers: int, warm: bool = True) -> tuple[float, list[EvalResult]]:
    settings = load_settings({"KERNELBOT_HOME": str(home)})
    start = time.perf_counter()
    results = evaluate_many(requests, settings, workers=workers, warm_spares=warm)
    elapsed = time.perf_counter() - start
    bad = [r for r in results if not isinstance(r, EvalResult) or r.verdict != "ok"]
    if bad:
        raise SystemExit(f"benchmark candidates must all be ok: {bad}")
    return elapsed, [r for r in results if isinstance(r, EvalResult)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=DEFAULT_TASKS)
    parser.add_argument("--rounds", type=int, default=1, help="repeat the task list this many times")
    args = parser.parse_args()
    names = args.tasks.split(",") * args.rounds
    requests = [EvalRequest(TASKS / n, TASKS / n / "solutions" / "pallas.py", "v6e") for n in names]
    with tempfile.TemporaryDirectory(prefix="kb-bench-") as tmp:
        home = Path(tmp)
        warm, _ = run(requests[: len(set(names))], home, workers=2)
        print(f"warm-up (reference compiles cached): {warm:.1f} s for {len(set(names))} tasks")
        print(f"{'children':>8} {'workers':>7} {'evals':>5} {'wall s':>7} {'evals/min':>9} {'median eval s':>13} "
              f"{'overhead s':>10} {'overhead share':>14}")
        for warm, workers in ((False, 1), (True, 1), (False, 2), (True, 2)):
            elapsed, results = run(requests, home, workers, warm)
            totals = [r.timings["total"] for r in results]
            overheads = [r.timings["overhead"] for r in results]
            share = sum(overheads) / sum(totals)
            rate = 60 * len(results) / elapsed
            print(f"{'spare' if warm else 'cold':>8} {workers:>7} {len(results):>5} {elapsed:>7.1f} {rate:>9.1f} "
                  f"{statistics.median(totals):>13.2f} {statistics.median(overheads):>10.2f} {share:>14.0%}")
        stages = ("lower", "compile", "correctness", "performance", "profile")
        print("median seconds per stage (last run): " + ", ".join(
            f"{s} {statistics.median(r.timings.get(s, 0.0) for r in results):.2f}" for s in stages))


if __name__ == "__main__":
    main()
