"""`kernelbot port FILE`: a task from a kernel a team already has (a PyTorch module, CUDA C++ or Triton source)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from bot.cli.common import AsJson, console, err_console, get_settings, run_command

_app = typer.Typer()


def register(app: typer.Typer) -> None:
    for command in _app.registered_commands:
        app.registered_commands.append(command)


PORT_HELP = (
    "Turn a kernel you already have into a task (reference.py + kernel_task.yaml) that every agent and /kernel new "
    "can start from.\n\n"
    "A PyTorch file in KernelBench's format (class Model(nn.Module), get_inputs(), get_init_inputs()) is ported "
    "exactly through torchax and checked against PyTorch; no LLM is needed. A CUDA C++ (.cu/.cuh, __global__) or "
    "Triton (@triton.jit) source is read by an LLM brain, which writes the JAX reference: with --torch-reference "
    "(the PyTorch module of the same operation) it must match PyTorch before the task is written; without, the "
    "task is written marked not verified by an oracle.\n\n"
    "Exits 0 when the task was written, 1 when the port failed (the reason, its kind and line), 2 for bad input "
    "(no such file, a file of no known kind, torch or an LLM brain not available)."
)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def next_steps(task_dir: Path, name: str, home_tasks: Path) -> list[str]:
    steps = [f"kernelbot optimize --task {task_dir}"]
    if task_dir.parent.resolve() == home_tasks.resolve():
        steps.append(f"/kernel new {name}")
    else:
        steps.append(f"/kernel new {name} (once {task_dir.parent} is a suite: KERNELBOT_SUITES or serve --suite)")
    return steps


def render_result(result: dict[str, Any]) -> list[str]:
    """The lines `kernelbot port` prints for a port that wrote its task."""
    lines = [f"ported {result['source']} ({result['kind']}) to the task {result['name']} at {result['task_dir']}"]
    outputs = f" -> {', '.join(result['outputs'])}" if result["outputs"] else ""
    lines.append(f"  computation({', '.join(result['signature'])}){outputs}")
    if result["verified_by"]:
        against = result.get("torch_reference") or result["source"]
        lines.append(f"  matches PyTorch ({against}) through {result['verified_by']}: max |diff| "
                     f"{result['max_abs_err']:.3g}")
    else:
        lines.append("  not verified by an oracle: nothing checked the JAX reference against the original")
    lines += [f"  note: {_one_line(note)}" for note in result["notes"]]
    lines += [f"next: {step}" for step in result["next"]]
    return lines


@_app.command("port", help=PORT_HELP)
def port_command(
    file: Annotated[Path, typer.Argument(help="The PyTorch module (.py), CUDA C++ (.cu) or Triton (.py) source.")],
    name: Annotated[str | None, typer.Option("--name", help="The task's name (default: from the file name, "
                                             "lowercase letters, digits and _).")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Directory the task goes in (default: "
                                             "$KERNELBOT_HOME/tasks, where /kernel new finds it).")] = None,
    torch_reference: Annotated[Path | None, typer.Option("--torch-reference", help="For CUDA/Triton: the PyTorch "
                                                         "module of the same operation, the oracle the JAX "
                                                         "reference must match.")] = None,
    brain: Annotated[str | None, typer.Option("--brain", help="For CUDA/Triton: anthropic | offline (the offline "
                                              "brain cannot read CUDA or Triton; default: anthropic when "
                                              "ANTHROPIC_API_KEY is set).")] = None,
    as_json: AsJson = False,
) -> None:
    def run() -> int:
        from agents.brain import Budget
        from agents.brains import BrainUnavailable
        from agents.porter import LABELS, SourceError, check_name, default_name, detect_kind, port_file, porter_brain
        from agents.porter import read_source as read
        from tpu_runner.porting import PortUnavailable

        settings = get_settings()
        home_tasks = settings.home / "tasks"
        try:
            kind = detect_kind(file, read(file))
            task_name = check_name(name or default_name(file))
            if torch_reference is not None:
                read(torch_reference)
            brain_obj = porter_brain(brain, settings, Budget()) if kind != "pytorch" else None
            result = port_file(file, name=task_name, dest=(out or home_tasks) / task_name, settings=settings,
                               brain=brain_obj, torch_reference=torch_reference)
        except (SourceError, PortUnavailable, BrainUnavailable) as exc:
            err_console.print(f"error: {_one_line(str(exc))}\nnext: {exc.next_step}", markup=False,
                              highlight=False, soft_wrap=True)
            return 2
        report = {**result.to_json(), "kind": LABELS.get(kind, "PyTorch"), "source": file.name,
                  "torch_reference": torch_reference.name if torch_reference else None,
                  "next": next_steps(result.task_dir, task_name, home_tasks) if result.task_dir else []}
        if as_json:
            print(json.dumps(report, indent=1))
        elif result.ok:
            console.print("\n".join(render_result(report)), markup=False, highlight=False, soft_wrap=True)
        if not result.ok:
            error = result.error
            where = f", line {error.line}" if error and error.line else ""
            for note in result.notes:
                err_console.print(f"note: {_one_line(note)}", markup=False, highlight=False, soft_wrap=True)
            err_console.print(f"error: porting {file.name} failed ({error.kind if error else 'failed'}{where}): "
                              f"{_one_line(error.message) if error else 'no reason given'}", markup=False,
                              highlight=False, soft_wrap=True)
            return 1
        return 0

    run_command(run, as_json=as_json)
