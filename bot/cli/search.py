"""`kernelbot search` and `kernelbot bench`: the Search paradigm (and the autotuner) from a terminal, on the
embedded default (SQLite, a runner in this process)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from sqlmodel import Session

from bot.cli import render
from bot.cli.common import AsJson, Target, console, err_console, get_settings, run_command
from bot.cli.render import bench_summary, search_progress_line
from bot.task_suites import REPO_TASKS

_app = typer.Typer()


def register(app: typer.Typer) -> None:
    for command in _app.registered_commands:
        app.registered_commands.append(command)


Strategy = Annotated[str, typer.Option("--strategy", help="beam | parallel | hybrid (a third of the budget on random "
                                       "points, then beam) | tune (the autotuner: random points of the seed's "
                                       "TUNABLE space, all at once).")]
Budget = Annotated[int, typer.Option("--budget", help="Evaluations at most (duplicates stopped at the IR gate "
                                     "do not count).")]
Width = Annotated[int, typer.Option("--width", help="Beam width / trajectories / candidates in flight.")]
Brain = Annotated[str | None, typer.Option("--brain", help="offline | anthropic (default: anthropic when "
                                           "ANTHROPIC_API_KEY is set, else offline). The offline brain writes the "
                                           "seed and the search moves its parameters; an LLM also carries out the "
                                           "strategies that are not parameter moves.")]


def _search_one(task_dir: Path, *, strategy: str, budget: int, width: int, brain: str | None, seed: Path | None,
                target: str | None, quiet: bool) -> dict[str, Any]:
    """Start a search and run it to the end with a local runner; the outcome as JSON (plus the graph picture)."""
    from agents.brain import Budget as BrainBudget
    from agents.brains import default_brain, make_brain
    from agents.search import start_search
    from agents.search_decide import SearchConfig
    from storage.connect import open_database
    from tpu_runner.hardware import get_chip
    from tpu_runner.tasks import load_task

    settings = get_settings()
    task = load_task(task_dir)
    chip = get_chip(target or settings.default_target)
    brain_name = brain or default_brain(settings)
    seed_code = seed.read_text() if seed else None
    if seed_code is None or brain_name != "offline":
        # Fails now, with its message, when this brain cannot work on this task here.
        make_brain(brain_name, settings, BrainBudget(), task=task, chip=chip)
    engine = open_database(settings)
    config = SearchConfig(strategy=strategy, budget=budget, width=width)
    with Session(engine) as s, s.begin():
        session_id = start_search(s, task=task, target=chip.name, config=config, seed_code=seed_code,
                                  brain=brain_name)
    return _run_to_end(engine, session_id, quiet=quiet)


def _run_to_end(engine: Any, session_id: str, *, quiet: bool) -> dict[str, Any]:
    """Serve a search session's jobs here until it is over (also what --resume does after a crash)."""
    from agents.local import run_until_settled
    from agents.search import NODE_JOB, load_graph, outcome
    from agents.search_graph import render_search_graph
    from storage import sessions

    settings = get_settings()
    with Session(engine) as s:
        record = sessions.get_session(s, session_id=session_id)
        if record.mode != "search":
            raise ValueError(f"session {session_id} is a {record.mode} session, not a search")
        budget = int((record.budget or {})["search"]["budget"])
    last = [""]

    def show() -> None:
        with Session(engine) as s:
            graph, _, _ = load_graph(s, session_id)
        line = search_progress_line(session_id, graph, budget)
        if line != last[0] and not quiet:
            err_console.print(line, soft_wrap=True)
        last[0] = line

    run_until_settled(engine, settings, session_id, kinds=(NODE_JOB,), workers=max(1, settings.eval_workers),
                      on_poll=show)
    with Session(engine) as s:
        result = outcome(s, session_id)
        graph, candidates, evaluations = load_graph(s, session_id)
        target = sessions.get_session(s, session_id=session_id).target
        beyond = {n.id for n in graph.nodes if n.infeasible}  # said apart: they cost no evaluation
        failures = render.failure_counts(
            [(e.verdict, e.stage, e.error_kind) for cid, e in evaluations.items() if cid not in beyond]
            + [("failed", "generate", str(c.meta["error"]).split(":")[0]) for c in candidates.values()
               if (c.meta or {}).get("error")])
    picture = render_search_graph(graph, settings.artifacts_dir / "sessions" / session_id / "search_graph.png",
                                  title=f"{result.task} on {target}: {result.strategy} search, {result.evaluations} "
                                        "evaluations")
    return {**result.to_json(), "target": target, "graph_png": str(picture), "failures": failures}


@_app.command("search")
def search_command(
    task: Annotated[Path | None, typer.Option("--task", help="Task directory.")] = None,
    strategy: Strategy = "beam",
    budget: Budget = 12,
    width: Width = 2,
    seed: Annotated[Path | None, typer.Option("--seed", help="Start from this kernel (for example the team's "
                                              "current one) instead of one the brain writes.")] = None,
    brain: Brain = None,
    target: Target = None,
    resume: Annotated[str | None, typer.Option("--resume", help="Go on with this search session (after a crash or "
                                               "Ctrl-C) instead of starting one.")] = None,
    as_json: AsJson = False,
) -> None:
    """Search a graph of candidates: expand the best ones along the strategy library, evaluate each distinct
    program once, keep the best."""

    def run() -> int:
        if resume:
            from storage.connect import open_database

            summary = _run_to_end(open_database(get_settings()), resume, quiet=as_json)
        elif task is None:
            raise ValueError("search needs --task DIR (or --resume SESSION)")
        else:
            summary = _search_one(task, strategy=strategy, budget=budget, width=width, brain=brain, seed=seed,
                                  target=target, quiet=as_json)
        if as_json:
            print(json.dumps(summary, indent=1))
        else:
            console.print(render.search_result_line(summary), soft_wrap=True)
        return 0

    run_command(run, as_json=as_json)


@_app.command("demo")
def demo_command(
    task: Annotated[str, typer.Option("--task", help="A suite task (a directory name under tasks/).")] =
    "matmul_softmax",
    budget: Budget = 8,
    brain: Annotated[str, typer.Option("--brain", help="offline | anthropic")] = "offline",
    target: Target = None,
    as_json: AsJson = False,
) -> None:
    """The main job on the embedded default: the offline brain writes a kernel for a suite task, the beam search
    tunes it (SQLite, a runner in this process), and the result is shown against the XLA reference."""

    def run() -> int:
        from tpu_runner.tasks import TaskError

        task_dir = REPO_TASKS / task
        if not (task_dir / "kernel_task.yaml").is_file():
            known = sorted(p.parent.name for p in REPO_TASKS.glob("*/kernel_task.yaml"))
            raise TaskError(f"no suite task {task!r}; the suite has {', '.join(known)}")
        settings = get_settings()
        (err_console if as_json else console).print(
            f"kernelbot demo: the {brain} brain writes a Pallas kernel for [bold]{task}[/bold], a beam search tunes "
            f"it ({budget} evaluations; data in {settings.home})")
        summary = _search_one(task_dir, strategy="beam", budget=budget, width=2, brain=brain, seed=None,
                              target=target, quiet=False)  # progress on stderr either way
        if as_json:
            print(json.dumps(summary, indent=1))
        else:
            console.print(render.search_summary_table(summary))
        return 0 if summary["verdict"] == "ok" else 1

    run_command(run, as_json=as_json)


def _suite_tasks(suite: Path) -> list[Path]:
    from tpu_runner.tasks import TaskError, discover_tasks

    if not suite.is_dir():
        raise TaskError(f"{suite} is not a directory of tasks")
    found = discover_tasks(suite)
    if not found:
        raise TaskError(f"{suite} holds no task directories (each needs a kernel_task.yaml, or a JAXBench "
                        "baseline.py)")
    return found


@_app.command("bench")
def bench_command(
    suite: Annotated[Path, typer.Option("--suite", help="A directory of task directories.")],
    mode: Annotated[str, typer.Option("--mode", help="search | auto")] = "search",
    strategy: Strategy = "beam",
    budget: Budget = 8,
    width: Width = 2,
    brain: Brain = None,
    only: Annotated[list[str] | None, typer.Option("--only", help="Run only these tasks (repeatable).")] = None,
    seed_solutions: Annotated[bool, typer.Option("--seed-solutions", help="Search from each task's "
                                                 "solutions/pallas.py (a person's kernel) instead of the brain's.")
                              ] = False,
    target: Target = None,
    as_json: AsJson = False,
) -> None:
    """Run a paradigm over every task of a suite and report the paper's figures: compiled, correct, geometric
    mean speedup (failures and regressions count as 1x), fast_1 and fast_2. In search mode the
    brain writes the seed (or, with --seed-solutions, the task's solutions/pallas.py is the seed)."""

    def run() -> int:
        from agents.brains import BrainUnavailable
        from agents.local import SessionStopped

        if mode not in ("search", "auto"):
            raise ValueError(f"--mode must be search or auto, not {mode!r}")
        entries = []
        for task_dir in _suite_tasks(suite):
            if only and task_dir.name not in only:
                continue
            if not as_json:
                err_console.print(f"[bold]{task_dir.name}[/bold]: {mode}", soft_wrap=True)
            try:
                if mode == "search":
                    seed = task_dir / "solutions" / "pallas.py"
                    entry = _search_one(task_dir, strategy=strategy, budget=budget, width=width, brain=brain,
                                        seed=seed if seed_solutions and seed.is_file() else None, target=target,
                                        quiet=as_json)
                else:
                    from bot.cli.agents import run_auto

                    entry = run_auto(task_dir, brain=brain, budget=budget, target=target, quiet=as_json)
            except (ValueError, BrainUnavailable, SessionStopped) as exc:  # this task failed; the others still run
                entry = {"task": task_dir.name, "verdict": None, "speedup": None, "method": None,
                         "kernel_path": None, "evaluations": 0, "error": str(exc)}
            entries.append(entry)
        report = {"tasks": entries, "summary": bench_summary(entries)}
        if as_json:
            print(json.dumps(report, indent=1))
        else:
            s = report["summary"]
            for e in entries:
                console.print(render.bench_line(e), soft_wrap=True)
            console.print(f"{s['tasks']} tasks: {s['compiled']} compiled, {s['correct']} correct, geomean speedup "
                          f"x{s['geomean_speedup']:.2f}, fast_1 {s['fast_1']:.0%}, fast_2 {s['fast_2']:.0%}")
        return 0

    run_command(run, as_json=as_json)
