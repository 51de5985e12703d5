"""KernelBench-style JAX modules, read as a task unchanged (and as a candidate).

Such a module is one `.py` file: module-level sizes, `class Model` whose `__init__(*get_init_inputs())` builds
the weights and whose `forward(*inputs)` computes the result, `get_inputs()` returning a list of inputs and
`get_init_inputs()` returning the constructor's arguments. A candidate in the same form defines `ModelNew` (or
`Model`) with the same `forward`. Here the module is a task whose reference calls `Model(*get_init_inputs())
.forward` on the inputs, every input dynamic: a Python number among them becomes a 0-d array, as `jax.jit` would
trace it. The model is built once per process, outside the traced function. Nothing here runs task code except
`adapt` and `candidate_computation`, called where the module is imported (a sandboxed child).
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType
from typing import Any

from tpu_runner.tasks.pysource import parse as parse_source

MODEL_CLASSES = ("ModelNew", "Model")  # a candidate's class first: KernelBench names the rewrite ModelNew
FORWARD = ("forward", "__call__")
# KernelBench compares with atol = rtol = 1e-2.
DEFAULT_TOLERANCE = 1e-2


def _classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def forward_of(cls: ast.ClassDef) -> ast.FunctionDef | None:
    return next((m for name in FORWARD for m in cls.body if isinstance(m, ast.FunctionDef) and m.name == name), None)


def model_forward(tree: ast.Module) -> tuple[ast.ClassDef, ast.FunctionDef] | None:
    """The module's model class (ModelNew, else Model) and its forward method, when it has one."""
    classes = _classes(tree)
    for name in MODEL_CLASSES:
        if name in classes:
            forward = forward_of(classes[name])
            if forward is not None:
                return classes[name], forward
    return None


def forward_params(forward: ast.FunctionDef) -> int | None:
    """Positional parameters of `forward` besides self, None for *args."""
    args = forward.args
    return None if args.vararg else len(args.posonlyargs) + len(args.args) - 1


def is_module_task(path: Path) -> bool:
    """A `.py` file with `class Model` (with forward), `get_inputs()` and `get_init_inputs()`, read, not run."""
    if path.suffix != ".py" or not path.is_file():
        return False
    try:
        tree = parse_source(path.read_text())
    except (SyntaxError, UnicodeDecodeError, OSError):
        return False
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    return "Model" in _classes(tree) and forward_of(_classes(tree)["Model"]) is not None and \
        {"get_inputs", "get_init_inputs"} <= functions


def description(source: str, name: str) -> str:
    try:
        doc = ast.get_docstring(parse_source(source)) or ""
    except SyntaxError:
        doc = ""
    return doc.strip().splitlines()[0] if doc.strip() else f"{name} (a KernelBench-style module: Model.forward)"


def _as_input(value: Any) -> Any:
    import jax.numpy as jnp

    return jnp.asarray(value) if isinstance(value, bool | int | float) else value


def _built(module: ModuleType, cls: type, init_inputs: Any) -> Any:
    """One model per process and class, built outside any traced function (its weights are arrays, not tracers)."""
    import jax

    cache = module.__dict__.setdefault("_kernelbot_models", {})
    if cls not in cache:
        with jax.ensure_compile_time_eval():  # concrete weights even when first asked for inside a trace
            cache[cls] = cls(*init_inputs)
    return cache[cls]


def _forward(model: Any) -> Any:
    return getattr(model, "forward", None) or model


def adapt(module: ModuleType) -> None:
    """Give a KernelBench-style module the reference's interface: computation(*inputs) and get_inputs()."""
    cls, make, init = getattr(module, "Model", None), getattr(module, "get_inputs", None), \
        getattr(module, "get_init_inputs", None)
    if cls is None or not callable(make) or not callable(init):
        return  # the reference check names what is missing

    def get_inputs() -> tuple[list[Any], list[Any]]:
        return [_as_input(v) for v in make()], []

    def computation(*inputs: Any) -> Any:
        return _forward(_built(module, cls, init()))(*inputs)

    module.get_inputs = get_inputs
    module.computation = computation


def candidate_computation(candidate: ModuleType, reference: ModuleType) -> Any:
    """A candidate module in KernelBench's form as a computation: its ModelNew (or Model), built with its own
    get_init_inputs() when it has one, else the task's, and its forward on the inputs."""
    cls = next(getattr(candidate, name) for name in MODEL_CLASSES if isinstance(getattr(candidate, name, None), type))
    init = getattr(candidate, "get_init_inputs", None) or getattr(reference, "get_init_inputs", None)
    init_inputs = init() if callable(init) else []

    def computation(*inputs: Any) -> Any:
        return _forward(_built(candidate, cls, init_inputs))(*inputs)

    return computation
