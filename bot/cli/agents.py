"""`kernelbot optimize` and `chat`: Auto and HITL sessions from a terminal, started as Slack starts them and run
by the embedded local runner (SQLite and a runner in this process by default)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from sqlmodel import Session

from bot.cli import render
from bot.cli.common import AsJson, Target, console, err_console, get_settings, run_command
from bot.speedup import outcome_speedup

_app = typer.Typer()


def register(app: typer.Typer) -> None:
    for command in _app.registered_commands:
        app.registered_commands.append(command)


def run_auto(task_dir: Path, *, brain: str | None, budget: int, target: str | None, quiet: bool,
             max_cost: float | None = None) -> dict[str, Any]:
    """Run an Auto session on a task to its end, the way Slack does (recorded, queued, run by a runner: here one
    in this process); the summary as JSON (also one `bench` entry)."""
    from agents.brain import Budget
    from agents.brains import default_brain, make_brain
    from agents.commands import start_session
    from agents.local import run_until_settled
    from storage.connect import open_database
    from tpu_runner.hardware import get_chip
    from tpu_runner.tasks import load_task

    settings = get_settings()
    task_obj = load_task(task_dir)
    chip = get_chip(target or settings.default_target)
    brain_name = brain or default_brain(settings)
    # Built once here so that a brain that cannot work (no key, a bad key, a task it cannot read) says so in one
    # line before any session exists; the runner's job builds its own.
    make_brain(brain_name, settings, Budget(max_cost_usd=max_cost), task=task_obj, chip=chip)
    engine = open_database(settings)
    session_id = start_session(engine, mode="auto", task=task_obj, target=chip.name, owner="terminal",
                               budget={"iterations": budget, "max_cost_usd": max_cost, "brain": brain_name})
    progress = _Progress(engine, session_id, quiet)
    status = run_until_settled(engine, settings, session_id, kinds=("auto_session",), workers=1,
                               on_poll=progress.show, poll_seconds=0.5)
    progress.show()
    return _auto_summary(engine, session_id, task_obj.task_id, chip.name, status)


class _Progress:
    """One line per step of the session, as its events arrive (what a Slack thread shows, for a terminal)."""

    def __init__(self, engine: Any, session_id: str, quiet: bool):
        self.engine, self.session_id, self.quiet = engine, session_id, quiet
        self.seen, self.evaluations, self.best = 0, 0, None

    def show(self) -> None:
        from sqlmodel import col, select

        from storage.models import SessionEvent

        with Session(self.engine) as s:
            events = s.exec(select(SessionEvent).where(SessionEvent.session_id == self.session_id,
                                                       SessionEvent.kind == "step", col(SessionEvent.id) > self.seen)
                            .order_by(col(SessionEvent.id))).all()
        for event in events:
            self.seen = event.id or self.seen
            self._line(str(event.payload.get("kind")), dict(event.payload))

    def _line(self, kind: str, payload: dict[str, Any]) -> None:
        if kind == "evaluate":
            self.evaluations += 1
            speedup = payload.get("speedup")
            if payload.get("verdict") == "ok" and speedup and speedup > (self.best or {}).get("speedup", 1.0):
                self.best = payload
        best = outcome_speedup(self.best or {}) or "none yet"
        what = f"{kind}: {str(payload.get('message', ''))[:160]}" if kind == "evaluate" else kind
        if kind == "give_up":
            what = f"gave up on this iteration: {str(payload.get('reason', ''))[:160]}"
        if not self.quiet:
            err_console.print(f"session {self.session_id}: {what} ({self.evaluations} evaluations, best {best})",
                              soft_wrap=True)


def _auto_summary(engine: Any, session_id: str, task_id: str, target: str, status: str) -> dict[str, Any]:
    from sqlmodel import col, select

    from agents.local import SessionStopped
    from storage import sessions
    from storage.models import SessionEvent

    with Session(engine) as s:
        events = s.exec(select(SessionEvent).where(SessionEvent.session_id == session_id)
                        .order_by(col(SessionEvent.id))).all()
        steps = [st.outputs or {} for st in sessions.get_steps(s, session_id=session_id) if st.kind == "evaluate"]
    finished = next((e.payload for e in reversed(events) if e.kind == "auto_finished"), None)
    if finished is None:
        failed = next((e.payload for e in reversed(events) if e.kind == "job_failed"), {})
        raise SessionStopped(f"session {session_id} ended {status} without a result: "
                             f"{failed.get('reason') or 'its runner stopped'}")
    best_id = finished.get("best_candidate_id")
    best = next((st for st in steps if best_id is not None and st.get("candidate_id") == best_id), {})
    fastest_ok = max((st.get("speedup") or 0.0 for st in steps if st.get("verdict") == "ok"), default=None)
    return {"task": task_id, "session_id": session_id, "target": target,
            "verdict": best.get("verdict", "no_improvement"), "speedup": finished.get("best_speedup"),
            "method": best.get("method"), "band": best.get("band"), "kernel_path": best.get("kernel_path"),
            "evaluations": finished.get("evaluations", len(steps)), "stop_reason": finished.get("stop_reason"),
            "improved": best_id is not None,
            # The paper's figures count every kernel the session wrote, not only one faster than XLA.
            "compiled": any(st.get("verdict") in render.COMPILED_VERDICTS for st in steps),
            "correct": fastest_ok is not None, "best_ok_speedup": fastest_ok}


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

    run_command(run, as_json=as_json)


class _StepPrinter:
    """A HITL session's steps for a person at a terminal, as they are recorded (what its Slack thread shows)."""

    def __init__(self, engine: Any, session_id: str):
        self.engine, self.session_id, self.seen = engine, session_id, -1

    def show(self) -> None:
        from rich.markdown import Markdown

        from storage import sessions

        with Session(self.engine) as s:
            steps = [(st.index, st.kind, dict(st.outputs or {})) for st in
                     sessions.get_steps(s, session_id=self.session_id) if st.index > self.seen]
        for index, kind, outputs in steps:
            self.seen = index
            if kind == "plan":
                console.print(Markdown(outputs["plan"]))
            elif kind == "evaluate":
                console.print(f"[bold]evaluation:[/bold] {outputs.get('message', '')}", soft_wrap=True)
            elif kind == "analyse":
                last = outputs.get("summary", "").splitlines()[-1].removeprefix("analysis: ")
                console.print(f"[bold]analysis:[/bold] {last}", soft_wrap=True)
            elif kind != "decision":
                err_console.print(f"{kind} done", soft_wrap=True)


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
        from agents.auto_decide import StepRecord
        from agents.brain import Budget
        from agents.brains import default_brain, make_brain
        from agents.commands import decide, start_session
        from agents.hitl import DecisionRejected, waiting_for
        from agents.local import run_until_settled
        from storage import sessions
        from storage.connect import open_database
        from tpu_runner.hardware import get_chip
        from tpu_runner.tasks import load_task

        settings = get_settings()
        task_obj = load_task(task)
        chip = get_chip(target or settings.default_target)
        brain_name = brain or default_brain(settings)
        make_brain(brain_name, settings, Budget(), task=task_obj, chip=chip)  # one line now if it cannot work
        engine = open_database(settings)
        # The session Slack would start: recorded, queued, run by a runner (here in this process); the person
        # answers here what a thread's buttons would.
        session_id = start_session(engine, mode="hitl", task=task_obj, target=chip.name, owner="terminal",
                                   budget={"iterations": budget, "brain": brain_name})
        printer = _StepPrinter(engine, session_id)
        console.print(f"session {session_id}: {task_obj.task_id} on {chip.name}")
        while True:
            status = run_until_settled(engine, settings, session_id, kinds=("hitl_advance", "auto_session"),
                                       workers=1, on_poll=printer.show, poll_seconds=0.3)
            printer.show()
            with Session(engine) as s:
                steps = [StepRecord(st.kind, dict(st.outputs or {}))
                         for st in sessions.get_steps(s, session_id=session_id)]
                mode = sessions.get_session(s, session_id=session_id).mode
            awaited = waiting_for(steps) if mode == "hitl" else None
            if status in ("done", "cancelled", "failed") or awaited is None:
                break
            choices = APPROVAL_CHOICES if awaited == "await_approval" else DECISION_CHOICES
            question = " / ".join(f"[{k}]{v[1:] if v.startswith(k) else ' ' + v}" for k, v in choices.items())
            answer = typer.prompt(question).strip().lower()[:1]
            if answer not in choices:
                err_console.print(f"please answer one of {', '.join(choices)}")
                continue
            action = choices[answer]
            text = typer.prompt("what should be done instead") if action == "redirect" else None
            try:
                decide(engine, session_id=session_id, actor="terminal", action=action, text=text, via="terminal")
            except DecisionRejected as exc:
                err_console.print(str(exc))
        with Session(engine) as s:
            best_id = sessions.get_session(s, session_id=session_id).best_candidate_id
            evaluations = [st.outputs or {} for st in sessions.get_steps(s, session_id=session_id)
                           if st.kind == "evaluate"]
        best = next((e for e in evaluations if best_id is not None and e.get("candidate_id") == best_id), None)
        if best is not None:
            console.print(f"best kernel: {outcome_speedup(best)}; {best.get('kernel_path')} "
                          f"({len(evaluations)} evaluations)", soft_wrap=True)
        else:
            console.print(f"no candidate beat the reference ({len(evaluations)} evaluations)")
        return 0

    run_command(run)
