"""Porting PyTorch modules in the public KernelBench format (tests/corpus/pytorch) to tasks through torchax.

Each module ports to a task whose written reference matches PyTorch - on the module's own weights (the port's
figure) and, checked again here, on the task's own get_inputs() with those weights loaded into the module - and
the ported task then gets an `ok` kernel: the offline brain's where it recognises the family, else a known-good
kernel for the ported signature (tests/corpus/pytorch_kernels). Files that cannot be ported get one clear error
naming the op or line, and nothing is written for them. A JAX reference written by someone else is accepted or
rejected against PyTorch (oracle mode).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import numpy as np
import pytest

from agents import subagents
from agents.brain import Budget
from agents.brains import BrainUnavailable, make_brain
from agents.offline.reading import read_tasks
from agents.task_context import task_context
from storage.settings import Settings
from tests.conftest import CORPUS
from tpu_runner.evaluation import EvalRequest, evaluate_many
from tpu_runner.hardware import get_chip
from tpu_runner.porting import PortResult, check_against_pytorch, identifier, port_pytorch
from tpu_runner.reference import reference_store
from tpu_runner.tasks import Task, import_reference, load_task

MODULES_DIR = CORPUS / "pytorch"
KERNELS_DIR = CORPUS / "pytorch_kernels"
V6E = get_chip("v6e")
PORT_THREADS = 2  # each port is a sandboxed child; the rest of the time is spent waiting for it

# Module -> what writes the kernel evaluated on its ported task: the offline brain (and the family it must
# recognise), or a known-good kernel file in tests/corpus/pytorch_kernels for a family it does not write.
OFFLINE = {"swish_plus_one": "rowwise", "layer_norm": "rowwise", "rms_norm": "rowwise", "softmax": "rowwise",
           "mean_rows": "rowwise", "linear_gelu": "matmul", "matmul_bf16": "matmul", "linear_gelu_sum": "matmul",
           "conv2d_gelu_pool": "convolution", "conv2d_relu": "convolution", "mlp": "matmul"}
KNOWN_GOOD = {"causal_attention": "causal_attention.py",
              "causal_attention_explicit": "causal_attention.py"}
MODULES = sorted(OFFLINE) + sorted(KNOWN_GOOD)
# How close the written reference must be to PyTorch, per output dtype: elementwise as atol and rtol, and the
# port's max |diff| in absolute terms (for bf16, one rounding step of an output between 64 and 128: the bf16 module
# multiplies randn matrices over K=512, so its outputs reach ~100, and PyTorch's CPU bf16 matmul rounds otherwise than
# XLA from torch 2.11 on - one step apart at the largest outputs).
CLOSE = {"float32": 1e-4, "bfloat16": 2e-2}
MAX_ABS_ERR = {"float32": 1e-4, "bfloat16": 2.0**-1}


T = TypeVar("T")


def _in_threads(fn: Callable[[str], T], names: list[str]) -> dict[str, T]:
    with ThreadPoolExecutor(max_workers=PORT_THREADS) as pool:
        return dict(zip(names, pool.map(fn, names), strict=True))


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory, settings: Settings) -> dict[str, PortResult]:
    root = tmp_path_factory.mktemp("ported")
    return _in_threads(lambda name: port_pytorch(MODULES_DIR / f"{name}.py", name=name, dest=root / name,
                                                 settings=settings), MODULES)


def _load_module(path: Path) -> ModuleType:
    name = f"kernelbot_test_port_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _names(result: PortResult) -> tuple[list[str], list[str]]:
    """(forward's input names, weight names) from the port's signature lines `name: dtype[shape] (kind)`."""
    parsed = [re.fullmatch(r"(\w+): \w+\[[\d,]*\] \((input|weight)\)", line) for line in result.signature]
    assert all(parsed), result.signature
    return ([m.group(1) for m in parsed if m and m.group(2) == "input"],
            [m.group(1) for m in parsed if m and m.group(2) == "weight"])


def _against_pytorch(name: str, result: PortResult, task: Task) -> str | None:
    """Run the written reference on the task's get_inputs(), load the weights it drew into the PyTorch module,
    run that on the same inputs, and say what differs (None when they agree)."""
    import jax
    import torch

    module = _load_module(MODULES_DIR / f"{name}.py")
    model = module.Model(*module.get_init_inputs()).eval()
    reference = import_reference(task)
    values, static = reference.get_inputs()
    inputs, weights = _names(result)
    if len(values) != len(inputs) + len(weights) or static:
        return f"get_inputs() gives {len(values)} arrays and {static} for the signature {result.signature}"
    by_name = dict(zip(inputs + weights, values, strict=True))

    def tensor(value: Any) -> Any:
        array = np.asarray(value)
        if array.dtype.name == "bfloat16":
            return torch.from_numpy(array.astype(np.float32)).to(torch.bfloat16)
        return torch.from_numpy(array.copy())

    state = model.state_dict()
    keys = {identifier(key, set()): key for key in state}
    if sorted(keys) != sorted(weights):
        return f"the weights {sorted(weights)} are not the module's state {sorted(state)}"
    model.load_state_dict({keys[w]: tensor(by_name[w]) for w in weights})
    with torch.no_grad():
        want = model(*[tensor(by_name[i]) for i in inputs])
    got = jax.jit(reference.computation)(*values)
    if str(np.asarray(got).dtype) != str(want.dtype).removeprefix("torch."):
        return f"the reference returns {np.asarray(got).dtype}; PyTorch returns {want.dtype}"
    want64 = want.float().numpy().astype(np.float64)
    got64 = np.asarray(got).astype(np.float64)
    if got64.shape != want64.shape:
        return f"the reference's output has shape {got64.shape}; PyTorch's has {want64.shape}"
    tol = CLOSE[str(want.dtype).removeprefix("torch.")]
    diff = np.abs(got64 - want64)
    if not np.all(diff <= tol + tol * np.abs(want64)):
        return f"on the task's get_inputs() the reference differs from PyTorch by up to {diff.max():.3g}"
    return None


@pytest.mark.slow
def test_each_module_ports_to_a_task_that_matches_pytorch(ported: dict[str, PortResult]) -> None:
    problems = {}
    for name in MODULES:
        result = ported[name]
        if not result.ok or result.task_dir is None:
            problems[name] = f"did not port: {result.error}"
            continue
        task = load_task(result.task_dir)
        tol = max(MAX_ABS_ERR[re.match(r"\w+", out).group()] for out in result.outputs)  # type: ignore[union-attr]
        source = task.reference_source
        checks = {
            "task_id is the name given": task.task_id == name,
            f"max |diff| {result.max_abs_err} against PyTorch is within {tol}":
                result.max_abs_err is not None and result.max_abs_err <= tol,
            "verified by the torchax oracle": result.verified_by == "torchax",
            "the reference is pure JAX": "def computation(" in source and not re.search(r"^\s*(import|from) torch",
                                                                                        source, re.MULTILINE),
            "the task says where it came from": f'file: "{name}.py"' in (task.path / "kernel_task.yaml").read_text(),
        }
        failed = [what for what, ok in checks.items() if not ok]
        try:
            mismatch = _against_pytorch(name, result, task)
        except Exception as exc:  # named with the module below, like every other problem
            mismatch = f"checking it against PyTorch raised {type(exc).__name__}: {exc}"
        if failed or mismatch:
            problems[name] = "; ".join(failed + ([mismatch] if mismatch else []))
    assert not problems, problems


@dataclass(frozen=True)
class Candidate:
    name: str
    kernel: Path
    written_by: str  # "offline brain (<family>)" or the known-good file's name


def _candidate(name: str, task: Task, settings: Settings, scratch: Path) -> Candidate:
    if name in KNOWN_GOOD:
        try:
            make_brain("offline", settings, Budget(), task=task, chip=V6E)
        except BrainUnavailable as refusal:
            assert "cannot write a kernel" in str(refusal), f"{name}: {refusal}"
        else:
            pytest.fail(f"{name}: the offline brain now writes a kernel for it; evaluate that one instead of "
                        f"the known-good {KNOWN_GOOD[name]}")
        return Candidate(name, KERNELS_DIR / KNOWN_GOOD[name], KNOWN_GOOD[name])
    brain = make_brain("offline", settings, Budget(), task=task, chip=V6E)
    family = brain.spec.family  # type: ignore[attr-defined]
    assert family == OFFLINE[name], f"{name}: the offline brain took it for {family}, not {OFFLINE[name]}"
    ctx = task_context(task, V6E, settings)
    code = subagents.implement(brain, ctx, subagents.plan(brain, ctx))
    path = scratch / f"{name}.py"
    path.write_text(code)
    return Candidate(name, path, f"offline brain ({family})")


@pytest.mark.slow
def test_each_ported_task_gets_an_ok_kernel(ported: dict[str, PortResult], settings: Settings,
                                            verdict_settings: Settings,
                                            tmp_path: Path) -> None:
    not_ported = {name: str(ported[name].error) for name in MODULES if not ported[name].ok}
    assert not not_ported, not_ported
    tasks = {name: load_task(ported[name].task_dir) for name in MODULES}  # type: ignore[arg-type]
    # Every task's reading and production shapes made in one child each for all 13 (one start-up of Python and JAX,
    # not 26), as a search's describe step does: the brains and task contexts below then find them cached.
    read_tasks(list(tasks.values()), settings)
    assert not reference_store(settings).prefetch(list(tasks.values()))
    with ThreadPoolExecutor(max_workers=PORT_THREADS) as pool:
        candidates = list(pool.map(lambda name: _candidate(name, tasks[name], settings, tmp_path), MODULES))
    results = evaluate_many([EvalRequest(tasks[c.name].path, c.kernel, "v6e") for c in candidates], verdict_settings)
    verdicts = {c.name: f"{c.written_by}: {getattr(r, 'message', repr(r))}"
                for c, r in zip(candidates, results, strict=True)}
    failed = {c.name: verdicts[c.name] for c, r in zip(candidates, results, strict=True)
              if getattr(r, "verdict", None) != "ok" or r.correctness is None  # type: ignore[union-attr]
              or r.correctness.status != "passed"}  # type: ignore[union-attr]
    assert not failed, failed


# --- what cannot be ported -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Bad:
    kind: str
    says: str  # in the message
    at: str | None  # the source text on the line the error names (None: no line)


BAD = {
    "bad_no_model": Bad("no_model", "it has Net; rename the one to port to Model", None),
    "bad_no_get_inputs": Bad("no_get_inputs", "defines no get_inputs()", None),
    "bad_syntax": Bad("syntax", "not valid Python", "y = torch.relu(x"),
    "bad_forward_raises": Bad("module_raised", "mat1 and mat2 shapes cannot be multiplied", "return x @ self.weight"),
    "bad_unsupported_op": Bad("unsupported_op", "no JAX lowering for aten::adaptive_max_pool2d",
                              "return F.adaptive_max_pool2d(x, 4)"),
    "bad_boolean_mask": Bad("data_dependent", "depend on tensor values", "positive = x[x > 0]"),
    "bad_nonzero": Bad("data_dependent", "depend on tensor values", "return torch.nonzero(x > 0.5).float()"),
}


@pytest.fixture
def refused(tmp_path: Path, settings: Settings) -> tuple[Path, dict[str, PortResult]]:
    root = tmp_path / "refused"
    root.mkdir()
    return root, _in_threads(lambda name: port_pytorch(MODULES_DIR / f"{name}.py", name=name, dest=root / name,
                                                       settings=settings), sorted(BAD))


def _line_of(name: str, text: str) -> int:
    lines = (MODULES_DIR / f"{name}.py").read_text().splitlines()
    found = [i + 1 for i, line in enumerate(lines) if line.strip() == text]
    assert len(found) == 1, f"{name}: {text!r} is on lines {found}"
    return found[0]


def test_what_cannot_be_ported_gets_one_clear_error_and_nothing_is_written(
        refused: tuple[Path, dict[str, PortResult]], settings: Settings) -> None:
    root, results = refused
    problems = {}
    for name, bad in sorted(BAD.items()):
        result = results[name]
        error = result.error
        if result.ok or error is None:
            problems[name] = f"ported: {result}"
            continue
        line = _line_of(name, bad.at) if bad.at else None
        wrong = [f"kind {error.kind!r}, not {bad.kind!r}"] if error.kind != bad.kind else []
        wrong += [f"the message does not say {bad.says!r}"] if bad.says not in error.message else []
        wrong += [f"line {error.line}, not {line}"] if error.line != line else []
        wrong += [f"the message does not name line {line}"] if line and f"line {line}" not in error.message else []
        wrong += ["a task directory was written"] if result.task_dir is not None or (root / name).exists() else []
        if wrong:
            problems[name] = f"{'; '.join(wrong)} (got {error.kind}: {error.message})"
    assert not problems, problems
    assert list(root.iterdir()) == [], "failed ports left files where the tasks would have gone"
    assert not list(settings.sandbox_dir.glob("port-*")), "a port's scratch directory was left behind"


@pytest.mark.slow
def test_a_port_does_not_replace_a_different_task(ported: dict[str, PortResult], settings: Settings) -> None:
    taken = ported["softmax"].task_dir
    assert taken is not None, ported["softmax"].error
    before = {p.name: p.read_text() for p in taken.iterdir() if p.is_file()}
    result = port_pytorch(MODULES_DIR / "layer_norm.py", name="softmax", dest=taken, settings=settings)
    assert not result.ok and result.error is not None and result.error.kind == "exists", result
    assert "a different task already lives" in result.error.message
    assert {p.name: p.read_text() for p in taken.iterdir() if p.is_file()} == before


# --- a JAX reference written by someone else, checked against PyTorch --------------------------------------------

ERF_GELU = '''\
import jax


def computation(x, linear_bias, linear_weight):
    return jax.nn.gelu(x @ linear_weight.T + linear_bias, approximate={approximate})
'''


def test_the_oracle_accepts_a_correct_jax_reference_and_rejects_a_subtly_wrong_one(
        tmp_path: Path, settings: Settings) -> None:
    torch_source = MODULES_DIR / "linear_gelu.py"
    exact, tanh = tmp_path / "exact.py", tmp_path / "tanh.py"
    exact.write_text(ERF_GELU.format(approximate=False))
    tanh.write_text(ERF_GELU.format(approximate=True))  # GELU's tanh approximation: off by up to ~5e-4
    checks = _in_threads(lambda which: check_against_pytorch(torch_source, tmp_path / f"{which}.py", settings),
                         ["exact", "tanh"])
    good, bad = checks["exact"], checks["tanh"]
    assert good.ok and good.max_abs_err is not None and good.max_abs_err < 1e-4, good
    assert good.signature[0].startswith("x: float32[256,512]"), good.signature
    assert not bad.ok and bad.error is not None and bad.error.kind == "mismatch", bad
    assert "differs from PyTorch" in bad.error.message and "max |diff|" in bad.error.message, bad.error.message
