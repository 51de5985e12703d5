"""Terminal rendering: pure functions from results to rich renderables."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from bot.speedup import no_clear_gain, outcome_speedup, speedup_text
from storage.runners import DEAD_AFTER_SECONDS
from tpu_runner.reports import EvalResult
from tpu_runner.timing import describe_speedup

STAGE_LABELS = {
    "static": "static check", "load": "loading the task", "lower": "lowering for TPU",
    "compile": "compiling with libtpu", "reference": "compiling the reference",
    "correctness": "checking correctness (TPU interpret mode)", "performance": "estimating performance",
    "profile": "profiling",
}
VERDICT_STYLE = {"ok": "green", "unverified": "yellow"}


_SHORT_DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int32": "i32", "int8": "i8", "bool": "b"}


def _short(configuration: str) -> str:
    for long, short in _SHORT_DTYPES.items():
        configuration = configuration.replace(f"{long}[", f"{short}[")
    return configuration


def tasks_table(infos: Sequence[Any], target: str) -> Table:
    table = Table(title=f"tasks (roofline on {target})", show_lines=False, pad_edge=False)
    table.add_column("task / production inputs", overflow="fold", ratio=1)
    for col in ("GFLOP", "XLA MB", "min MB", "roofline"):
        table.add_column(col, no_wrap=True, justify="right")
    for col in ("bound", "test"):
        table.add_column(col, no_wrap=True)
    for i in infos:
        inputs = _short("; ".join(i.configurations)).replace(", ", " ")
        table.add_row(Text.assemble((i.task_id, "bold"), "\n", (inputs, "dim")), f"{i.flops / 1e9:.3g}",
                      f"{i.bytes / 1e6:.0f}", f"{i.compulsory_bytes / 1e6:.0f}", f"{i.roofline_ms:.3g} ms", i.bound,
                      "yes" if i.has_test_inputs else "derived")
    return table


def _relative(path: Path, folder: Path) -> str:
    return str(path.relative_to(folder)) if path.is_relative_to(folder) else str(path)


def result_panel(result: EvalResult) -> Panel:
    style = VERDICT_STYLE.get(result.verdict, "red")
    rows = Table.grid(padding=(0, 2))
    rows.add_column(style="bold", no_wrap=True)
    rows.add_column(overflow="fold")
    rows.add_row("verdict", Text(f"{result.verdict} (stage: {result.stage})", style=style))
    rows.add_row("message", result.message)
    if result.error:
        where = f" at line {result.error.line}" if result.error.line else ""
        rows.add_row("error", f"{result.error.kind}{where}: {result.error.detail[:1200]}")
    if result.correctness:
        c = result.correctness
        err = f", max abs err {c.max_abs_err:.3g}" if c.max_abs_err is not None else ""
        rows.add_row("correctness", f"{c.status}: {sum(x.status == 'passed' for x in c.cases)} cases passed{err}")
    p = result.performance
    if p:
        rows.add_row("performance", f"{p.method}: candidate {p.candidate:.4g} {p.unit}, reference {p.reference:.4g} "
                     f"{p.unit}, {p.roofline_fraction or 0:.0%} of roofline "
                     f"({p.roofline_ms:.4g} {p.unit}, {p.bound}-bound)")
        rows.add_row("speedup", Text(describe_speedup(p), style="yellow" if no_clear_gain(p.band) else ""))
        for flag in p.flags:
            rows.add_row("flag", Text(flag, style="yellow"))
    if result.profile:
        rows.add_row("profile", result.profile["summary"])
    for note in result.notes:
        rows.add_row("note", note)
    if result.artifacts:
        folder = Path(result.artifacts["result"]).parent
        rows.add_row("artifacts", str(folder))
        rows.add_row("", ", ".join(f"{name}: {_relative(Path(path), folder)}" for name, path in
                                   result.artifacts.items() if name != "result"))
    if result.timings:
        rows.add_row("time", f"{result.timings.get('total', 0):.1f} s total, "
                     f"{result.timings.get('overhead', 0):.1f} s outside compiling and running")
    return Panel(Group(rows), title=f"{result.task} on {result.target} ({result.host})", border_style=style)


def job_row(job: Any, evaluation_ids: list[int], runner_names: dict[str, str] | None = None) -> dict[str, Any]:
    """A job as plain data; `runner` is the runner's id, `runner_name` its name where known."""
    result = job.result or {}
    return {"id": job.id, "kind": job.kind, "status": job.status, "attempts": job.attempts,
            "max_attempts": job.max_attempts, "runner": job.runner_id,
            "runner_name": (runner_names or {}).get(job.runner_id or "", job.runner_id), "target": job.target,
            "evaluation_ids": evaluation_ids, "error": job.last_error, "created_at": job.created_at,
            "started_at": job.started_at, "finished_at": job.finished_at, "verdict": result.get("verdict"),
            "speedup": result.get("speedup"), "method": result.get("method"), "result": job.result,
            "after_job": (job.payload or {}).get("after_job"), "payload": job.payload}


def verdict_phrase(verdict: str, stage: str | None, kind: str | None) -> str:
    """`compile_error at compile: vmem_oom`, or `ok` for a finished one."""
    return f"{verdict}" + (f" at {stage}" if stage and stage != "done" else "") + (f": {kind}" if kind else "")


def job_outcome(row: dict[str, Any]) -> str:
    """A job's outcome in a few words: its verdict and speedup, what it decides, where its follow-ups went, or its
    error."""
    result = row.get("result") or {}
    parts = [verdict_phrase(result["verdict"], result.get("stage"), result.get("error_kind"))] \
        if result.get("verdict") else []
    if result.get("speedup"):
        parts.append(f"x{result['speedup']:.2f} {result.get('method') or ''}".strip())
    if row.get("after_job"):
        parts.append(f"decides job {row['after_job']}")
    parts += result.get("follow_ups") or []
    if row.get("error"):  # a done job's error is an earlier attempt's
        parts.append(("earlier attempt: " if row.get("status") == "done" else "") + str(row["error"]))
    return "; ".join(parts)


def jobs_table(rows: Sequence[dict[str, Any]]) -> Table:
    table = Table(title="jobs")
    for col in ("id", "kind", "status", "tries", "runner"):
        table.add_column(col, no_wrap=True)
    table.add_column("outcome", overflow="fold", ratio=1)
    for r in rows:
        outcome = job_outcome(r)
        table.add_row(str(r["id"]), r["kind"], r["status"], f"{r['attempts']}/{r['max_attempts']}",
                      r["runner_name"] or "-", outcome if len(outcome) <= 90 else outcome[:89] + "…")
    return table


def job_detail(row: dict[str, Any], evaluations: Sequence[dict[str, Any]]) -> str:
    """`kernelbot job ID`: the job, its whole outcome, each evaluation's message and where its files are."""
    lines = [f"job {row['id']} ({row['kind']}, target {row['target'] or 'any'}): {row['status']}, attempt "
             f"{row['attempts']} of {row['max_attempts']}, runner {row['runner_name'] or '-'}"]
    payload = row.get("payload") or {}
    for key in ("task_dir", "kernel_path"):
        if payload.get(key):
            lines.append(f"  {key.split('_')[0]}: {payload[key]}")
    if job_outcome(row):
        lines.append(f"  outcome: {job_outcome(row)}")
    for e in evaluations:
        result = e.get("result") or {}
        lines.append(f"  evaluation {e['id']}: {result.get('message') or e.get('verdict')}")
        error = result.get("error") or {}
        if error.get("detail"):
            lines.append(f"    {error['kind']}: {error['detail']}")
        for name, path in sorted((result.get("artifacts") or {}).items()):
            lines.append(f"    {name}: {path}")
    return "\n".join(lines)


def runner_row(runner: Any, *, at: float) -> dict[str, Any]:
    """A runner as plain data, its heartbeat age measured at time `at`."""
    return {"id": runner.id, "name": runner.name, "host": runner.host, "status": runner.status,
            "hardware": runner.hardware, "targets": runner.targets, "kinds": runner.kinds,
            "concurrency": runner.concurrency, "heartbeat_age_seconds": round(at - runner.heartbeat_at, 1),
            "current_jobs": runner.current_jobs or []}


def runners_table(rows: Sequence[dict[str, Any]]) -> Table:
    table = Table(title="runners")
    for col in ("name", "host", "status", "hardware", "targets", "heartbeat", "jobs"):
        table.add_column(col, overflow="fold")
    for r in rows:
        hw = r["hardware"] or {}
        chips = f"TPU {hw['tpu']} ({hw.get('device_kind', '')})" if hw.get("tpu") else "CPU only"
        status = r["status"]
        if status == "active" and r["heartbeat_age_seconds"] > DEAD_AFTER_SECONDS:  # no live runner reaped it yet
            status = "silent: presumed dead"
        table.add_row(r["name"], r["host"], status, f"{chips} ({hw.get('cpus', '?')} cpus)",
                      ", ".join(r["targets"] or []), f"{r['heartbeat_age_seconds']:.0f} s ago",
                      ", ".join(map(str, r["current_jobs"])) or "-")
    return table


def search_progress_line(session_id: str, graph: Any, budget: int) -> str:
    """One line of a running search: evaluations against the budget, what is in flight, the best so far."""
    best = graph.best()
    duplicates = sum(n.state == "duplicate" for n in graph.nodes)
    failed = sum(n.state == "evaluated" and n.score is None and not n.infeasible for n in graph.nodes)
    beyond = f", {graph.infeasible} beyond the chip's VMEM (not counted)" if graph.infeasible else ""
    best_text = f"best x{best.score:.2f} (#{best.id} {best.strategy})" if best else "no ok candidate yet"
    return (f"search {session_id}: {graph.evaluations}/{budget} evaluations, {len(graph.pending)} in flight, "
            f"{duplicates} duplicates skipped, {failed} failed{beyond}; {best_text}")


COMPILED_VERDICTS = ("ok", "unverified", "incorrect")


def bench_summary(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The paper's figures over a suite: how many compiled and were correct, the geometric mean speedup with
    failures and regressions floored at 1x, and fast_p = the fraction of tasks correct and faster than p x."""
    n = len(entries)

    def compiled(e: dict[str, Any]) -> bool:
        return bool(e["compiled"]) if "compiled" in e else e.get("verdict") in COMPILED_VERDICTS

    def correct(e: dict[str, Any]) -> bool:  # a correct kernel was written, faster than XLA or not
        return bool(e["correct"]) if "correct" in e else e.get("verdict") == "ok"

    def speedup(e: dict[str, Any]) -> float:
        if e.get("verdict") == "ok" and e.get("speedup"):
            return float(e["speedup"])
        return float(e.get("best_ok_speedup") or 0.0) if correct(e) else 0.0

    floored = [max(1.0, speedup(e)) for e in entries]
    geomean = math.exp(sum(math.log(v) for v in floored) / n) if n else 1.0

    def fast(p: float) -> float:
        return sum(1 for e in entries if correct(e) and speedup(e) > p) / n if n else 0.0

    return {"tasks": n, "compiled": sum(map(compiled, entries)), "correct": sum(map(correct, entries)),
            "geomean_speedup": geomean, "fast_1": fast(1.0), "fast_2": fast(2.0)}


def failure_counts(outcomes: Sequence[tuple[str, str | None, str | None]]) -> list[list[Any]]:
    """[[reason, count], ...], most frequent first, of the (verdict, stage, error kind) of candidates not ok."""
    counts: dict[str, int] = {}
    for verdict, stage, kind in outcomes:
        if verdict == "ok":
            continue
        reason = verdict_phrase(verdict, stage, kind)
        counts[reason] = counts.get(reason, 0) + 1
    return [[reason, n] for reason, n in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]


def gain_over_seed(summary: dict[str, Any]) -> str | None:
    """When the best kernel is not the seed: its gain over the seed, and whether that is inside the estimate's likely
    range of the seed (then it is no clear gain)."""
    best, seed, band = summary.get("speedup"), summary.get("seed_speedup"), summary.get("seed_band")
    if not (summary.get("improved") and summary.get("best_strategy_path") and best and seed):
        return None
    text = f"x{best / seed:.2f} over the seed (x{seed:.2f} -> x{best:.2f})"
    if band and band[0] <= best <= band[1]:
        text += f": inside the seed's likely range x{band[0]:.2f}-x{band[1]:.2f}, so not a clear gain"
    return text


def search_summary_table(summary: dict[str, Any]) -> Table:
    """The end of a search: the XLA reference (the baseline), where the search started, the best kernel."""
    method = summary.get("method") or "estimated"
    table = Table(title=f"{summary['task']} on {summary.get('target', '')}: {summary['strategy']} search, "
                        f"{summary['evaluations']} evaluations ({summary['duplicates']} duplicates not re-evaluated)",
                  show_header=False)
    table.add_column("what", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")  # whole paths, wrapped rather than cut

    def ms(value: float | None) -> str:
        return f"{value:.4g} ms ({method})" if value is not None else "-"

    table.add_row("XLA reference (baseline)", ms(summary.get("reference_ms")))
    seed = summary.get("seed_speedup")
    table.add_row("first kernel (the seed)", speedup_text(seed, method, summary.get("seed_band")) if seed else "not ok")
    if summary.get("improved"):
        fraction = summary.get("roofline_fraction")
        table.add_row("best kernel", f"{ms(summary.get('kernel_ms'))}, {fraction or 0:.0%} of roofline")
        table.add_row("speedup", Text(outcome_speedup(summary),
                                      style="yellow" if no_clear_gain(summary.get("band")) else "green"))
        over = gain_over_seed(summary)
        if over:
            table.add_row("over the seed", Text(over, style="yellow" if "not a clear gain" in over else ""))
        table.add_row("how", " -> ".join(summary.get("best_strategy_path") or []) or "the seed as written")
        table.add_row("kernel file", str(summary.get("kernel_path")))
        table.add_row("profile chart", str(summary.get("profile_chart")))
    else:
        table.add_row("result", Text("no candidate beat the reference"
                                     + (f" (best ok: {outcome_speedup(summary)})" if summary.get("speedup") else ""),
                                     style="yellow"))
    for reason, count in summary.get("failures") or []:
        table.add_row("not ok", f"{count} x {reason}")
    if summary.get("infeasible"):
        table.add_row("not counted", f"{summary['infeasible']} x a move beyond the chip's VMEM, refused at compile")
    table.add_row("search graph", str(summary.get("graph_png")))
    return table


def search_result_line(summary: dict[str, Any]) -> str:
    """`kernelbot search`'s last line: the best kernel with its speedup (and likely range), or why there is none."""
    if not summary.get("improved"):
        return (f"no candidate beat the reference in {summary['evaluations']} evaluations (best verdict: "
                f"{summary['verdict']}); graph: {summary['graph_png']}")
    return (f"best kernel: {outcome_speedup(summary)}; {summary['kernel_path']} via "
            f"{' -> '.join(summary['best_strategy_path']) or 'the seed'}; {summary['evaluations']} evaluations, "
            f"{summary['duplicates']} duplicates not re-evaluated; graph: {summary['graph_png']}")


def auto_result_line(summary: dict[str, Any]) -> str:
    """`kernelbot optimize`'s last line: the best kernel with its speedup (and likely range), or that none won."""
    if not summary.get("improved"):
        return (f"no candidate beat the reference in {summary['evaluations']} evaluations; stopped: "
                f"{summary['stop_reason']}")
    return (f"best kernel: {outcome_speedup(summary)}; {summary['kernel_path']} after {summary['evaluations']} "
            f"evaluations; stopped: {summary['stop_reason']}")


def bench_line(entry: dict[str, Any]) -> str:
    """One task of `kernelbot bench`: its verdict, its speedup (and likely range), the evaluations it took."""
    speed = outcome_speedup(entry) if entry.get("speedup") else "-"
    return (f"{entry['task']:<22} {entry.get('verdict') or 'not run':<15} {speed:<50} "
            f"{entry.get('evaluations', 0)} evaluations {entry.get('error', '')}").rstrip()
