"""What `kernelbot tasks` shows: shapes, dtypes, FLOPs and bytes (XLA cost analysis of the reference compiled
for the target) and the roofline class. The reference runs in its sandboxed child and compiles on the compile
servers, so the figures are the evaluator's own, from the same caches."""

from __future__ import annotations

import os
from dataclasses import dataclass

from storage.settings import Settings
from tpu_runner.compiler import CompileService
from tpu_runner.hardware import ChipSpec, roofline
from tpu_runner.reference import reference_store
from tpu_runner.tasks import Task, config_from_json


@dataclass(frozen=True)
class TaskInfo:
    task_id: str
    family: str | None
    description: str
    target: str
    configurations: list[str]
    has_test_inputs: bool
    flops: float
    bytes: float  # XLA's bytes accessed for the reference as it compiles
    compulsory_bytes: float  # inputs read once and outputs written once: what the roofline uses
    roofline_ms: float
    bound: str
    intensity: float


def prepare_libtpu_env(chip: ChipSpec) -> None:
    # Only effective before libtpu starts; keeps its start-up quiet and offline on a host without a TPU.
    for key, value in {"TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": f"{chip.name}-1",
                       "TPU_WORKER_HOSTNAMES": "localhost", "TPU_WORKER_ID": "0",
                       "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}.items():
        os.environ.setdefault(key, value)


def task_info(task: Task, chip: ChipSpec, settings: Settings, compilers: CompileService) -> TaskInfo:
    store = reference_store(settings)
    production, _ = store.programs(task)
    configs = [config_from_json(c) for c in production]
    # Cost analysis needs no static cycle profile (much slower on some programs); the evaluator makes its own.
    costs = store.costs(task, target=chip.name, mode=settings.static_profile, compilers=compilers, profile=False)
    flops = sum(c.cost.get("flops", 0.0) for c in costs)
    bytes_ = sum(c.cost.get("bytes accessed", 0.0) for c in costs)
    compulsory = sum(sum(a.nbytes for a in config.dynamic) + c.memory.get("output_size_in_bytes", 0)
                     for config, c in zip(configs, costs, strict=True))
    dtype = configs[0].dynamic[0].dtype if configs and configs[0].dynamic else "float32"
    roof = roofline(chip, flops=flops, bytes_moved=compulsory, dtype_name=dtype)
    has_tests = "def get_test_inputs" in task.reference_source
    return TaskInfo(task_id=task.task_id, family=task.family, description=task.description, target=chip.name,
                    configurations=[c.describe() for c in configs], has_test_inputs=has_tests,
                    flops=flops, bytes=bytes_, compulsory_bytes=compulsory, roofline_ms=roof.seconds * 1e3,
                    bound=roof.bound, intensity=roof.intensity)
