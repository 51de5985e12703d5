"""The sandboxed reference check: `python -m tpu_runner.sandbox.entry LIMITS tpu_runner.tasks.check_child`, then
the request path on stdin (`tpu_runner.tasks.reference_check` starts it).

Imports a task's reference, traces `get_inputs` to abstract shapes, traces `computation` on them with
`jax.eval_shape`, and runs `computation` on `get_test_inputs()` when the task has them. Writes
`reference_check.json` beside the request; the stage in progress is written to `stage` first, so the parent can
say where a reference that hung or was stopped had got to. This process imports code pasted by a person; the
parent never does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np

from tpu_runner.reports import candidate_line
from tpu_runner.tasks.task import (
    Configuration,
    Task,
    TaskError,
    abstract_configurations,
    concrete_configurations,
    has_test_inputs,
    import_reference,
    load_task,
)

_MESSAGE_CHARS = 1500


class ReferenceFailed(Exception):
    def __init__(self, message: str, line: int | None):
        super().__init__(message)
        self.message, self.line = message, line


def describe_outputs(out: Any) -> str:
    """`f32[64,128]`, or `(f32[64], i32[64])` for several outputs."""
    leaves = jax.tree.leaves(out)
    parts = [f"{np.dtype(x.dtype).name}[{','.join(map(str, x.shape))}]" for x in leaves]
    return parts[0] if len(parts) == 1 and not isinstance(out, tuple | list | dict) else f"({', '.join(parts)})"


class Check:
    def __init__(self, task_dir: Path, workdir: Path):
        self.task_dir, self.workdir = task_dir.resolve(), workdir
        self.reference_path = str(self.task_dir / "reference.py")
        self.doing = "loading the task"

    def stage(self, doing: str) -> None:
        self.doing = doing
        (self.workdir / "stage").write_text(doing)

    def failed(self, exc: BaseException) -> ReferenceFailed:
        """One message for a person: what the reference was doing, the exception, and the reference's line."""
        line = candidate_line(exc, self.reference_path)
        text = str(exc) if isinstance(exc, TaskError) else f"{self.doing} raised {type(exc).__name__}: {exc}"
        text = text.replace(f"{self.reference_path}:", "").replace(self.reference_path, "reference.py")
        text = text.replace(str(self.task_dir), "the task").strip()
        if len(text) > _MESSAGE_CHARS:
            text = text[:_MESSAGE_CHARS - 200] + "\n...\n" + text[-180:]
        return ReferenceFailed(f"Line {line}: {text}" if line else text, line)

    def abstract_outputs(self, module: Any, config: Configuration) -> Any:
        args = [jax.ShapeDtypeStruct(a.shape, np.dtype(a.dtype)) for a in config.dynamic]
        out = jax.eval_shape(lambda *dynamic: module.computation(*dynamic, *config.static), *args)
        if not jax.tree.leaves(out):
            raise TypeError(f"computation returned {out!r}, not an array or a tuple of arrays")
        return out

    def run_on(self, module: Any, config: Configuration) -> tuple[Any, bool]:
        fn = jax.jit(module.computation, static_argnums=config.static_argnums)
        out = jax.block_until_ready(fn(*(config.values or ()), *config.static))
        finite = all(bool(np.isfinite(np.asarray(x, dtype=np.float64)).all()) for x in jax.tree.leaves(out)
                     if np.issubdtype(np.asarray(x).dtype, np.inexact))
        return out, finite

    def run(self) -> dict[str, Any]:
        shapes: list[str] = []
        outputs: list[str] = []
        notes: list[str] = []
        tested = 0
        try:
            task: Task = load_task(self.task_dir)
            self.stage("importing the reference")
            module = import_reference(task)
            self.stage("get_inputs()")
            configs = abstract_configurations(task)
            for i, config in enumerate(configs):
                self.stage(f"computation on get_inputs()[{i}] ({config.describe()})" if len(configs) > 1
                           else f"computation on get_inputs() ({config.describe()})")
                shapes.append(config.describe())
                outputs.append(describe_outputs(self.abstract_outputs(module, config)))
            if has_test_inputs(task):
                self.stage("get_test_inputs()")
                tests = concrete_configurations(task, "get_test_inputs")
                for i, config in enumerate(tests):
                    self.stage(f"computation on get_test_inputs()[{i}] ({config.describe()})" if len(tests) > 1
                               else f"computation on get_test_inputs() ({config.describe()})")
                    _, finite = self.run_on(module, config)
                    tested += 1
                    if not finite:
                        notes.append(f"computation gives NaN or inf on test input {i} ({config.describe()}): "
                                     "the evaluator skips non-finite cases, so give inputs where it is finite")
        except Exception as exc:  # noqa: BLE001 - every failure of pasted code is the answer, not a crash
            failure = self.failed(exc)
            return {"ok": False, "shapes": shapes, "outputs": outputs, "error": failure.message,
                    "line": failure.line, "tested": tested, "notes": notes}
        return {"ok": True, "shapes": shapes, "outputs": outputs, "error": None, "line": None, "tested": tested,
                "notes": notes}


def main(argv: list[str]) -> int:
    request_path = Path(argv[1])
    request = json.loads(request_path.read_text())
    report = Check(Path(request["task_dir"]), request_path.parent).run()
    tmp = request_path.with_name("reference_check.json.tmp")
    tmp.write_text(json.dumps(report))
    tmp.replace(request_path.with_name("reference_check.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
