"""How many evaluations the search needs to reach its best kernel, against random sampling of the same space at
the same budget; and how much time the paradigm itself adds per evaluation.

For each task (a name in tasks/ or a task folder, e.g. benchmarks/measured/39k_Conv2d_GELU_GlobalAvgPool; seeded
with its solutions/pallas.py, or with the offline brain's first kernel when it has none or with --seed offline;
both methods explore the seed's TUNABLE space): one beam search
(parametric strategies from the library, no brain), one hybrid search (a third of the budget at random, then
beam) and --random-seeds runs of the autotuner (`tune`: uniform
random points of the space), each with --budget evaluations, on a fresh SQLite database with an in-process runner
of --workers. Per run: the best speedup found and the evaluation (1-based, in the order they were recorded) at
which it was first reached; candidates stopped at the IR gate as duplicates of an evaluated program.

Overhead: for every evaluated node, the node job's wall time minus the evaluation's own time (static check,
sandboxed child, chart) = what the search adds inside the job (IR claim, recording, top-up); and the search's
wall time per evaluation against the mean evaluation time divided by the workers.

On a TPU host the target is the host's chip (--target to choose another): every evaluation is then measured on
the chip, and each run reports its best kernel's measured time; the random runs' mean over their seeds is printed
beside the search's.

    .venv/bin/python benchmarks/search_vs_random.py [--tasks matmul_bf16,causal_attention] [--budget 10]
                                                    [--seed solution|offline] [--target v5e]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sqlmodel import Session, col, select

# This process never holds a TPU: the evaluator's children do, one at a time.
os.environ["JAX_PLATFORMS"] = "cpu"

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agents import tunable  # noqa: E402
from agents.local import run_until_settled  # noqa: E402
from agents.search import NODE_JOB, load_graph, outcome, start_search  # noqa: E402
from agents.search_decide import SearchConfig  # noqa: E402
from storage.connect import open_database  # noqa: E402
from storage.models import Evaluation, Job  # noqa: E402
from storage.settings import load_settings  # noqa: E402
from tpu_runner.hardware import get_chip  # noqa: E402
from tpu_runner.tasks import Task, load_task  # noqa: E402


def task_dir(name: str) -> Path:
    """A task by its name in tasks/ or by its folder."""
    return REPO / "tasks" / name if (REPO / "tasks" / name).is_dir() else Path(name).resolve()


def seed_kernel(task: Task, prefer: str, root: Path, target: str) -> tuple[str, str]:
    """The seed both methods start from and where it came from: the task's own solution, or the offline brain's
    first kernel (its plan's parameters, with the TUNABLE space it declares)."""
    own = task.path / "solutions" / "pallas.py"
    if prefer == "solution" and own.is_file():
        return own.read_text(), "solutions/pallas.py"
    from agents.offline.brain import offline_brain
    from agents.offline.params import choose

    chip = get_chip(target)
    brain = offline_brain(task, chip, load_settings({**os.environ, "KERNELBOT_HOME": str(root / "reading")}))
    assert brain.spec is not None
    return brain.source(choose(brain.spec, chip)[0]), "the offline brain"


def run_one(task: Task, seed_code: str, strategy: str, budget: int, workers: int, seed: int, root: Path,
            target: str) -> dict:
    task_name = task.path.name
    home = root / f"{task_name}-{strategy}-{seed}"
    # The host's own environment (its TPU, KERNELBOT_TPU) with this run's home and workers.
    settings = load_settings({**os.environ, "KERNELBOT_HOME": str(home), "KERNELBOT_EVAL_WORKERS": str(workers)})
    engine = open_database(settings)
    started = time.perf_counter()
    with Session(engine) as s, s.begin():
        session_id = start_search(s, task=task, target=target, seed_code=seed_code, brain=None,
                                  config=SearchConfig(strategy, budget=budget, width=workers, seed=seed))
    run_until_settled(engine, settings, session_id, kinds=(NODE_JOB,), workers=workers, poll_seconds=0.2)
    wall = time.perf_counter() - started
    with Session(engine) as s:
        result = outcome(s, session_id)
        graph, candidates, _ = load_graph(s, session_id)
        evals = s.exec(select(Evaluation).where(col(Evaluation.candidate_id).in_(list(candidates)))
                       .order_by(col(Evaluation.id))).all()
        jobs = {j.id: j for j in s.exec(select(Job).where(Job.session_id == session_id)).all()}
    best = result.speedup or 0.0
    reached = next((i + 1 for i, e in enumerate(evals) if e.verdict == "ok" and e.speedup is not None
                    and e.speedup >= best - 1e-9), None)
    eval_seconds, added = [], []
    for e in evals:
        total = (e.result or {}).get("timings", {}).get("total")
        job = jobs.get(e.job_id) if e.job_id else None
        if total is None or job is None or job.started_at is None or job.finished_at is None:
            continue
        eval_seconds.append(total)
        added.append(job.finished_at - job.started_at - total)
    return {"task": task_name, "method": strategy if strategy != "tune" else f"random#{seed}", "best": best,
            "reached_at": reached, "evaluations": len(evals), "duplicates": result.duplicates,
            "ok": sum(e.verdict == "ok" for e in evals), "wall": wall,
            "eval_mean": statistics.fmean(eval_seconds) if eval_seconds else float("nan"),
            "added_mean": statistics.fmean(added) if added else float("nan"), "workers": workers,
            "best_ms": result.kernel_ms if result.best_candidate_id else None, "method_of_best": result.method}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="matmul_bf16,matmul_bias_gelu,causal_attention")
    parser.add_argument("--budget", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--random-seeds", type=int, default=2)
    parser.add_argument("--first-random-seed", type=int, default=1, help="the first random run's seed (a run split "
                        "across time-limited calls goes on where the last one stopped)")
    parser.add_argument("--methods", default="beam,hybrid,random", help="which of beam, hybrid, random to run")
    parser.add_argument("--target", help="the chip to evaluate for (default: this host's TPU, else v6e)")
    parser.add_argument("--seed", choices=("solution", "offline"), default="solution",
                        help="seed with the task's solutions/pallas.py (the offline brain's kernel when it has "
                             "none) or always with the offline brain's kernel")
    args = parser.parse_args()
    host = load_settings(dict(os.environ))
    target = args.target or (host.host_target if host.host_target and host.on_chip(host.host_target) else "v6e")
    print(f"target {target}: {'measured on this host' if host.on_chip(target) else 'estimated'}", flush=True)
    rows = []
    names = []
    with tempfile.TemporaryDirectory(prefix="kb-search-bench-") as tmp:
        for name in args.tasks.split(","):
            task = load_task(task_dir(name))
            seed_code, origin = seed_kernel(task, args.seed, Path(tmp), target)
            space = tunable.space(seed_code)
            points = tunable.size(space)
            names.append(task.path.name)
            print(f"{task.path.name}: seed from {origin}, a TUNABLE space of {len(space)} parameters, "
                  f"{points} points", flush=True)
            methods = args.methods.split(",")
            runs = [(m, 1) for m in ("beam", "hybrid") if m in methods]
            first = args.first_random_seed
            runs += [("tune", s) for s in range(first, first + args.random_seeds)] if "random" in methods else []
            for strategy, seed in runs:
                row = run_one(task, seed_code, strategy, args.budget, args.workers, seed, Path(tmp), target)
                rows.append(row)
                timed = f" ({row['method_of_best']} {row['best_ms']:.4g} ms)" if row["best_ms"] else ""
                print(f"{row['task']:<18} {row['method']:<10} best x{row['best']:.3f}{timed} reached at evaluation "
                      f"{row['reached_at']}/{row['evaluations']} ({row['ok']} ok, {row['duplicates']} duplicates "
                      f"skipped); {row['wall']:.0f} s wall, evaluation {row['eval_mean']:.1f} s, search adds "
                      f"{row['added_mean'] * 1000:.0f} ms per evaluation", flush=True)
    print(f"\nsummary (budget {args.budget} evaluations, {args.workers} workers)")
    for task in names:
        mine = [r for r in rows if r["task"] == task]
        parts = [f"{r['method']} x{r['best']:.3f} at {r['reached_at']}" for r in mine]
        drawn = [r for r in mine if r["method"].startswith("random#")]
        if drawn:
            times = [r["best_ms"] for r in drawn if r["best_ms"]]
            parts.append(f"random mean x{statistics.fmean(r['best'] for r in drawn):.3f}"
                         + (f" ({statistics.fmean(times):.4g} ms)" if times else ""))
        print(f"  {task:<18} " + "; ".join(parts))
    added = [r["added_mean"] for r in rows if r["added_mean"] == r["added_mean"]]
    evals = [r["eval_mean"] for r in rows if r["eval_mean"] == r["eval_mean"]]
    per_eval_wall = [r["wall"] / max(1, r["evaluations"] + r["duplicates"]) for r in rows]
    print(f"  overhead: the search adds {statistics.fmean(added) * 1000:.0f} ms per evaluation inside its job, "
          f"against {statistics.fmean(evals):.1f} s for the evaluation itself "
          f"({statistics.fmean(added) / statistics.fmean(evals):.1%}); wall time per candidate "
          f"{statistics.fmean(per_eval_wall):.1f} s with {args.workers} workers")


if __name__ == "__main__":
    main()
