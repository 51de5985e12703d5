"""What the sub-agents are told about a task and its target."""

from __future__ import annotations

from agents.subagents import TaskContext
from tpu_runner.hardware import ChipSpec
from tpu_runner.tasks import Task, abstract_configurations


def task_context(task: Task, chip: ChipSpec) -> TaskContext:
    configs = abstract_configurations(task)
    signature = "; ".join(f"computation({c.describe()})" for c in configs)
    hardware = (f"{chip.name}: peak {chip.peak_flops['bf16'] / 1e12:.0f} TFLOP/s bf16, HBM "
                f"{chip.hbm_bandwidth / 1e9:.0f} GB/s, VMEM {chip.vmem_bytes / 2**20:.0f} MiB per core. "
                f"Tolerances: atol {task.atol[0]}, rtol {task.rtol[0]}. {task.description}")
    return TaskContext(task_id=task.task_id, reference_source=task.reference_source, signature=signature,
                       target=chip.name, hardware=hardware)
