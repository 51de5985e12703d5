"""Assembling a session loop from its parts, the same way for every caller (terminal commands and runner jobs)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Engine

from agents.auto import AutoLoop
from agents.auto_decide import AutoConfig
from agents.brain import Brain
from agents.task_context import task_context
from storage.settings import Settings
from tpu_runner.candidate import SparePool
from tpu_runner.evaluation import EvalRequest, KernelSource
from tpu_runner.evaluation.evaluate import evaluate
from tpu_runner.hardware import ChipSpec
from tpu_runner.tasks import Configuration, Task


def build_loop(machine: type[AutoLoop], *, engine: Engine, brain: Brain, task: Task, chip: ChipSpec,
               settings: Settings, session_id: str, config: AutoConfig,
               on_step: Callable[[str, dict[str, Any]], None] | None = None,
               spares: SparePool | None = None, configs: Sequence[Configuration] | None = None) -> AutoLoop:
    """An Auto loop or a HITL machine for this session, evaluating its candidates with the evaluator: the loaded
    task and each candidate's code go to it as they are. `configs`: the task's production configurations, when the
    caller has them already."""
    return machine(engine=engine, brain=brain, ctx=task_context(task, chip, settings, configs=configs), config=config,
                   on_step=on_step, workdir=settings.artifacts_dir / "sessions" / session_id,
                   evaluate=lambda code, on_stage=None: evaluate(EvalRequest(task, KernelSource(code), chip.name),
                                                                 settings, spares=spares, on_stage=on_stage))
