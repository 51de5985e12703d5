"""What the offline brain finds with no network: its kernels, tuned by the search, against the XLA reference.

Tasks: every suite task the offline brain recognises, plus --random random epilogue-chain tasks at production
sizes (a matmul of --shape followed by 1-5 ops from tests/support/epilogue_tasks.py; checked for correctness on
small shapes). For each: the offline brain writes the seed and `kernelbot bench` runs the search (--strategy,
--budget evaluations). Printed per task: the seed's speedup, the best speedup, its fraction of the roofline and
the evaluations; then the geometric mean with regressions and failures floored at 1x and how many tasks are
faster than the reference. Every figure is `estimated` on a host without a TPU.

    .venv/bin/python benchmarks/offline_brain.py [--budget 6] [--random 3] [--shape 4096,8192,8192]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.epilogue_tasks import EPILOGUE, chain_task  # noqa: E402

SUITE = ["fused_elementwise", "softmax", "layer_norm", "rms_norm", "matmul_bf16", "matmul_bias_gelu",
         "matmul_softmax", "batched_matmul", "causal_attention", "gqa_attention"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=int, default=6)
    parser.add_argument("--random", type=int, default=3)
    parser.add_argument("--shape", default="4096,8192,8192")
    parser.add_argument("--strategy", default="beam")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    m, k, n = (int(x) for x in args.shape.split(","))
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="kb-offline-bench-") as tmp:
        suite = Path(tmp) / "suite"
        suite.mkdir()
        for name in SUITE:
            shutil.copytree(REPO / "tasks" / name, suite / name, ignore=shutil.ignore_patterns("solutions"))
        for i in range(args.random):
            chain = rng.sample(sorted(EPILOGUE), rng.randint(1, 5))
            dtype = "bfloat16" if i % 2 == 0 else "float32"
            chain_task(suite, f"random{i}_{dtype}_{'_'.join(chain)}", chain, dtype, m, k, n, test=(256, 512, 384))
        env = {**os.environ, "KERNELBOT_HOME": str(Path(tmp) / "home")}
        env.pop("ANTHROPIC_API_KEY", None)
        proc = subprocess.run([sys.executable, "-m", "bot.cli", "bench", "--suite", str(suite), "--brain", "offline",
                               "--strategy", args.strategy, "--budget", str(args.budget), "--json"],
                              capture_output=True, text=True, env=env, cwd=REPO)
        if proc.returncode != 0:
            sys.exit(f"bench failed:\n{proc.stderr[-3000:]}")
        report = json.loads(proc.stdout)
    print(f"offline brain + {args.strategy} search, {args.budget} evaluations per task (estimated on this host)")
    for e in report["tasks"]:
        if e.get("error"):
            print(f"  {e['task'][:48]:<48} not run: {e['error'][:100]}")
            continue
        seed = f"x{e['seed_speedup']:.2f}" if e.get("seed_speedup") else "not ok"
        best = f"x{e['speedup']:.2f}" if e.get("speedup") else "-"
        roof = f"{e['roofline_fraction']:.0%}" if e.get("roofline_fraction") is not None else "-"
        print(f"  {e['task'][:48]:<48} seed {seed:<7} best {best:<7} roofline {roof:<5} "
              f"{e['evaluations']} evaluations ({e.get('duplicates', 0)} duplicates skipped)")
    s = report["summary"]
    faster = sum(1 for e in report["tasks"] if e.get("verdict") == "ok" and (e.get("speedup") or 0) > 1)
    print(f"summary: {s['tasks']} tasks, {s['correct']} correct, geomean speedup x{s['geomean_speedup']:.2f} "
          f"(failures and regressions floored at 1x), {faster} faster than the reference, fast_2 {s['fast_2']:.0%}")


if __name__ == "__main__":
    main()
