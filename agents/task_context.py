"""What the sub-agents are told about a task and its target."""

from __future__ import annotations

from collections.abc import Sequence

from agents.subagents import TaskContext
from storage.settings import Settings
from tpu_runner.hardware import ChipSpec
from tpu_runner.reference import production_configurations
from tpu_runner.tasks import Configuration, Task


def task_context(task: Task, chip: ChipSpec, settings: Settings, *,
                 configs: Sequence[Configuration] | None = None) -> TaskContext:
    """The task's shapes come from the reference's sandboxed child: this process never runs the task's code.
    `configs`: those shapes, when the caller has them already (a job asks the child once)."""
    if configs is None:
        configs = production_configurations(task, settings)
    signature = "; ".join(f"computation({c.describe()})" for c in configs)
    hardware = (f"{chip.name}: peak {chip.peak_flops['bf16'] / 1e12:.0f} TFLOP/s bf16, HBM "
                f"{chip.hbm_bandwidth / 1e9:.0f} GB/s, VMEM {chip.vmem_bytes / 2**20:.0f} MiB per core. "
                f"Tolerances: atol {task.atol[0]}, rtol {task.rtol[0]}. {task.description}")
    return TaskContext(task_id=task.task_id, reference_source=task.reference_source, signature=signature,
                       target=chip.name, hardware=hardware)
