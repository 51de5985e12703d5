"""`kernelbot optimize`: the Auto paradigm from a terminal, on the embedded default (SQLite, in-process)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from sqlmodel import Session

from bot import render
from bot.cli import AsJson, Target, console, err_console, get_settings, run_command
from bot.speedup import outcome_speedup
from tpu_runner.spares import spare_pool

_app = typer.Typer()


def register(app: typer.Typer) -> None:
    for command in _app.registered_commands:
        app.registered_commands.append(command)


def run_auto(task_dir: Path, *, brain: str | None, budget: int, target: str | None, quiet: bool,
             max_cost: float | None = None) -> dict[str, Any]:
    """Run the Auto loop on a task to its end; the summary as JSON (also one `bench` entry)."""
    from agents.auto import AutoLoop
    from agents.auto_decide import AutoConfig
    from agents.brain import Budget
    from agents.brains import default_brain, make_brain
    from agents.runtime import build_loop
    from storage import sessions
    from storage.database import open_database
    from tpu_runner.hardware import get_chip
    from tpu_runner.tasks import load_task

    settings = get_settings()
    task_obj = load_task(task_dir)
    chip = get_chip(target or settings.default_target)
    brain_obj = make_brain(brain or default_brain(settings), settings, Budget(max_cost_usd=max_cost), task=task_obj,
                           chip=chip)
    engine = open_database(settings)
    with Session(engine) as s, s.begin():
        session_id = sessions.create_session(s, mode="auto", task=task_obj.task_id, target=chip.name,
                                             budget={"iterations": budget, "max_cost_usd": max_cost}).id
    state: dict[str, Any] = {"evaluations": 0, "best": None}

    def on_step(kind: str, outputs: dict[str, Any]) -> None:
        if kind == "evaluate":
            state["evaluations"] += 1
            speedup = outputs.get("speedup")
            if outputs.get("verdict") == "ok" and speedup and speedup > (state["best"] or {}).get("speedup", 1.0):
                state["best"] = outputs
        best = outcome_speedup(state["best"] or {}) or "none yet"
        what = f"{kind}: {outputs.get('message', '')[:160]}" if kind == "evaluate" else kind
        if kind == "give_up":
            what = f"gave up on this iteration: {outputs.get('reason', '')[:160]}"
        line = f"session {session_id}: {what} ({state['evaluations']} evaluations, best {best})"
        if not quiet:
            err_console.print(line, soft_wrap=True)

    # One pool for the session: the compile servers start once, and the next candidate's child while one runs.
    with spare_pool(settings) as spares:
        loop = build_loop(AutoLoop, engine=engine, brain=brain_obj, task=task_obj, chip=chip, settings=settings,
                          session_id=session_id, config=AutoConfig(max_iterations=budget), on_step=on_step,
                          spares=spares)
        outcome = loop.run(session_id)
    best = outcome.best_result or {}
    summary = {"task": task_obj.task_id, "session_id": session_id, "target": chip.name,
               "verdict": best.get("verdict", "no_improvement"), "speedup": outcome.best_speedup,
               "method": best.get("method"), "band": best.get("band"), "kernel_path": outcome.best_kernel_path,
               "evaluations": outcome.evaluations, "stop_reason": outcome.stop_reason,
               "improved": outcome.improved}
    return summary


@_app.command("optimize")
def optimize_command(
    task: Annotated[Path, typer.Option("--task", help="Task directory.")],
    brain: Annotated[str | None, typer.Option("--brain", help="anthropic | offline (default: anthropic when "
                                              "ANTHROPIC_API_KEY is set)")] = None,
    budget: Annotated[int, typer.Option("--budget", help="Iterations at most (plan, implement, evaluate).")] = 5,
    max_cost: Annotated[float | None, typer.Option("--max-cost", help="Stop once the brain has cost this many "
                                                   "USD.")] = None,
    target: Target = None,
    as_json: AsJson = False,
) -> None:
    """Optimise a task without people: plan, implement, evaluate, self-debug, analyse, re-plan."""

    def run() -> int:
        summary = run_auto(task, brain=brain, budget=budget, target=target, quiet=as_json, max_cost=max_cost)
        if as_json:
            print(json.dumps(summary, indent=1))
        else:
            console.print(render.auto_result_line(summary), soft_wrap=True)
        return 0

    run_command(run)


APPROVAL_CHOICES = {"a": "approve", "r": "redirect", "h": "handoff", "c": "cancel"}
DECISION_CHOICES = {"i": "iterate", "r": "redirect", "h": "handoff", "f": "finish", "c": "cancel"}


@_app.command("chat")
def chat_command(
    task: Annotated[Path, typer.Option("--task", help="Task directory.")],
    brain: Annotated[str | None, typer.Option("--brain", help="anthropic | offline")] = None,
    budget: Annotated[int, typer.Option("--budget", help="Iterations at most.")] = 5,
    target: Target = None,
) -> None:
    """A HITL session in the terminal: approve or redirect each plan, then iterate, redirect, hand off to Auto
    or finish after each result."""

    def run() -> int:
        with contextlib.ExitStack() as stack:
            return session(stack)

    def session(stack: contextlib.ExitStack) -> int:
        from rich.markdown import Markdown

        from agents.auto import AutoLoop
        from agents.auto_decide import AutoConfig
        from agents.brain import Budget
        from agents.brains import default_brain, make_brain
        from agents.hitl import DecisionRejected, HitlMachine, record_decision
        from agents.runtime import build_loop
        from storage import sessions
        from storage.database import open_database
        from tpu_runner.hardware import get_chip
        from tpu_runner.tasks import load_task

        settings = get_settings()
        task_obj = load_task(task)
        chip = get_chip(target or settings.default_target)
        brain_obj = make_brain(brain or default_brain(settings), settings, Budget(), task=task_obj, chip=chip)
        engine = open_database(settings)
        with Session(engine) as s, s.begin():
            session_id = sessions.create_session(s, mode="hitl", task=task_obj.task_id, target=chip.name,
                                                 task_dir=str(task_obj.path), owner="terminal").id

        def show(kind: str, outputs: dict[str, Any]) -> None:
            if kind == "plan":
                console.print(Markdown(outputs["plan"]))
            elif kind == "evaluate":
                console.print(f"[bold]evaluation:[/bold] {outputs.get('message', '')}", soft_wrap=True)
            elif kind == "analyse":
                last = outputs.get("summary", "").splitlines()[-1].removeprefix("analysis: ")
                console.print(f"[bold]analysis:[/bold] {last}", soft_wrap=True)
            else:
                err_console.print(f"{kind} done", soft_wrap=True)

        spares = stack.enter_context(spare_pool(settings))
        common: dict[str, Any] = {"engine": engine, "brain": brain_obj, "task": task_obj, "chip": chip,
                                  "settings": settings, "session_id": session_id,
                                  "config": AutoConfig(max_iterations=budget), "on_step": show, "spares": spares}
        hitl = build_loop(HitlMachine, **common)
        console.print(f"session {session_id}: {task_obj.task_id} on {chip.name}")
        while True:
            outcome = hitl.run(session_id)
            if outcome.stop_reason in ("finish", "cancel"):
                break
            choices = APPROVAL_CHOICES if outcome.stop_reason == "await_approval" else DECISION_CHOICES
            question = " / ".join(f"[{k}]{v[1:] if v.startswith(k) else ' ' + v}" for k, v in choices.items())
            answer = typer.prompt(question).strip().lower()[:1]
            if answer not in choices:
                err_console.print(f"please answer one of {', '.join(choices)}")
                continue
            action = choices[answer]
            text = typer.prompt("what should be done instead") if action == "redirect" else None
            try:
                record_decision(engine, session_id=session_id, actor="terminal", action=action, text=text)
            except DecisionRejected as exc:
                err_console.print(str(exc))
                continue
            if action == "handoff":
                outcome = build_loop(AutoLoop, **common).run(session_id)
                break
        if outcome.improved:
            console.print(f"best kernel: {outcome_speedup(outcome.best_result or {})}; {outcome.best_kernel_path} "
                          f"({outcome.evaluations} evaluations)", soft_wrap=True)
        else:
            console.print(f"no candidate beat the reference ({outcome.evaluations} evaluations)")
        return 0

    run_command(run)
