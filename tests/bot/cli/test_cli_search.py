"""`kernelbot search` and `kernelbot bench` as a person runs them (no API key: parametric strategies only)."""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from bot.cli import render
from tests.bot.cli.test_cli import KERNELBOT
from tests.conftest import REPO, TASKS


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "KERNELBOT_DATABASE_URL")}
    return env | {"KERNELBOT_HOME": str(home), "KERNELBOT_EVAL_WORKERS": "2"}


@pytest.mark.slow
def test_search_json_reports_the_best_kernel_and_draws_the_graph(tmp_path: Path) -> None:
    proc = subprocess.run([*KERNELBOT, "search", "--task", str(TASKS / "softmax"), "--seed",
                           str(TASKS / "softmax/solutions/pallas.py"), "--budget", "3", "--json"],
                          capture_output=True, text=True, env=_env(tmp_path), timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert {"task", "verdict", "speedup", "method", "band", "kernel_path", "evaluations"} <= set(result)
    assert result["verdict"] == "ok" and result["method"] == "estimated" and result["evaluations"] <= 3
    assert Path(result["kernel_path"]).is_file()
    assert Path(result["graph_png"]).read_bytes()[:4] == b"\x89PNG"


def _summary(speedup: float, band: list[float] | None) -> dict:
    return {"task": "softmax", "target": "v6e", "strategy": "beam", "verdict": "ok", "improved": speedup > 1.0,
            "speedup": speedup, "method": "estimated", "band": band, "kernel_path": "k.py", "evaluations": 4,
            "duplicates": 1, "best_strategy_path": ["tile_rows"], "graph_png": "g.png", "stop_reason": "budget",
            "reference_ms": 1.0, "kernel_ms": 1 / speedup, "roofline_fraction": 0.5, "seed_speedup": 1.5,
            "seed_band": [1.2, 1.9]}


def _table(summary: dict) -> str:
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(render.search_summary_table(summary))
    return console.export_text()


@pytest.mark.parametrize("line", [render.search_result_line, render.auto_result_line, render.bench_line, _table])
def test_search_optimize_and_bench_give_the_estimates_likely_range(line) -> None:  # type: ignore[no-untyped-def]
    unclear = line(_summary(1.04, [0.9, 1.2]))
    assert "x1.04 estimated, likely x0.90-x1.20: no clear gain" in unclear
    clear = line(_summary(2.0, [1.6, 2.5]))
    assert "x2.00 estimated, likely x1.60-x2.50" in clear and "no clear gain" not in clear
    assert "likely" not in line({**_summary(2.0, None), "seed_band": None})  # measured, or stored before bands


def test_the_search_table_gives_the_seeds_likely_range_too() -> None:
    assert "x1.50 estimated, likely x1.20-x1.90" in _table(_summary(2.0, [1.6, 2.5]))


def test_search_on_a_task_no_brain_here_can_write_says_why(tmp_path: Path) -> None:
    proc = subprocess.run([*KERNELBOT, "search", "--task", str(TASKS / "conv1d_depthwise")], capture_output=True,
                          text=True, env=_env(tmp_path), timeout=120, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    assert "the offline brain cannot write a kernel for conv1d_depthwise" in proc.stderr
    assert "neither per element" in proc.stderr


@pytest.mark.slow
def test_bench_json_gives_the_papers_figures(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    for name in ("layer_norm", "conv1d_depthwise"):  # the offline brain does not write depthwise convolutions
        shutil.copytree(TASKS / name, suite / name)
    proc = subprocess.run([*KERNELBOT, "bench", "--suite", str(suite), "--budget", "2", "--seed-solutions",
                           "--json"],
                          capture_output=True, text=True, env=_env(tmp_path / "home"), timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    by_task = {t["task"]: t for t in report["tasks"]}
    assert set(by_task) == {"layer_norm", "conv1d_depthwise"}
    assert "cannot write a kernel for conv1d_depthwise" in by_task["conv1d_depthwise"]["error"]
    summary = report["summary"]
    assert summary["tasks"] == 2 and summary["compiled"] == 1 and summary["correct"] == 1
    speedups = [max(1.0, by_task["layer_norm"]["speedup"]), 1.0]
    assert summary["geomean_speedup"] == pytest.approx(math.prod(speedups) ** (1 / 2))
    assert summary["fast_1"] == pytest.approx(sum(s > 1 for s in speedups) / 2)
    assert set(summary) == {"tasks", "compiled", "correct", "geomean_speedup", "fast_1", "fast_2"}


@pytest.mark.slow
def test_the_readme_main_job_runs_a_real_optimisation_offline(tmp_path: Path) -> None:
    proc = subprocess.run([*KERNELBOT, "demo", "--task", "layer_norm", "--budget", "2"], capture_output=True,
                          text=True, env=_env(tmp_path) | {"COLUMNS": "200"}, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "the offline brain writes a Pallas kernel for layer_norm" in proc.stdout
    assert "XLA reference (baseline)" in proc.stdout and "(estimated)" in proc.stdout
    assert "2/2 evaluations" in proc.stderr  # the progress lines
    kernel = next(line for line in proc.stdout.splitlines() if "kernel file" in line).split()[-2]
    assert "offline brain" in Path(kernel).read_text()


@pytest.mark.slow
def test_optimize_with_the_offline_brain_needs_no_key(tmp_path: Path) -> None:
    proc = subprocess.run([*KERNELBOT, "optimize", "--task", str(TASKS / "softmax"), "--budget", "2", "--json"],
                          capture_output=True, text=True, env=_env(tmp_path), timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["verdict"] == "ok" and result["evaluations"] == 2 and result["speedup"] > 1.0
    assert "band" in result
    assert "offline brain" in Path(result["kernel_path"]).read_text()


def test_resume_of_an_unknown_session_or_no_task_says_what_to_do(tmp_path: Path) -> None:
    proc = subprocess.run([*KERNELBOT, "search", "--resume", "nosuchsession"], capture_output=True, text=True,
                          env=_env(tmp_path), timeout=120, cwd=REPO)
    assert proc.returncode == 2 and "no session nosuchsession" in proc.stderr
    proc = subprocess.run([*KERNELBOT, "search"], capture_output=True, text=True, env=_env(tmp_path), timeout=120,
                          cwd=REPO)
    assert proc.returncode == 2 and "needs --task DIR (or --resume SESSION)" in proc.stderr


@pytest.mark.slow
def test_a_killed_search_resumes_from_the_cli(tmp_path: Path) -> None:
    import signal
    import sqlite3
    import time

    env = _env(tmp_path)
    proc = subprocess.Popen([*KERNELBOT, "search", "--task", str(TASKS / "softmax"), "--seed",
                             str(TASKS / "softmax/solutions/pallas.py"), "--budget", "3", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO, start_new_session=True)
    db = tmp_path / "kernelbot.db"
    deadline = time.monotonic() + 120
    evaluated = 0
    while time.monotonic() < deadline and not evaluated:
        time.sleep(0.5)
        try:
            with sqlite3.connect(db) as conn:
                evaluated = conn.execute("select count(*) from evaluations").fetchone()[0]
        except sqlite3.OperationalError:
            continue  # not created or not migrated yet
    os.killpg(proc.pid, signal.SIGKILL)  # the process and its evaluation children, mid-search
    proc.wait()
    assert evaluated >= 1
    with sqlite3.connect(db) as conn:
        (session_id,) = conn.execute("select id from sessions").fetchone()
        assert conn.execute("select status from sessions").fetchone()[0] == "active"
    resumed = subprocess.run([*KERNELBOT, "search", "--resume", session_id, "--json"], capture_output=True,
                             text=True, env=env, timeout=600, cwd=REPO)
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)
    assert result["status"] == "done" and result["evaluations"] == 3 and result["verdict"] == "ok"


def test_demo_json_answers_in_json_even_when_it_cannot_start(tmp_path: Path) -> None:
    proc = subprocess.run([*KERNELBOT, "demo", "--task", "nosuchtask", "--json"], capture_output=True, text=True,
                          env=_env(tmp_path), timeout=120, cwd=REPO)
    error = json.loads(proc.stdout)
    assert proc.returncode == 2 and "no suite task 'nosuchtask'" in error["error"] and "softmax" in error["error"]


def test_bench_counts_a_correct_kernel_slower_than_xla_as_compiled_and_correct() -> None:
    from bot.cli.render import bench_summary

    entries = [  # as `bench --mode auto` reports them
        {"task": "a", "verdict": "no_improvement", "speedup": None, "compiled": True, "correct": True,
         "best_ok_speedup": 0.8},
        {"task": "b", "verdict": "ok", "speedup": 2.5, "compiled": True, "correct": True, "best_ok_speedup": 2.5},
        {"task": "c", "verdict": "no_improvement", "speedup": None, "compiled": True, "correct": False,
         "best_ok_speedup": None},
        {"task": "d", "verdict": None, "speedup": None, "error": "SessionStopped: its runner stopped"},
    ]
    summary = bench_summary(entries)
    assert summary["compiled"] == 3 and summary["correct"] == 2
    assert summary["fast_1"] == pytest.approx(1 / 4) and summary["fast_2"] == pytest.approx(1 / 4)
    assert summary["geomean_speedup"] == pytest.approx(2.5 ** (1 / 4))  # the slower one counts as x1


def test_the_demo_table_says_why_candidates_failed_and_when_a_gain_is_inside_the_band() -> None:
    from bot.cli.render import failure_counts, gain_over_seed

    assert failure_counts([("ok", "done", None), ("compile_error", "compile", "vmem_oom"),
                           ("compile_error", "compile", "vmem_oom"), ("incorrect", "correctness", "mismatch")]) == [
        ["compile_error at compile: vmem_oom", 2], ["incorrect at correctness: mismatch", 1]]
    tuned = {"improved": True, "best_strategy_path": ["block_m=256"], "seed_speedup": 4.50, "speedup": 4.58,
             "seed_band": [3.22, 6.15]}
    assert gain_over_seed(tuned) == ("x1.02 over the seed (x4.50 -> x4.58): inside the seed's likely range "
                                     "x3.22-x6.15, so not a clear gain")
    assert "not a clear gain" not in (gain_over_seed({**tuned, "speedup": 9.0}) or "")
    assert gain_over_seed({**tuned, "best_strategy_path": []}) is None  # the seed itself is the best
