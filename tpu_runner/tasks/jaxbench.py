"""JAXBench's own workload format, read as a task unchanged.

A JAXBench workload is a directory with `baseline.py` (and often `optimized.py`): a `CONFIG` dict, a
`create_inputs(dtype=...)` that builds the inputs, `workload(*inputs)` that computes the result, and optionally
`get_flops()`. Its harness runs them with bf16 inputs. Here such a directory is a task whose reference is
`baseline.py`: `computation` is `workload`, and `get_inputs()` is `create_inputs(dtype=bfloat16)` with the
arrays as dynamic arguments and anything else (Python scalars) as static ones. Nothing here runs task code
except `adapt`, which is called where the reference is imported (a sandboxed child).
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

from tpu_runner.tasks.pysource import parse as parse_source

BASELINE = "baseline.py"
# bf16 results of long reductions differ from an f64 truth by a few bf16 ulps (2^-8 each).
DEFAULT_TOLERANCE = 2e-2


def is_workload(root: Path) -> bool:
    return (root / BASELINE).is_file() and not (root / "kernel_task.yaml").is_file()


def literal_config(source: str) -> dict[str, Any]:
    """CONFIG as written, when it is a literal (read without running the module); {} otherwise."""
    try:
        tree = parse_source(source)
    except SyntaxError:
        return {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CONFIG" for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}
    return {}


def description(source: str, config: dict[str, Any]) -> str:
    try:
        doc = ast.get_docstring(parse_source(source)) or ""
    except SyntaxError:
        doc = ""
    shapes = ", ".join(f"{k}={v}" for k, v in config.items() if isinstance(v, int | float | str) and k != "name")
    return " ".join(part for part in (doc.strip(), f"({shapes})" if shapes else "") if part)


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def adapt(module: ModuleType) -> None:
    """Give a baseline.py module the reference's interface: computation(*dynamic, *static) and get_inputs()."""
    import jax
    import jax.numpy as jnp

    create, workload = getattr(module, "create_inputs", None), getattr(module, "workload", None)
    if not callable(create) or not callable(workload):
        return  # the reference check names what is missing
    positions: list[bool] = []  # which of create_inputs' values are arrays, in call order

    def get_inputs() -> tuple[list[Any], list[Any]]:
        params = inspect.signature(create).parameters
        made = create(dtype=jnp.bfloat16) if "dtype" in params else create()
        values = list(made) if isinstance(made, tuple | list) else [made]
        positions[:] = [_is_array(v) for v in values]
        return [v for v in values if _is_array(v)], [v for v in values if not _is_array(v)]

    def in_workload_order(args: tuple[Any, ...]) -> list[Any]:
        """(*dynamic, *static) as this project calls a reference, back in create_inputs' order."""
        if not positions:  # learn where create_inputs puts its scalars, without building any array
            jax.eval_shape(get_inputs)
        dynamic, static = iter(args[:sum(positions)]), iter(args[sum(positions):])
        return [next(dynamic) if is_array else next(static) for is_array in positions]

    def called_as_reference(fn: Any) -> Any:
        """A JAXBench `workload` (the baseline's, or an optimized.py candidate's) called as a reference is."""
        return lambda *args: fn(*in_workload_order(args))

    module.get_inputs = get_inputs
    module.computation = called_as_reference(workload)
    module.called_as_reference = called_as_reference
