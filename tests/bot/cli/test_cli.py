"""The `kernelbot` command as a person runs it: exit codes, JSON shape, one-line errors with a next step."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from bot.cli import render
from storage.migrate import head_revision
from tests.conftest import CORPUS, TASKS
from tests.fakes.anthropic_api import fake_anthropic
from tpu_runner.reports import EvalResult, Performance

KERNELBOT = [sys.executable, "-m", "bot.cli"]
JSON_KEYS = {"task", "target", "host", "verdict", "stage", "message", "error", "correctness", "performance",
             "artifacts"}


def _run(args: list[str], home: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KERNELBOT_HOME": str(home)}
    return subprocess.run([*KERNELBOT, *args], capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=Path(__file__).resolve().parents[3])


@pytest.mark.slow
def test_eval_json_for_a_good_kernel(kernelbot_home: Path) -> None:
    proc = _run(["eval", "--task", str(TASKS / "layer_norm"), "--kernel",
                 str(TASKS / "layer_norm/solutions/pallas.py"), "--json"], kernelbot_home)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert set(result) >= JSON_KEYS
    assert result["verdict"] == "ok" and result["stage"] == "done" and result["error"] is None
    assert result["host"] == "cpu" and result["target"] == "v6e"
    assert result["correctness"]["status"] == "passed"
    assert {"method", "unit", "reference", "candidate", "speedup", "roofline_fraction", "flags", "band"} <= set(
        result["performance"])
    assert result["performance"]["method"] == "estimated"
    assert Path(result["artifacts"]["profile_chart"]).is_file()
    trace = json.loads(Path(result["artifacts"]["profile_trace"]).read_text())  # opens in Perfetto's UI
    assert {e["name"] for e in trace["traceEvents"] if e.get("ph") == "M"} >= {"process_name"}
    assert any(e.get("ph") == "X" and e["pid"] == 1 for e in trace["traceEvents"])  # the candidate's ops


def _estimated(speedup: float, band: list[float] | None) -> EvalResult:
    perf = Performance(method="estimated", unit="ms", reference=speedup * 0.5, candidate=0.5, speedup=speedup,
                       roofline_fraction=0.8, roofline_ms=0.4, bound="memory", flops=1e9, bytes=1e8, band=band)
    return EvalResult(task="softmax", target="v6e", host="cpu", verdict="ok", stage="done", message="ok",
                      performance=perf)


def _panel(result: EvalResult) -> str:
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(render.result_panel(result))
    return console.export_text()


def test_eval_json_and_panel_give_the_estimates_likely_range() -> None:
    unclear = _estimated(1.04, [0.9, 1.2])
    data = json.loads(json.dumps(unclear.to_json()))  # what `kernelbot eval --json` prints
    assert data["performance"]["band"] == [0.9, 1.2]
    assert EvalResult.from_json(data).performance.band == [0.9, 1.2]  # and reads back
    assert "x1.04 estimated, likely x0.90-x1.20: no clear gain" in _panel(unclear)
    clear = _panel(_estimated(2.0, [1.6, 2.5]))
    assert "x2.00 estimated, likely x1.60-x2.50" in clear and "no clear gain" not in clear
    old = {**data, "performance": {k: v for k, v in data["performance"].items() if k != "band"}}
    assert EvalResult.from_json(old).performance.band is None  # stored before bands
    assert "speedup      x1.04 estimated" in _panel(EvalResult.from_json(old))


def test_eval_json_for_a_rejected_kernel_exits_non_zero(kernelbot_home: Path) -> None:
    proc = _run(["eval", "--task", str(TASKS / "softmax"), "--kernel", str(CORPUS / "bad/not_a_kernel.py"),
                 "--json"], kernelbot_home)
    assert proc.returncode == 1
    result = json.loads(proc.stdout)
    assert result["verdict"] == "rejected" and result["stage"] == "static"
    assert result["error"]["kind"] == "no_pallas_call"
    assert result["correctness"]["status"] == "not_checked" and result["performance"] is None
    # Not on a terminal: progress as plain lines on stderr, stdout JSON alone.
    assert "evaluating not_a_kernel.py: starting (0 s)" in proc.stderr
    assert "evaluating not_a_kernel.py: finished (" in proc.stderr


@pytest.mark.parametrize(("args", "expected"), [
    (["eval", "--task", "/nonexistent", "--kernel", "x.py"], "does not exist"),
    (["eval", "--task", str(TASKS / "softmax"), "--kernel", "/nonexistent.py"], "cannot read the kernel file"),
    (["eval", "--task", str(TASKS / "softmax"), "--kernel", str(CORPUS / "bad/not_a_kernel.py"), "--target", "v9"],
     "unknown target 'v9'"),
    (["tasks", "--suite", "/nonexistent"], "does not exist"),
])
def test_bad_input_gets_one_line_and_a_next_step(kernelbot_home: Path, args: list[str], expected: str) -> None:
    proc = _run(args, kernelbot_home)
    assert proc.returncode == 2
    assert expected in proc.stderr and "next:" in proc.stderr
    assert "Traceback" not in proc.stderr
    as_json = _run([*args, "--json"], kernelbot_home)  # a script gets the same as JSON where the answer would be
    error = json.loads(as_json.stdout)
    assert as_json.returncode == 2 and expected in error["error"] and error["next"] and error["exit_code"] == 2


def test_bad_setting_names_the_variable(kernelbot_home: Path) -> None:
    env = {**os.environ, "KERNELBOT_HOME": str(kernelbot_home), "KERNELBOT_EVAL_WORKERS": "many"}
    proc = subprocess.run([*KERNELBOT, "tasks"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "KERNELBOT_EVAL_WORKERS" in proc.stderr


@pytest.mark.slow
def test_tasks_json_lists_the_suite_with_costs(kernelbot_home: Path, tmp_path: Path) -> None:
    suite = tmp_path / "suite"  # four of the built-in tasks, one of each roofline class and an int input
    for name in ("softmax", "matmul_bf16", "causal_attention", "cross_entropy"):
        shutil.copytree(TASKS / name, suite / name, ignore=shutil.ignore_patterns("solutions"))
    proc = _run(["tasks", "--suite", str(suite), "--json"], kernelbot_home)
    assert proc.returncode == 0, proc.stderr
    listing = json.loads(proc.stdout)
    tasks = {t["task_id"]: t for t in listing["tasks"]}
    assert len(tasks) == 4 and listing["errors"] == []
    assert tasks["matmul_bf16"]["bound"] == "compute" and tasks["softmax"]["bound"] == "memory"
    assert tasks["causal_attention"]["bound"] == "compute"  # scores stay on chip: q, k, v, o are the traffic
    assert tasks["softmax"]["compulsory_bytes"] == pytest.approx(2 * 8192 * 8192 * 4)
    assert tasks["matmul_bf16"]["flops"] == pytest.approx(2 * 4096**3, rel=0.01)
    assert all(t["bytes"] > 0 and t["configurations"] for t in tasks.values())


def test_db_upgrade_then_enqueue_eval(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc = _run(["db", "upgrade"], home)
    assert proc.returncode == 0 and f"empty -> {head_revision()}" in proc.stdout
    proc = _run(["db", "upgrade"], home)
    assert f"{head_revision()} -> {head_revision()}" in proc.stdout  # idempotent
    proc = _run(["enqueue-eval", "--task", str(TASKS / "softmax"), "--kernel",
                 str(TASKS / "softmax/solutions/pallas.py"), "--target", "v5e"], home)
    assert proc.returncode == 0 and proc.stdout.strip().isdigit()
    jobs = json.loads(_run(["jobs", "--json"], home).stdout)
    assert [(j["kind"], j["status"], j["target"]) for j in jobs] == [("evaluate", "queued", "v5e")]


def test_enqueue_eval_refuses_a_broken_task_before_queueing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc = _run(["enqueue-eval", "--task", str(tmp_path), "--kernel", str(TASKS / "softmax/solutions/pallas.py")],
                home)
    assert proc.returncode == 2 and "is not a task" in proc.stderr
    assert json.loads(_run(["jobs", "--json"], home).stdout) == []


def test_unreachable_database_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "KERNELBOT_HOME": str(tmp_path), "KERNELBOT_DATABASE_URL": "postgresql://x@127.0.0.1:1/x"}
    proc = subprocess.run([*KERNELBOT, "jobs"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert "cannot use the database" in proc.stderr and "KERNELBOT_DATABASE_URL" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_runner_with_an_unknown_job_kind_says_so(tmp_path: Path) -> None:
    proc = _run(["runner", "--kind", "no_such_kind", "--exit-when-idle"], tmp_path)
    assert proc.returncode == 2
    assert "unknown job kinds ['no_such_kind']" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_optimize_with_the_anthropic_brain_against_the_fake_api(tmp_path: Path) -> None:
    from agents.subagents import PLAN_SECTIONS
    from tests.fakes.anthropic_api import API_KEY, fake_anthropic

    plan = "\n".join(f"## {s.title()}\n{s}: details" for s in PLAN_SECTIONS)
    good = (TASKS / "softmax/solutions/pallas.py").read_text()
    with fake_anthropic([{"text": plan}, {"text": f"```python\n{good}```"}, {"text": "at the HBM roofline"}]) as fake:
        env = {**os.environ, "KERNELBOT_HOME": str(tmp_path), "ANTHROPIC_API_KEY": API_KEY,
               "ANTHROPIC_BASE_URL": fake.base_url}
        proc = subprocess.run([*KERNELBOT, "optimize", "--task", str(TASKS / "softmax"), "--budget", "1", "--json"],
                              capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert {"task", "verdict", "speedup", "method", "kernel_path", "evaluations"} <= set(result)
    assert result["verdict"] == "ok" and result["method"] == "estimated" and result["speedup"] > 1.0
    assert result["evaluations"] == 1 and result["stop_reason"] == "iterations" and result["improved"] is True
    assert Path(result["kernel_path"]).read_text() == good
    assert fake.requests[0]["body"]["model"] == "claude-opus-5-5"  # newest active opus the API lists


def test_optimize_without_a_usable_brain_says_what_is_needed(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"} | {"KERNELBOT_HOME": str(tmp_path)}
    proc = subprocess.run([*KERNELBOT, "optimize", "--task", str(TASKS / "softmax"), "--brain", "anthropic"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "needs ANTHROPIC_API_KEY" in proc.stderr


@pytest.mark.slow
def test_chat_runs_a_hitl_session_from_the_terminal(tmp_path: Path) -> None:
    from agents.subagents import PLAN_SECTIONS
    from tests.fakes.anthropic_api import API_KEY, fake_anthropic

    plan = "\n".join(f"## {s.title()}\n{s}: use 512-row blocks" for s in PLAN_SECTIONS)
    good = (TASKS / "softmax/solutions/pallas.py").read_text()
    script = [{"text": plan}, {"text": plan}, {"text": f"```python\n{good}```"}, {"text": "HBM-bound"}]
    answers = "z\nr\nuse 256-row blocks\na\nf\n"  # a typo, a redirect, approval, then finish after the result
    with fake_anthropic(script) as fake:
        env = {**os.environ, "KERNELBOT_HOME": str(tmp_path), "ANTHROPIC_API_KEY": API_KEY,
               "ANTHROPIC_BASE_URL": fake.base_url}
        proc = subprocess.run([*KERNELBOT, "chat", "--task", str(TASKS / "softmax")], input=answers,
                              capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "please answer one of" in proc.stderr
    assert "Tiling and memory" in proc.stdout and "evaluation: ok" in proc.stdout
    assert re.search(r"best kernel: x\d+\.\d\d estimated, likely x\d+\.\d\d-x\d+\.\d\d", proc.stdout), proc.stdout
    assert "use 256-row blocks" in fake.requests[1]["body"]["messages"][0]["content"]
    assert len(fake.requests) == 4


def test_a_brain_that_cannot_answer_is_one_line_with_its_next_step(tmp_path: Path) -> None:
    with fake_anthropic() as fake:
        env = {**os.environ, "KERNELBOT_HOME": str(tmp_path), "ANTHROPIC_API_KEY": "sk-wrong",
               "ANTHROPIC_BASE_URL": fake.base_url}
        proc = subprocess.run([*KERNELBOT, "optimize", "--task", str(TASKS / "softmax"), "--brain", "anthropic"],
                              capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "refused the key (401)" in proc.stderr and "next: check ANTHROPIC_API_KEY" in proc.stderr
    assert "Traceback" not in proc.stderr and "error id" not in proc.stderr.lower()


def test_a_jobs_outcome_says_its_verdict_what_it_decides_and_where_its_checks_went() -> None:
    unverified = {"result": {"verdict": "unverified", "follow_ups": ["production_check queued for the TPU v6e "
                                                                     "runners (v6e-host)"]}, "error": None}
    assert render.job_outcome(unverified) == "unverified; production_check queued for the TPU v6e runners (v6e-host)"
    assert render.job_outcome({"result": {"verdict": "ok"}, "after_job": 7, "error": None}) == "ok; decides job 7"
    assert render.job_outcome({"result": None, "error": "RuntimeError: boom"}) == "RuntimeError: boom"
    assert render.job_outcome({"status": "done", "result": {"verdict": "ok"}, "error": "runner r1 stopped answering"}
                              ) == "ok; earlier attempt: runner r1 stopped answering"


def test_jobs_job_and_cancel_from_the_command_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    enqueue = ["enqueue-eval", "--task", str(TASKS / "softmax"), "--kernel", str(CORPUS / "bad" / "syntax_error.py")]
    first, second = (int(_run(enqueue, home).stdout) for _ in range(2))
    proc = _run(["cancel", str(second)], home)
    assert proc.returncode == 0 and f"cancelled job {second}" in proc.stdout
    proc = _run(["cancel", str(second)], home)
    assert proc.returncode == 1 and f"job {second} is cancelled" in proc.stderr
    proc = _run(["runner", "--exit-when-idle", "--name", "cli-runner", "--kind", "evaluate"], home)
    assert proc.returncode == 0, proc.stderr
    table = _run(["jobs"], home).stdout  # 80 columns: each job on a line or two
    assert "cli-runner" in table and "cancelled" in table and len(table.splitlines()) <= 10, table
    assert "rejected at static:" in " ".join(table.split()), table
    job = json.loads(_run(["job", str(first), "--json"], home).stdout)
    assert job["status"] == "done" and job["verdict"] == "rejected" and job["runner_name"] == "cli-runner"
    (evaluation,) = job["evaluations"]
    assert evaluation["result"]["error"]["kind"] == "syntax_error"
    shown = _run(["job", str(first)], home).stdout
    assert f"job {first} (evaluate, target v6e): done" in shown and "syntax_error" in shown
    assert "result: " in shown  # where its files are
    proc = _run(["job", "999"], home)
    assert proc.returncode == 2 and "no job 999" in proc.stderr and "kernelbot jobs" in proc.stderr
