"""What `kernelbot tasks` shows: shapes, dtypes, FLOPs and bytes (XLA cost analysis of the reference compiled
for the target) and the roofline class. Cached per task digest, target and JAX version."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tpu_runner.hardware import ChipSpec, roofline
from tpu_runner.tasks import Task, abstract_configurations, has_test_inputs


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


def task_info(task: Task, chip: ChipSpec, cache_dir: Path) -> TaskInfo:
    import jax

    path = cache_dir / "taskinfo" / f"{task.task_id}-{task.digest}-{chip.name}-jax{jax.__version__}-v2.json"
    if path.is_file():
        return TaskInfo(**json.loads(path.read_text()))
    prepare_libtpu_env(chip)
    from tpu_runner.compile import target_sharding, trace
    from tpu_runner.tasks import import_reference

    ref = import_reference(task).computation
    configs = abstract_configurations(task)
    sharding = target_sharding(chip)
    flops = bytes_ = compulsory = 0.0
    for config in configs:
        compiled = trace(ref, config, sharding).lower().compile()
        cost: Any = compiled.cost_analysis() or {}
        flops += float(cost.get("flops", 0.0))
        bytes_ += float(cost.get("bytes accessed", 0.0))
        outputs = compiled.memory_analysis().output_size_in_bytes
        compulsory += sum(a.nbytes for a in config.dynamic) + float(outputs)
    dtype = configs[0].dynamic[0].dtype if configs and configs[0].dynamic else "float32"
    roof = roofline(chip, flops=flops, bytes_moved=compulsory, dtype_name=dtype)
    info = TaskInfo(task_id=task.task_id, family=task.family, description=task.description, target=chip.name,
                    configurations=[c.describe() for c in configs], has_test_inputs=has_test_inputs(task),
                    flops=flops, bytes=bytes_, compulsory_bytes=compulsory, roofline_ms=roof.seconds * 1e3,
                    bound=roof.bound, intensity=roof.intensity)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(info)))
    tmp.replace(path)
    return info
