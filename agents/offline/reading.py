"""The offline brain's reading of a task, done where task code may run: a sandboxed child, never the runner.

A reference pasted in Slack or written by `kernelbot port` is code from a person; the runner holding the
database credentials must not import it. So a child (`python -m tpu_runner.sandbox.entry LIMITS
agents.offline.reading`, through `tpu_runner.sandbox.process.run_one_shot`) traces the reference's programs - at the
production shapes and at `get_test_inputs()` - and, for a program that looks like attention, runs it beside a
plain model of attention on the test inputs. What comes back is data: the programs as JSON (`encode`/`decode`,
no pickle) and the answer of that comparison. The brain recognises families from the data alone.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy, for decoded constants and dtypes
import numpy as np

from agents.offline.attention import Attention, confirm_attention
from agents.offline.expr import NotRecognised
from agents.offline.families import recognise
from agents.offline.program import Draw, Op, Program, Value, trace
from agents.offline.tail import TAIL_PRIMS
from storage.settings import Settings
from tpu_runner.sandbox import run_one_shot
from tpu_runner.tasks import (
    Configuration,
    Task,
    abstract_configurations,
    concrete_configurations,
    has_test_inputs,
    import_reference,
    load_task,
)

READING_VERSION = "6"  # 6: jax.lax dataclasses (a ragged dot's dimension numbers) decoded as themselves


class Opaque:
    """A parameter value that did not survive the trip as itself (its repr stands in, for equality and text)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


def _enums() -> dict[str, type[enum.Enum]]:
    # jax is imported where it is used, here and below, so that importing the offline brain (as agents.brains does
    # in every process that builds a brain) does not load it.
    from jax import lax

    return {"Precision": lax.Precision, "DotAlgorithmPreset": lax.DotAlgorithmPreset}


def _lax_type(name: str) -> Any:
    """A parameter type jax.lax exports under `name` (a ragged dot's RaggedDotDimensionNumbers), or None."""
    from jax import lax

    return getattr(lax, name, None)


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple (dimension numbers)
        return {"namedtuple": type(value).__name__, "fields": {f: _encode(getattr(value, f)) for f in value._fields}}
    if isinstance(value, tuple | list):
        return {"tuple" if isinstance(value, tuple) else "list": [_encode(v) for v in value]}
    if is_dataclass(value) and not isinstance(value, type) and _lax_type(type(value).__name__) is type(value):
        return {"dataclass": type(value).__name__,
                "fields": {f.name: _encode(getattr(value, f.name)) for f in fields(value)}}
    if isinstance(value, enum.Enum) and type(value).__name__ in _enums():
        return {"enum": type(value).__name__, "name": value.name}
    if isinstance(value, np.dtype) or type(value).__name__ in ("dtype", "DType") or isinstance(value, type) and \
            issubclass(value, np.generic):
        return {"dtype": np.dtype(value).name}
    return {"opaque": repr(value)}


def _decode(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    if "tuple" in value:
        return tuple(_decode(v) for v in value["tuple"])
    if "list" in value:
        return [_decode(v) for v in value["list"]]
    if "enum" in value:
        return _enums()[value["enum"]][value["name"]]
    if "dtype" in value:
        return np.dtype(value["dtype"]) if value["dtype"] != "bfloat16" else np.dtype("bfloat16")
    if "dataclass" in value:
        cls = _lax_type(value["dataclass"])
        fields_ = {k: _decode(v) for k, v in value["fields"].items()}
        return cls(**fields_) if cls is not None else Opaque(f"{value['dataclass']}({fields_})")
    if "namedtuple" in value:
        from jax import lax

        cls = getattr(lax, value["namedtuple"], None)
        fields = {k: _decode(v) for k, v in value["fields"].items()}
        return cls(**fields) if cls is not None else tuple(fields.values())
    return Opaque(value["opaque"])


def _arg(a: Any) -> Any:
    return {"value": a.id, "shape": list(a.shape), "dtype": a.dtype} if isinstance(a, Value) else a


def _unarg(a: Any) -> Any:
    return Value(a["value"], tuple(a["shape"]), a["dtype"]) if isinstance(a, dict) else a


def _op(op: Op) -> dict[str, Any]:
    return {"prim": op.prim, "args": [_arg(a) for a in op.args], "out": _arg(op.out),
            "params": {k: _encode(v) for k, v in op.params.items()}}


def _unop(o: dict[str, Any]) -> Op:
    return Op(o["prim"], tuple(_unarg(a) for a in o["args"]), {k: _decode(v) for k, v in o["params"].items()},
              _unarg(o["out"]))


def encode(program: Program) -> dict[str, Any]:
    return {"inputs": [_arg(v) for v in program.inputs], "ops": [_op(op) for op in program.ops],
            "outputs": [_arg(a) for a in program.outputs], "static": _encode(tuple(program.static)),
            "given": program.given,
            "drawn": [{"again": _arg(v)} if isinstance(v, Value) else _array(v) for v in program.drawn],
            "draws": {str(k): asdict(d) for k, d in program.draws.items()},
            "prologue": [_op(op) for op in program.prologue]}


def _array(value: Any) -> dict[str, Any]:
    return {"dtype": np.asarray(value).dtype.name, "shape": list(np.shape(value)),
            "values": np.asarray(value).ravel().tolist()}


def _unarray(data: dict[str, Any]) -> np.ndarray:
    return np.asarray(data["values"], dtype=np.dtype(data["dtype"])).reshape(data["shape"])


def decode(data: dict[str, Any]) -> Program:
    return Program(inputs=[_unarg(v) for v in data["inputs"]], ops=[_unop(o) for o in data["ops"]],
                   outputs=[_unarg(a) for a in data["outputs"]], static=_decode(data["static"]),
                   given=data["given"],
                   drawn=[_unarg(c["again"]) if "again" in c else _unarray(c) for c in data["drawn"]],
                   draws={int(k): Draw(d["fn"], tuple(d["key_data"]), tuple(d["shape"]), d["dtype"],
                                       tuple(d["extra"])) for k, d in data["draws"].items()},
                   prologue=[_unop(o) for o in data["prologue"]])


@dataclass(frozen=True)
class Reading:
    """What the offline brain knows of a task: its programs and, for attention, whether the numbers agree."""

    task_digest: str
    programs: list[Program]  # at the production shapes, one per configuration
    tests: list[Program]  # at get_test_inputs(), one per configuration
    attention_check: str | None  # None: not attention-like; "agrees", or why the numbers do not


# --- the child --------------------------------------------------------------------------------------------------


CONFIRM_ELEMENTS = 1 << 25  # the most input elements a derived configuration for the attention check may have


def _small_configuration(config: Configuration, fn: Any) -> Configuration | None:
    """The smallest configuration derived from a production one that the reference accepts, with drawn values: what
    an attention-like reference is checked on when the task has no get_test_inputs()."""
    import jax

    from tpu_runner.checking import derived_candidates, free_axes, reference_form
    from tpu_runner.tasks import Case, case_inputs

    try:
        free = free_axes(config, fn, reference_form(config, fn))
    except Exception:  # noqa: BLE001 - the reference's own trace failing: no axis is known to be free
        free = set()
    for small in derived_candidates(config, {}, [None] * len(config.dynamic), CONFIRM_ELEMENTS, free):
        try:
            jax.eval_shape(lambda *dyn, c=small: fn(*dyn, *c.static),
                           *[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in small.dynamic])
        except Exception:  # noqa: BLE001 - a shape the reference refuses is no check shape
            continue
        values = case_inputs(small, Case("confirm", "normal", 7))
        return Configuration(small.dynamic, small.static, tuple(values or ()))
    return None


def _read(task_dir: str) -> dict[str, Any]:
    task = load_task(task_dir)
    abstract = abstract_configurations(task)
    programs = [trace(task, c, TAIL_PRIMS) for c in abstract]
    tests = concrete_configurations(task, "get_test_inputs") if has_test_inputs(task) else []
    test_programs = [trace(task, c, TAIL_PRIMS) for c in tests]
    check = None
    try:
        spec = recognise(programs[0])
    except (NotRecognised, NotImplementedError):
        spec = None
    if isinstance(spec, Attention):
        fn = import_reference(task).computation
        config = tests[0] if tests else _small_configuration(abstract[0], fn)
        if config is None or config.values is None:
            check = "attention-like, but no small inputs the reference accepts could be made to confirm it on"
        else:
            try:
                confirm_attention(fn, spec, list(config.values), config.static)
                check = "agrees"
            except NotRecognised as exc:
                check = str(exc)
    return {"digest": task.digest, "programs": [encode(p) for p in programs],
            "tests": [encode(p) for p in test_programs], "attention_check": check}


def main(argv: list[str]) -> int:
    request_path = Path(argv[1])
    request = json.loads(request_path.read_text())
    out: dict[str, Any] = {}
    for task_dir in request["task_dirs"]:
        try:
            out[task_dir] = {"ok": True, **_read(task_dir)}
        except Exception as exc:  # noqa: BLE001 - the answer for that task, said as such
            out[task_dir] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:1500]}"}
    tmp = request_path.with_name("reading.json.tmp")
    tmp.write_text(json.dumps(out))
    tmp.replace(request_path.with_name("reading.json"))
    return 0


def reading_key(digest: str) -> str:
    import jax

    return hashlib.sha256(f"{digest}-{jax.__version__}-{READING_VERSION}".encode()).hexdigest()[:20]


# --- the runner's side -------------------------------------------------------------------------------------------


def read_tasks(tasks: list[Task], settings: Settings) -> dict[str, Reading]:
    """Each task's reading by digest, from the cache or one sandboxed child for all that are missing.

    Raises NotRecognised for a task whose program cannot be read (with the child's reason)."""
    cache = settings.cache_dir / "offline"
    cache.mkdir(parents=True, exist_ok=True)
    missing = [t for t in tasks if not (cache / f"{reading_key(t.digest)}.json").is_file()]
    if missing:
        outcome, report = run_one_shot(module="agents.offline.reading", root=settings.sandbox_dir,
                                       prefix="reading", limits=settings.limits, report_name="reading.json",
                                       request_for=lambda _: {"task_dirs": [str(t.path) for t in missing]})
        if report is None:
            stop = outcome.why_stopped(wall_seconds=settings.limits.wall_seconds,
                                       memory_mib=settings.limits.memory_mib, tail_lines=6)
            raise NotRecognised(f"the child reading the reference's program {stop.how} ({stop.doing}):\n{stop.tail}")
        for task in missing:
            entry = report[str(task.path)]
            if not entry["ok"]:
                raise NotRecognised(f"the reference's program cannot be read: {entry['error']}")
            tmp = cache / f"{reading_key(task.digest)}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(entry))
            tmp.replace(cache / f"{reading_key(task.digest)}.json")
    out = {}
    for task in tasks:
        data = json.loads((cache / f"{reading_key(task.digest)}.json").read_text())
        out[task.digest] = Reading(task_digest=task.digest, programs=[decode(p) for p in data["programs"]],
                                   tests=[decode(p) for p in data["tests"]], attention_check=data["attention_check"])
    return out


def read_task(task: Task, settings: Settings) -> Reading:
    return read_tasks([task], settings)[task.digest]


if __name__ == "__main__":
    sys.exit(main(sys.argv))
