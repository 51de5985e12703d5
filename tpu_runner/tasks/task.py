"""Kernel tasks in the JaxBench format: a directory with `reference.py` and `kernel_task.yaml`; a JAXBench
workload directory (`baseline.py`, see `jaxbench.py`); or a KernelBench-style module, one `.py` file with
`class Model` (see `kernelbench.py`) - each read unchanged.

`load_task` reads a task without running any of its code (safe in any process). Running the reference
(`import_reference`, `concrete_configurations`) happens only where JAX is wanted: the evaluation child and
`kernelbot tasks`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from storage.errors import KernelbotError
from tpu_runner.tasks import jaxbench, kernelbench
from tpu_runner.tasks.entry_point import reference_param_count

KNOWN_FAMILIES = ("elementwise", "row_reduction", "matmul", "matmul_epilogue", "batched_matmul", "attention",
                  "scan", "convolution")


class TaskError(KernelbotError, ValueError):
    """A task directory that cannot be used; the message says what to fix."""
    next_step = ("check the task directory (reference.py + kernel_task.yaml, or baseline.py); `kernelbot tasks` "
                 "(`/kernel tasks` in Slack) lists the valid ones")


@dataclass(frozen=True)
class Task:
    task_id: str
    description: str
    path: Path
    atol: tuple[float, ...]  # one per configuration, or a single value for all
    rtol: tuple[float, ...]
    family: str | None
    allow_pure_jax: bool
    allow_input_output_aliases: bool
    input_gen_code: str | None
    reference_source: str
    digest: str  # content hash of reference.py + kernel_task.yaml
    reference_file: str = "reference.py"  # baseline.py for a JAXBench workload

    @property
    def reference_path(self) -> Path:
        return self.path if self.is_module else self.path / self.reference_file

    @property
    def is_module(self) -> bool:
        """A KernelBench-style module: the task is the file itself."""
        return self.path.suffix == ".py"

    @property
    def param_count(self) -> int | None:
        return reference_param_count(self.reference_source)

    def tolerance(self, config_index: int) -> tuple[float, float]:
        pick = min(config_index, len(self.atol) - 1), min(config_index, len(self.rtol) - 1)
        return self.atol[pick[0]], self.rtol[pick[1]]


def _yaml_number(value: Any) -> Any:
    """A number YAML 1.1 reads as text: `1e-2` (no dot, as people write it) is the string '1e-2' to PyYAML."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _tolerances(raw: Any, name: str, where: Path) -> tuple[float, ...]:
    values = raw if isinstance(raw, list) else [raw]
    if not values:
        raise TaskError(f"{where}: '{name}' is an empty list; give a number or one per configuration")
    out: list[float] = []
    for value in values:
        value = _yaml_number(value)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise TaskError(f"{where}: '{name}' must be a non-negative number (or a list of them), got {value!r}")
        out.append(float(value))
    return tuple(out)


def load_task(path: str | Path) -> Task:
    root = Path(path).expanduser().resolve()
    if root.suffix == ".py" and root.is_file():
        return _load_module(root)
    if not root.is_dir():
        raise TaskError(f"task directory {root} does not exist")
    if jaxbench.is_workload(root):
        return _load_workload(root)
    ref = root / "reference.py"
    meta_path = root / "kernel_task.yaml"
    missing = [p.name for p in (ref, meta_path) if not p.is_file()]
    if missing:
        raise TaskError(f"{root} is not a task: missing {', '.join(missing)} "
                        "(a task is a directory with reference.py and kernel_task.yaml, or a JAXBench workload "
                        "with baseline.py)")
    meta_text = meta_path.read_text()
    try:
        meta = yaml.safe_load(meta_text)
    except yaml.YAMLError as exc:
        raise TaskError(f"{meta_path}: not valid YAML: {exc}") from None
    if not isinstance(meta, dict):
        raise TaskError(f"{meta_path}: expected a mapping with task_id, description, atol, rtol")
    for key in ("atol", "rtol"):
        if key not in meta:
            raise TaskError(f"{meta_path}: missing '{key}' (the correctness tolerance is required)")
    family = meta.get("family")
    if family is not None and family not in KNOWN_FAMILIES:
        raise TaskError(f"{meta_path}: family {family!r} is not one of {', '.join(KNOWN_FAMILIES)}")
    source = ref.read_text()
    try:
        compile(source, str(ref), "exec")
    except SyntaxError as exc:
        raise TaskError(f"{ref}:{exc.lineno}: syntax error in the reference: {exc.msg}") from None
    return Task(
        task_id=str(meta.get("task_id") or root.name),
        description=str(meta.get("description") or "").strip(),
        path=root,
        atol=_tolerances(meta["atol"], "atol", meta_path),
        rtol=_tolerances(meta["rtol"], "rtol", meta_path),
        family=family,
        allow_pure_jax=bool(meta.get("allow_pure_jax", False)),
        allow_input_output_aliases=bool(meta.get("allow_input_output_aliases", False)),
        input_gen_code=meta.get("input_gen_code"),
        reference_source=source,
        digest=hashlib.sha256(source.encode() + b"\0" + meta_text.encode()).hexdigest()[:16],
    )


def _load_workload(root: Path) -> Task:
    ref = root / jaxbench.BASELINE
    source = ref.read_text()
    try:
        compile(source, str(ref), "exec")
    except SyntaxError as exc:
        raise TaskError(f"{ref}:{exc.lineno}: syntax error in the workload: {exc.msg}") from None
    config = jaxbench.literal_config(source)
    tolerance = (float(config.get("atol", jaxbench.DEFAULT_TOLERANCE)),), (
        float(config.get("rtol", jaxbench.DEFAULT_TOLERANCE)),)
    return Task(task_id=str(config.get("name") or root.name), description=jaxbench.description(source, config),
                path=root, atol=tolerance[0], rtol=tolerance[1], family=None, allow_pure_jax=False,
                allow_input_output_aliases=False, input_gen_code=None, reference_source=source,
                digest=hashlib.sha256(b"jaxbench\0" + source.encode()).hexdigest()[:16],
                reference_file=jaxbench.BASELINE)


def _load_module(path: Path) -> Task:
    source = path.read_text()
    try:
        compile(source, str(path), "exec")
    except SyntaxError as exc:
        raise TaskError(f"{path}:{exc.lineno}: syntax error in the module: {exc.msg}") from None
    if not kernelbench.is_module_task(path):
        raise TaskError(f"{path} is not a task: a module task defines class Model (with forward), get_inputs() and "
                        "get_init_inputs(), as KernelBench's do")
    tolerance = (kernelbench.DEFAULT_TOLERANCE,)
    return Task(task_id=path.stem, description=kernelbench.description(source, path.stem), path=path,
                atol=tolerance, rtol=tolerance, family=None, allow_pure_jax=False, allow_input_output_aliases=False,
                input_gen_code=None, reference_source=source,
                digest=hashlib.sha256(b"kernelbench\0" + source.encode()).hexdigest()[:16], reference_file=path.name)


def _is_task(path: Path) -> bool:
    return (path / "kernel_task.yaml").is_file() or jaxbench.is_workload(path) or kernelbench.is_module_task(path)


def discover_tasks(suite: str | Path, depth: int = 3) -> list[Path]:
    """The tasks of a suite: its task directories and KernelBench-style module files, up to `depth` levels down
    (JAXBench and KernelBench group theirs by kind or level)."""
    root = Path(suite).expanduser().resolve()
    if not root.is_dir():
        raise TaskError(f"suite directory {root} does not exist")
    found: list[Path] = []
    for path in sorted(p for p in root.iterdir() if not p.name.startswith((".", "_"))):
        if _is_task(path):
            found.append(path)
        elif depth > 1 and path.is_dir():
            found.extend(discover_tasks(path, depth - 1))
    return found


# --- running the reference (JAX processes only) -------------------------------------------------------------


@dataclass(frozen=True)
class ArgSpec:
    shape: tuple[int, ...]
    dtype: str
    int_range: tuple[int, int] | None = None  # integer inputs: the task's own min and max
    nonnegative: bool = False  # a float input whose task values are all >= 0 (a variance, a scale): drawn so too

    @property
    def nbytes(self) -> int:
        import numpy as np

        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def describe(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class Configuration:
    dynamic: tuple[ArgSpec, ...]
    static: tuple[Any, ...]
    values: tuple[Any, ...] | None = None  # the task's own arrays, when they were materialised

    @property
    def static_argnums(self) -> tuple[int, ...]:
        start = len(self.dynamic)
        return tuple(range(start, start + len(self.static)))

    def describe(self) -> str:
        parts = [a.describe() for a in self.dynamic] + [repr(s) for s in self.static]
        return ", ".join(parts)


def import_reference(task: Task) -> ModuleType:
    """Import reference.py under a private module name; errors become TaskError."""
    name = f"kernelbot_reference_{task.digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, task.reference_path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        if task.reference_file == jaxbench.BASELINE:
            jaxbench.adapt(module)
        elif task.is_module:
            kernelbench.adapt(module)
        if not hasattr(module, "get_inputs") and task.input_gen_code:
            exec(compile(task.input_gen_code, f"{task.path}/kernel_task.yaml:input_gen_code", "exec"),
                 module.__dict__)
    except Exception as exc:
        raise TaskError(f"{task.reference_path}: importing the reference raised {type(exc).__name__}: {exc}") from exc
    for required in ("computation", "get_inputs"):
        if not callable(getattr(module, required, None)):
            raise TaskError(f"{task.reference_path}: must define {required}()")
    sys.modules[name] = module
    return module


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _is_pair(value: Any) -> bool:
    return (isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2
            and isinstance(value[0], Sequence) and isinstance(value[1], Sequence)
            and all(_is_array(x) for x in value[0]) and not any(_is_array(x) for x in value[1]))


def split_configurations(value: Any, where: str) -> list[tuple[list[Any], list[Any]]]:
    """`(dynamic, static)` or a list of such pairs -> a list of pairs."""
    if _is_pair(value):
        return [(list(value[0]), list(value[1]))]
    if isinstance(value, Sequence) and value and all(_is_pair(v) for v in value):
        return [(list(v[0]), list(v[1])) for v in value]
    raise TaskError(f"{where} must return (dynamic_args, static_args) - a list of arrays and a list of Python "
                    "scalars - or a list of such pairs")


def _call_inputs(module: ModuleType, fn_name: str, task: Task) -> Any:
    try:
        return getattr(module, fn_name)()
    except Exception as exc:
        raise TaskError(f"{task.reference_path}: {fn_name}() raised {type(exc).__name__}: {exc}") from exc


def _spec_of(x: Any, with_range: bool) -> ArgSpec:
    import numpy as np

    dtype = np.dtype(x.dtype)
    rng = None
    if with_range and (np.issubdtype(dtype, np.integer) or dtype == np.bool_) and x.size:
        arr = np.asarray(x)
        rng = (int(arr.min()), int(arr.max()))
    return ArgSpec(tuple(int(d) for d in x.shape), str(dtype), rng)


def concrete_configurations(task: Task, fn_name: str) -> list[Configuration]:
    """Call get_inputs / get_test_inputs for real, keeping the task's own values."""
    module = import_reference(task)
    pairs = split_configurations(_call_inputs(module, fn_name, task), f"{task.reference_path}: {fn_name}()")
    return [Configuration(tuple(_spec_of(x, True) for x in dyn), tuple(static), tuple(dyn)) for dyn, static in pairs]


def abstract_configurations(task: Task) -> list[Configuration]:
    """Shapes of the production inputs without materialising them (get_inputs traced by eval_shape).

    Integer inputs keep no value range here; production configurations are only compiled, never run on CPU.
    """
    import jax

    module = import_reference(task)
    statics: list[list[list[Any]]] = []

    def dynamic_only() -> list[list[Any]]:
        pairs = split_configurations(module.get_inputs(), f"{task.reference_path}: get_inputs()")
        statics.append([s for _, s in pairs])
        return [d for d, _ in pairs]

    try:
        shapes = jax.eval_shape(dynamic_only)
    except TaskError:
        raise
    except Exception:
        # Inputs built with host-side code (numpy RNG, Python loops) cannot be traced: run them for real.
        return [Configuration(c.dynamic, c.static) for c in concrete_configurations(task, "get_inputs")]
    return [Configuration(tuple(_spec_of(x, False) for x in dyn), tuple(static))
            for dyn, static in zip(shapes, statics[0], strict=True)]


def has_test_inputs(task: Task) -> bool:
    return callable(getattr(import_reference(task), "get_test_inputs", None))


SMALL_FLOAT_INPUT = 1 << 20  # float inputs up to this many elements have their sign looked at


def input_bounds(task: Task) -> list[dict[int, Any]]:
    """What the evaluator keeps of the task's own get_inputs() values, per configuration, by argument index: the
    integer (and bool) arrays, and for small float inputs (vectors of weights, variances) whether all are >= 0.

    Computed under jit with only those leaves returned, so the large floating inputs are never built (a
    128k-vocabulary logits matrix is several GB); host-side get_inputs() code has to run for real."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    module = import_reference(task)

    def bound(x: Any) -> Any:
        if _is_integer(x):
            return x
        if jnp.issubdtype(x.dtype, jnp.floating) and x.size <= SMALL_FLOAT_INPUT:  # bf16 too (np's is not)
            return jnp.all(x >= 0)
        return None

    def integer_leaves() -> list[list[Any]]:
        pairs = split_configurations(module.get_inputs(), f"{task.reference_path}: get_inputs()")
        return [[bound(x) for x in dyn] for dyn, _ in pairs]

    try:
        shapes = jax.eval_shape(integer_leaves)
    except TaskError:
        raise
    except Exception:  # host-side code: run it for real
        return [{i: b for i, b in ((i, bound(np.asarray(v))) for i, v in enumerate(c.values or ())) if b is not None}
                for c in concrete_configurations(task, "get_inputs")]
    if not any(x is not None for config in shapes for x in config):
        return [{} for _ in shapes]
    values = jax.jit(integer_leaves)()
    return [{i: np.asarray(x) for i, x in enumerate(config) if x is not None} for config in values]


def _is_integer(x: Any) -> bool:
    import numpy as np

    dtype = np.dtype(x.dtype)
    return bool(np.issubdtype(dtype, np.integer) or dtype == np.bool_)


def with_input_bounds(configs: list[Configuration], bounds: list[dict[int, Any]]) -> list[Configuration]:
    """Production configurations whose integer inputs carry the task's own min and max, and whose small float
    inputs say whether the task's values are all >= 0 (input_bounds)."""
    import jax.numpy as jnp
    import numpy as np

    out = []
    for config, values in zip(configs, bounds, strict=True):
        specs = []
        for i, a in enumerate(config.dynamic):
            value = np.asarray(values[i]) if i in values else None
            if value is None or not value.size:
                specs.append(a)
            elif jnp.issubdtype(np.dtype(a.dtype), jnp.floating):
                specs.append(replace(a, nonnegative=bool(value)))
            else:
                specs.append(replace(a, int_range=(int(value.min()), int(value.max()))))
        out.append(Configuration(tuple(specs), config.static, config.values))
    return out


# --- configurations as JSON, between processes -----------------------------------------------------------------


def _static_to_json(value: Any) -> Any:
    if isinstance(value, tuple):
        return {"tuple": [_static_to_json(v) for v in value]}
    if isinstance(value, list):
        return {"list": [_static_to_json(v) for v in value]}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TaskError(f"static argument {value!r} ({type(value).__name__}) is not a Python scalar, string or tuple")


def _static_from_json(value: Any) -> Any:
    if isinstance(value, dict):
        items = [_static_from_json(v) for v in value.get("tuple", value.get("list", []))]
        return tuple(items) if "tuple" in value else items
    return value


def config_to_json(config: Configuration) -> dict[str, Any]:
    return {"dynamic": [{"shape": list(a.shape), "dtype": a.dtype, "int_range": list(a.int_range)
                         if a.int_range else None, "nonnegative": a.nonnegative} for a in config.dynamic],
            "static": [_static_to_json(s) for s in config.static]}


def config_from_json(data: dict[str, Any]) -> Configuration:
    dynamic = tuple(ArgSpec(tuple(int(d) for d in a["shape"]), str(a["dtype"]),
                            (int(a["int_range"][0]), int(a["int_range"][1])) if a.get("int_range") else None,
                            bool(a.get("nonnegative", False)))
                    for a in data["dynamic"])
    return Configuration(dynamic, tuple(_static_from_json(s) for s in data["static"]))


def with_values(task: Task, config: Configuration, values_from: str | None) -> Configuration:
    """The configuration with the task's own values: `test:J` (get_test_inputs) or `production:I` (get_inputs)."""
    if not values_from:
        return config
    source, _, index = values_from.partition(":")
    fn = "get_test_inputs" if source == "test" else "get_inputs"
    concrete = concrete_configurations(task, fn)[int(index)]
    if tuple(a.shape for a in concrete.dynamic) != tuple(a.shape for a in config.dynamic):
        raise TaskError(f"{task.reference_path}: {fn}() gave other shapes on a second call "
                        f"({concrete.describe()} vs {config.describe()}); it must be deterministic")
    return Configuration(config.dynamic, config.static, concrete.values)
