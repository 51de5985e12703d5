"""What the offline brain finds with no network: its kernels, tuned by the search, against the XLA reference.

Suites (--suite, repeatable; default measured and tasks):
- measured: the 23 workloads of benchmarks/measured (XLA's device time on TPU v6e beside each task);
- tasks: every task of the repo's tasks/ (those the offline brain does not recognise count as failures);
- random: --random epilogue-chain tasks at production sizes (a matmul of --shape followed by 1-5 ops from
  tests/support/epilogue_tasks.py; checked for correctness on small shapes).
For each task the offline brain writes the seed and `kernelbot bench` runs the search (--strategy, --budget
evaluations). Printed per task: the verdict, the best speedup over the reference with its likely range (the
band, from the estimate's measured fidelity), for a measured workload the kernel's estimate against XLA's real
time, the fraction of the roofline and the evaluations; or why no kernel was written. Per suite: how many got an
ok kernel, how many are faster with the whole band above 1, and the geometric mean speedup with failures and
regressions floored at 1x. Every candidate figure is `estimated` on a host without a TPU.

    .venv/bin/python benchmarks/offline_brain.py [--suite measured --suite tasks] [--budget 4] [--only NAME,NAME]
                                                 [--random 3] [--shape 4096,8192,8192] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.epilogue_tasks import EPILOGUE, chain_task  # noqa: E402

SUITES = {"measured": REPO / "benchmarks" / "measured", "tasks": REPO / "tasks"}


def _random_suite(root: Path, count: int, shape: str, seed: int) -> Path:
    m, k, n = (int(x) for x in shape.split(","))
    rng = random.Random(seed)
    suite = root / "random"
    suite.mkdir()
    for i in range(count):
        chain = rng.sample(sorted(EPILOGUE), rng.randint(1, 5))
        dtype = "bfloat16" if i % 2 == 0 else "float32"
        chain_task(suite, f"random{i}_{dtype}_{'_'.join(chain)}", chain, dtype, m, k, n, test=(256, 512, 384))
    return suite


def _bench(suite: Path, only: list[str], args: argparse.Namespace, home: Path) -> list[dict]:
    env = {**os.environ, "KERNELBOT_HOME": str(home), "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    env.pop("ANTHROPIC_API_KEY", None)
    command = [sys.executable, "-m", "bot.cli", "bench", "--suite", str(suite), "--brain", "offline",
               "--strategy", args.strategy, "--budget", str(args.budget), "--target", "v6e", "--json"]
    for name in only:
        command += ["--only", name]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"bench failed on {suite}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)["tasks"]


def _measured_ms(suite: Path, task: str) -> float | None:
    path = suite / task / "kernel_task.yaml"
    if not path.is_file():
        return None
    measured = (yaml.safe_load(path.read_text()) or {}).get("measured") or {}
    return measured.get("xla_ms")


def _ok(e: dict) -> bool:
    return e.get("verdict") == "ok" and bool(e.get("speedup"))


def _clear_gain(e: dict) -> bool:
    band = e.get("band")
    return _ok(e) and bool(band) and band[0] > 1.0


def summary(entries: list[dict]) -> dict:
    """ok count, clear gains (the whole band above 1), geomean with failures and regressions floored at 1x."""
    floored = [max(1.0, e["speedup"]) if _ok(e) else 1.0 for e in entries]
    geomean = math.exp(sum(math.log(s) for s in floored) / len(floored)) if floored else 1.0
    return {"tasks": len(entries), "ok": sum(_ok(e) for e in entries),
            "clear_gains": sum(_clear_gain(e) for e in entries), "geomean": geomean}


def _line(e: dict, xla_ms: float | None) -> str:
    name = f"{e['task'][:44]:<44}"
    if e.get("error"):
        return f"  {name} no kernel: {e['error'][:150]}"
    if not _ok(e):
        return f"  {name} {e.get('verdict') or 'failed'}: no ok kernel in {e.get('evaluations', 0)} evaluations"
    band = e.get("band")
    speed = f"x{e['speedup']:.2f}" + (f" (x{band[0]:.2f}-x{band[1]:.2f})" if band else "")
    vs_xla = f"vs measured XLA x{xla_ms / e['kernel_ms']:.2f}" if xla_ms and e.get("kernel_ms") else ""
    roof = f"roofline {e['roofline_fraction']:.0%}" if e.get("roofline_fraction") is not None else ""
    gain = "faster" if _clear_gain(e) else "no clear gain"
    return f"  {name} ok {speed:<22} {gain:<13} {vs_xla:<24} {roof:<13} {e.get('evaluations', 0)} evaluations"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", action="append", choices=[*SUITES, "random"])
    parser.add_argument("--budget", type=int, default=4)
    parser.add_argument("--only", default="", help="comma-separated task names")
    parser.add_argument("--random", type=int, default=3)
    parser.add_argument("--shape", default="4096,8192,8192")
    parser.add_argument("--strategy", default="beam")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write every entry and summary here")
    args = parser.parse_args()
    only = [n for n in args.only.split(",") if n]
    report = {}
    with tempfile.TemporaryDirectory(prefix="kb-offline-bench-") as tmp:
        home = Path(tmp) / "home"
        for name in args.suite or ["measured", "tasks"]:
            suite = _random_suite(Path(tmp), args.random, args.shape, args.seed) if name == "random" \
                else SUITES[name]
            entries = _bench(suite, only, args, home)
            s = summary(entries)
            report[name] = {"tasks": entries, "summary": s}
            print(f"{name}: offline brain + {args.strategy} search, {args.budget} evaluations per task "
                  "(estimated on this host)")
            for e in entries:
                print(_line(e, _measured_ms(suite, e["task"])))
            print(f"{name} summary: {s['tasks']} tasks, {s['ok']} with an ok kernel, {s['clear_gains']} faster "
                  f"(band above 1), geomean x{s['geomean']:.2f} (failures and regressions floored at 1x)\n",
                  flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
