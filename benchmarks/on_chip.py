"""The offline brain's first kernels measured on this host's TPU against XLA, with the static estimate beside each.

For every task of the suites (--suite, repeatable; default measured and tasks), the offline brain writes its first
kernel for the chip of this host; all are evaluated together (`evaluate_many`: the CPU stages of several run at
once, the chip takes them in turn), each checked at its production shapes on the chip and timed there against the
XLA reference, interleaved, from the profiler's device lane. Printed per task: the reference's measured time, the
verdict, the measured speedup with its spread, and the estimate beside it (and for a workload of
benchmarks/measured, XLA's time on v6e from shared/data, for scale); per suite: the ok count, the geometric mean
measured speedup (tasks without an ok kernel count as 1x), how many are faster beyond the spread, and the share
of estimates within 0.8-1.25x of the measured speedup. Needs a TPU host (`kernelbot doctor` says).

With --search N, each task whose first kernel is ok is then searched on the chip from it: a beam search of N
evaluations (the first kernel's own again among them: its figures in the search's own runs) over the kernel's
TUNABLE space, and the best kernel it found is printed and logged beside the first (`searched`: verdict, measured
speedup and spread, estimate, the strategies that led to it).

Tasks go in batches (--batch): the reference's outputs for a batch, then its evaluations, so a run cut short by a
time limit keeps every batch it finished in --log. With --resume, a task is not evaluated again when the log holds
it for the same kernel (the source's digest): a benchmark split across runs, or sessions, adds up. The log of the
runs behind docs/tpu-host.md's figures is benchmarks/on_chip_v5e.jsonl.

    .venv/bin/python benchmarks/on_chip.py [--suite measured --suite tasks] [--only NAME,NAME] [--workers 4]
                                           [--batch 4] [--json FILE] [--log FILE.jsonl [--resume]]
                                           [--time-budget SECONDS] [--search N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

os.environ["JAX_PLATFORMS"] = "cpu"  # this process never holds the chip: the evaluator's children do

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from storage.settings import Settings, load_settings  # noqa: E402
from tpu_runner.evaluation import EvalRequest, describe_tasks, evaluate_many  # noqa: E402
from tpu_runner.hardware import ChipSpec, get_chip  # noqa: E402
from tpu_runner.reports import EvalResult  # noqa: E402
from tpu_runner.tasks import TaskError, load_task  # noqa: E402

SUITES = {"measured": REPO / "benchmarks" / "measured", "tasks": REPO / "tasks"}
FAITHFUL = (0.8, 1.25)  # an estimate this close to the measured speedup (as a ratio) counts as faithful


def first_kernel(task_dir: Path, chip: ChipSpec, settings: Settings, out: Path) -> tuple[Path | None, str]:
    """The offline brain's first kernel for the task (its own choice of parameters), or why it writes none."""
    from agents.offline.brain import NotRecognised, offline_brain
    from agents.offline.params import choose

    try:
        brain = offline_brain(load_task(task_dir), chip, settings)
    except (TaskError, NotRecognised) as exc:
        return None, (str(exc).splitlines() or [type(exc).__name__])[0][:200]
    assert brain.spec is not None
    path = out / f"{task_dir.name}.py"
    path.write_text(brain.source(choose(brain.spec, chip)[0]))
    return path, ""


def _xla_v6e_ms(task_dir: Path) -> float | None:
    path = task_dir / "kernel_task.yaml"
    measured = (yaml.safe_load(path.read_text()) or {}).get("measured") if path.is_file() else None
    return (measured or {}).get("xla_ms")


def kernel_digest(path: Path | None) -> str | None:
    """Which kernel an entry is about: a logged result stands for the same code and parameters only (not the
    docstring, nor the TUNABLE space declared beside the values)."""
    from agents.offline.brain import kernel_code

    return hashlib.sha256(kernel_code(path.read_text()).encode()).hexdigest()[:16] if path is not None else None


def entry(task_dir: Path, why_none: str, result: EvalResult | Exception | None, kernel: str | None = None,
          memory_mib: int | None = None) -> dict:
    e: dict = {"task": task_dir.name, "kernel": kernel, "xla_v6e_ms": _xla_v6e_ms(task_dir),
               "memory_mib": memory_mib}  # the evaluation's memory limit (KERNELBOT_EVAL_MEMORY_MIB)
    if result is None:
        return {**e, "verdict": None, "error": f"no kernel: {why_none}"}
    if isinstance(result, Exception):
        return {**e, "verdict": None, "error": f"{type(result).__name__}: {str(result)[:200]}"}
    e.update(verdict=result.verdict, message=result.message, seconds=round(result.timings.get("total", 0.0), 1),
             timings={k: round(v, 2) for k, v in result.timings.items()},  # where an evaluation's time goes
             # differences the judge accepted while timing (the float64 truth, the task's sensitivity), and why
             accepted=[n for n in result.notes if n.startswith("while timing")],
             # the whole error (the message keeps its first 300 characters: 15p's cut off why no truth was made)
             detail=result.error.detail if result.error is not None else None)
    perf = result.performance
    if perf is not None:
        estimate = perf.detail.get("estimate") or {}
        e.update(method=perf.method, speedup=perf.speedup, band=perf.band, reference_ms=perf.reference,
                 candidate_ms=perf.candidate, device=perf.detail.get("device"),
                 iterations=perf.detail.get("iterations"), estimated_speedup=estimate.get("speedup"),
                 roofline_fraction=perf.roofline_fraction)
    return e


def searched(task_dir: Path, seed: Path, settings: Settings, chip: ChipSpec, budget: int, workers: int) -> dict:
    """A beam search of `budget` evaluations from the first kernel (`seed`) on this host's chip, in the run's own
    home (its reference outputs are reused) and database: the best kernel's figures, as `entry` gives the first's."""
    from sqlmodel import Session

    from agents.local import run_until_settled
    from agents.search import NODE_JOB, load_graph, outcome, start_search
    from agents.search_decide import SearchConfig
    from storage.connect import open_database

    engine = open_database(settings)
    t0 = time.perf_counter()
    with Session(engine) as s, s.begin():
        session_id = start_search(s, task=load_task(task_dir), target=chip.name, seed_code=seed.read_text(),
                                  brain=None, config=SearchConfig("beam", budget=budget, width=workers, seed=1))
    run_until_settled(engine, settings, session_id, kinds=(NODE_JOB,), workers=workers, poll_seconds=0.2)
    with Session(engine) as s:
        result = outcome(s, session_id)
        _, _, evaluations = load_graph(s, session_id)
    best = evaluations.get(result.best_candidate_id) if result.best_candidate_id is not None else None
    perf = ((best.result or {}).get("performance") or {}) if best else {}
    estimate = (perf.get("detail") or {}).get("estimate") or {}
    return {"verdict": result.verdict, "method": result.method, "speedup": result.speedup, "band": result.band,
            "reference_ms": result.reference_ms, "candidate_ms": result.kernel_ms,
            "estimated_speedup": estimate.get("speedup"), "evaluations": result.evaluations, "budget": budget,
            "path": result.best_strategy_path, "seconds": round(time.perf_counter() - t0, 1)}


def _ok(e: dict) -> bool:
    return e.get("verdict") == "ok" and e.get("method") == "measured" and bool(e.get("speedup"))


def summary(entries: list[dict]) -> dict:
    floored = [e["speedup"] if _ok(e) else 1.0 for e in entries]
    geomean = math.exp(sum(math.log(max(s, 1e-9)) for s in floored) / len(floored)) if floored else 1.0
    estimated = [e for e in entries if _ok(e) and e.get("estimated_speedup")]
    faithful = [e for e in estimated if FAITHFUL[0] <= e["estimated_speedup"] / e["speedup"] <= FAITHFUL[1]]
    # With searches: each task's best of its first and its searched kernel (a task not searched keeps its first).
    best = [max(f, e["searched"]["speedup"]) if _ok(e) and _ok(e.get("searched") or {}) else f
            for f, e in zip(floored, entries, strict=True)]
    searched_geomean = math.exp(sum(math.log(max(s, 1e-9)) for s in best) / len(best)) if best else 1.0
    return {"tasks": len(entries), "ok": sum(_ok(e) for e in entries),
            "faster": sum(_ok(e) and e["band"] and e["band"][0] > 1.0 for e in entries),
            "geomean_measured": geomean, "estimates": len(estimated), "faithful_estimates": len(faithful),
            "searched": sum(_ok(e.get("searched") or {}) for e in entries), "geomean_searched": searched_geomean}


def line(e: dict) -> str:
    name = f"{e['task'][:44]:<44}"
    if e.get("error"):
        return f"  {name} {e['error'][:160]}"
    if not _ok(e):
        return f"  {name} {e.get('message', '')[:170]}"
    low, high = e["band"]
    spread = f"±{(high / low) ** 0.5 - 1:.0%}"
    estimated = f"estimated x{e['estimated_speedup']:.2f}" if e.get("estimated_speedup") else "no estimate"
    v6e = f"(XLA on v6e {e['xla_v6e_ms']:.3g} ms)" if e.get("xla_v6e_ms") else ""
    found = e.get("searched") or {}
    search = ""
    if _ok(found):
        s_low, s_high = found["band"] or (found["speedup"], found["speedup"])
        search = (f"\n  {'':<44}     searched ({found['evaluations']} of {found['budget']} evaluations): kernel "
                  f"{found['candidate_ms']:.4g} ms x{found['speedup']:.2f} ±{(s_high / s_low) ** 0.5 - 1:.0%} "
                  f"measured, by {' > '.join(found['path']) or 'the first kernel itself'}")
    elif found:
        search = f"\n  {'':<44}     searched: {found.get('verdict')} (no ok kernel beyond the first)"
    return (f"  {name} ok  XLA {e['reference_ms']:.4g} ms  kernel {e['candidate_ms']:.4g} ms  "
            f"x{e['speedup']:.2f} {spread:<5} measured, {estimated:<16} {v6e}{search}")


def logged(log: Path | None, suite: str) -> dict[str, dict]:
    """The entries of `suite` an earlier run appended to `log`, by task (the last one of each)."""
    if log is None or not log.is_file():
        return {}
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return {e["task"]: {k: v for k, v in e.items() if k != "suite"} for e in entries if e.get("suite") == suite}


def suite_tasks(suite: Path, only: list[str]) -> list[Path]:
    every = [d for d in sorted(suite.iterdir()) if (d / "kernel_task.yaml").is_file() or (d / "baseline.py").is_file()]
    return [d for d in every if not only or d.name in only]


def run_suite(name: str, suite: Path, only: list[str], chip: ChipSpec, settings: Settings, root: Path,
              workers: int, batch: int, log: Path | None = None, resume: bool = False,
              deadline: float = math.inf, search: int = 0) -> list[dict]:
    every = suite_tasks(suite, only)
    out = root / f"kernels-{name}"
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:  # the brain reads each task in a child of its own
        written = dict(zip(every, pool.map(lambda d: first_kernel(d, chip, settings, out), every), strict=True))
    print(f"{name}: the offline brain wrote {sum(p is not None for p, _ in written.values())} kernels for "
          f"{len(every)} tasks in {time.perf_counter() - t0:.0f} s", flush=True)
    digests = {d: kernel_digest(p) for d, (p, _) in written.items()}
    earlier = {t: e for t, e in (logged(log, name) if resume else {}).items()
               if e.get("kernel") and e["kernel"] == digests.get(suite / t)}
    if earlier:
        print(f"{name}: {len(earlier)} kernels evaluated by an earlier run ({log}), not again", flush=True)
    entries = {d: entry(d, why, None) for d, (p, why) in written.items() if p is None}
    todo = [d for d in every if d.name not in earlier and written[d][0] is not None]
    t0 = time.perf_counter()

    def record(e: dict) -> None:
        print(f"{line(e)}  [{time.perf_counter() - t0:.0f} s]", flush=True)
        if log is not None:  # each entry as it comes: a run cut short by a time limit keeps what it finished
            with log.open("a") as f:
                f.write(json.dumps({"suite": name, **e}, default=str) + "\n")

    def done(request: EvalRequest, result: EvalResult | Exception) -> None:
        entries[request.task] = entry(request.task, "", result, digests[request.task], settings.limits.memory_mib)
        record(entries[request.task])

    longest = 0.0  # the longest batch so far: the next one starts only if one as long ends before the deadline
    for first in range(0, len(todo), batch):
        if time.monotonic() + longest > deadline:
            print(f"{name}: {len(todo) - first} kernels left for a later run (--resume): the time budget is spent",
                  flush=True)
            break
        started = time.monotonic()
        part = todo[first:first + batch]
        requests = [EvalRequest(d, written[d][0], chip.name) for d in part]
        t1 = time.perf_counter()
        failed = describe_tasks(requests, settings)  # each evaluation of a task that failed here tries and says why
        for task_id, why in failed.items():
            print(f"  reference outputs of {task_id} not computed ahead: {why.splitlines()[0][:200]}", flush=True)
        print(f"{name}: the reference's outputs at production shapes for {len(requests)} tasks computed on the chip "
              f"in {time.perf_counter() - t1:.0f} s{f' ({len(failed)} failed)' if failed else ''}", flush=True)
        evaluate_many(requests, settings, workers=workers, on_done=done, described=True)
        for d in part if search else []:  # after the batch's first kernels: the chip takes one thing at a time
            if _ok(entries[d]):
                entries[d] = {**entries[d], "searched": searched(d, written[d][0], settings, chip, search, workers)}
                record(entries[d])
        longest = max(longest, time.monotonic() - started)
    for d in every if search else []:  # first kernels an earlier run logged ok, not searched as far yet
        e = earlier.get(d.name)
        if e is not None and _ok(e) and (e.get("searched") or {}).get("budget", 0) < search:
            if time.monotonic() > deadline:
                break
            earlier[d.name] = {**e, "searched": searched(d, written[d][0], settings, chip, search, workers)}
            record(earlier[d.name])
    print(f"{name}: evaluated {len(todo)} kernels in {time.perf_counter() - t0:.0f} s", flush=True)
    # A task left for a later run (the time budget) is not in this run's figures: the summary says how many.
    return [earlier[d.name] if d.name in earlier else entries[d] for d in every if d.name in earlier or d in entries]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", action="append", choices=list(SUITES))
    parser.add_argument("--only", default="", help="comma-separated task names")
    parser.add_argument("--workers", type=int, default=4, help="evaluations at once (the chip takes them in turn)")
    parser.add_argument("--batch", type=int, default=4, help="tasks whose reference outputs are made, then "
                        "evaluated, before the next batch's")
    parser.add_argument("--time-budget", type=float, default=math.inf, help="seconds: no batch is started that "
                        "would end after them, judged by the longest batch so far (a time-limited run on the host)")
    parser.add_argument("--search", type=int, default=0, metavar="N", help="search each task whose first kernel is "
                        "ok on the chip from it, N evaluations (beam over its TUNABLE space), and show the best beside")
    parser.add_argument("--home", type=Path, help="KERNELBOT_HOME to keep (default: a temporary one)")
    parser.add_argument("--json", type=Path, help="also write every entry and summary here")
    parser.add_argument("--log", type=Path, help="append each entry here as a JSON line the moment it is done")
    parser.add_argument("--resume", action="store_true", help="with --log: kernels it holds already are not evaluated "
                        "again, and count in the summary (one benchmark split across several time-limited runs)")
    args = parser.parse_args()
    only = [n for n in args.only.split(",") if n]
    deadline = time.monotonic() + args.time_budget
    report = {}
    with tempfile.TemporaryDirectory(prefix="kb-on-chip-") as tmp:
        home = args.home or Path(tmp) / "home"
        settings = load_settings({**os.environ, "KERNELBOT_HOME": str(home)})
        if not settings.host_target or not settings.on_chip(settings.host_target):
            sys.exit("benchmarks/on_chip.py needs a TPU host with KERNELBOT_TPU=auto (kernelbot doctor says)")
        chip = get_chip(settings.host_target)
        settings = replace(settings, default_target=chip.name)
        for name in args.suite or ["measured", "tasks"]:
            entries = run_suite(name, SUITES[name], only, chip, settings, Path(tmp), args.workers, args.batch,
                                args.log, args.resume, deadline, args.search)
            s = summary(entries)
            report[name] = {"tasks": entries, "summary": s}
            left = len(suite_tasks(SUITES[name], only)) - s["tasks"]
            print(f"{name} summary (measured on {chip.device_kind}): {s['tasks']} tasks"
                  f"{f' ({left} not evaluated yet)' if left > 0 else ''}, {s['ok']} with an ok kernel, "
                  f"{s['faster']} faster than XLA beyond the spread, geomean x{s['geomean_measured']:.2f} measured "
                  f"(no ok kernel counts as x1); estimates within {FAITHFUL[0]}-{FAITHFUL[1]}x of the measured "
                  f"speedup: {s['faithful_estimates']} of {s['estimates']}"
                  + (f"; searched {s['searched']}, geomean x{s['geomean_searched']:.2f} with each task's better kernel"
                     if s["searched"] else "") + "\n", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
