"""The LLM porter: tasks from CUDA C++ or Triton kernels a team already has, read by a brain (role "porter") that
writes the pure-JAX reference (`computation` + `get_inputs`). It lives here because it needs a brain; the rest of
porting is `tpu_runner.porting`, which ports a PyTorch module exactly through torchax (`port_pytorch`, which
`port_file` calls for a PyTorch source) and checks the brain's answer against PyTorch.

When a PyTorch reference of the same operation is given (KernelBench ships one beside each kernel), the brain is
told the exact arguments its `computation` must take, and the JAX reference must match PyTorch on the module's
own weights and inputs (`check_against_pytorch`) before the task is accepted; a refused answer is sent back to the
brain once with the refusal, then porting gives up. Without one, the task is written marked unverified by an
oracle (`ported_from: {oracle: none}`) and the result says so. Either way the task goes through the reference
check (`add_checked_task`), so a reference that does not run is never written.

The brain's code runs only in the sandboxed children of those checks; here it is only parsed.
"""

from __future__ import annotations

import ast
import re
import shutil
import textwrap
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from agents.anthropic_brain import BrainError
from agents.brain import Brain, BrainRequest, Budget, BudgetExceeded
from agents.brains import BrainUnavailable, default_brain, make_brain
from agents.subagents import code_blocks
from storage.errors import KernelbotError
from storage.settings import Settings
from tpu_runner.porting import PortError, PortResult, check_against_pytorch, describe_module, port_pytorch
from tpu_runner.tasks import AddedTask, TaskError, add_checked_task
from tpu_runner.tasks import parse as parse_source

KINDS = ("pytorch", "cuda", "triton")
LABELS = {"cuda": "CUDA C++", "triton": "Triton"}
FENCES = {"cuda": "cuda", "triton": "python"}
ATTEMPTS = 2  # the first answer, and one retry that sees why the first was refused
NAME_MAX_CHARS = 48
SOURCE_MAX_CHARS = 60_000
LLM_NEEDED = ("porting CUDA or Triton source needs an LLM brain to write the JAX reference: set ANTHROPIC_API_KEY "
              "(and ANTHROPIC_BASE_URL for a proxy) and use --brain anthropic; the offline brain writes Pallas "
              "kernels for tasks it recognises but cannot read CUDA or Triton")
# The task's tolerances for kernels against the reference, by the dtypes involved (as the PyTorch path sets them).
TASK_TOLERANCE = {"bfloat16": 2e-2, "float16": 1e-2, "float32": 1e-3}

_TORCH_MODULE = re.compile(r"^class\s+(\w+)\s*\(\s*(?:torch\.)?(?:nn\.)?Module\s*\)", re.MULTILINE)
_TRITON_JIT = re.compile(r"^\s*@triton\.(?:jit|autotune|heuristics)\b", re.MULTILINE)
_FORBIDDEN_IMPORT = re.compile(r"^\s*(?:import|from)\s+(torch|triton|jax\.experimental\.pallas)\b", re.MULTILINE)


class SourceError(KernelbotError, ValueError):
    """A file that cannot be ported as it is (not a kind we know, unreadable, options that do not fit it)."""
    next_step = ("pass a PyTorch file with class Model(nn.Module), a CUDA C++ source or a Triton source "
                 "(`kernelbot port --help`)")


# --- what a file is ------------------------------------------------------------------------------------------


def detect_kind(path: Path, text: str) -> str:
    """"pytorch" (a `class Model(nn.Module)` file), "cuda" (`.cu`/`.cuh`, or a `__global__` kernel) or "triton"
    (an `@triton.jit` kernel); SourceError saying what the file lacks otherwise."""
    if _TRITON_JIT.search(text):
        return "triton"
    if Path(path).suffix in (".cu", ".cuh") or "__global__" in text:
        return "cuda"
    modules = _TORCH_MODULE.findall(text)
    if "Model" in modules:
        return "pytorch"
    if modules:
        raise SourceError(f"{Path(path).name} defines no `class Model(nn.Module)` (it has {', '.join(modules)}): "
                          "rename the module to port to Model, with get_inputs() and get_init_inputs() beside it")
    raise SourceError(f"{Path(path).name} is none of what `kernelbot port` reads: a PyTorch file with "
                      "`class Model(nn.Module)` and get_inputs(), a CUDA C++ source (.cu/.cuh, a __global__ kernel) "
                      "or a Triton source (an @triton.jit kernel)")


def default_name(path: Path) -> str:
    """A task name from a file name: `Fused-BiasReLU.cu` -> `fused_biasrelu` (lowercase, [a-z0-9_], a letter
    first, at most NAME_MAX_CHARS)."""
    stem = Path(path).name.split(".")[0].lower()
    name = re.sub(r"_+", "_", re.sub(r"[^a-z0-9_]", "_", stem)).strip("_")
    if not name or not name[0].isalpha():
        name = f"port_{name}".rstrip("_")
    return name[:NAME_MAX_CHARS].rstrip("_")


def check_name(name: str) -> str:
    if not re.fullmatch(rf"[a-z][a-z0-9_]{{0,{NAME_MAX_CHARS - 1}}}", name):
        raise SourceError(f"{name!r} is not a task name: use lowercase letters, digits and underscores, starting "
                          f"with a letter, at most {NAME_MAX_CHARS} characters")
    return name


def read_source(path: Path) -> str:
    path = Path(path)
    if not path.is_file():
        raise SourceError(f"{path} does not exist" if not path.exists() else f"{path} is not a file")
    try:
        return path.read_text()
    except UnicodeDecodeError:
        raise SourceError(f"{path.name} is not a text file (it is not UTF-8)") from None


def porter_brain(name: str | None, settings: Settings, budget: Budget) -> Brain:
    """The brain that ports CUDA/Triton source: an LLM brain, so BrainUnavailable (saying what is needed) for the
    offline one or without an API key."""
    name = name or default_brain(settings)
    if name == "offline":
        raise BrainUnavailable(LLM_NEEDED)
    if name != "anthropic":
        raise BrainUnavailable(f"unknown brain {name!r}; porting CUDA or Triton source needs --brain anthropic")
    if not settings.anthropic_api_key:
        raise BrainUnavailable(LLM_NEEDED)
    return make_brain(name, settings, budget, task=None, chip=None)


# --- the prompt ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PortPrompt:
    kind: str  # cuda | triton
    source_name: str
    source: str
    torch_name: str | None = None
    torch_source: str | None = None
    signature: tuple[str, ...] = ()  # from describe_module, when there is a PyTorch reference

    def context(self) -> str:
        label = LABELS[self.kind]
        text = (f"# Porting a {label} kernel to a kernelbot task\n\n"
                "kernelbot tunes TPU kernels in JAX Pallas against a task, whose reference.py is a pure-JAX "
                f"statement of what the kernel computes. Write that reference from the {label} source below. "
                "Every Pallas kernel will be checked against it, so it must compute exactly what the source "
                "computes (the same formula, reductions, constants, output shapes and dtypes), not something "
                "close to it.\n\n"
                "## reference.py\n"
                "- A one-line module docstring: what it computes, with shapes and dtypes.\n"
                "- `computation(*arrays)`: pure JAX (jax, jax.numpy, jax.lax; no Pallas, torch, triton or numpy "
                "randomness) on whole arrays, returning what one call of the source's host function returns. It "
                "takes JAX arrays only; constants the source fixes (an epsilon, a scale) go in its body.\n"
                "- `get_inputs()`: returns `([arrays...], [])`, the arrays computation takes, in order, drawn with "
                "jax.random from a fixed key, with the dtypes the source uses and sizes it is meant for.\n"
                "- Optionally `get_test_inputs()` in the same form with small shapes (a few 8 x 128 blocks).\n"
                "Answer with the whole file in one ```python block.\n\n"
                f"## The {label} source ({self.source_name})\n```{FENCES[self.kind]}\n"
                f"{self.source[:SOURCE_MAX_CHARS].rstrip()}\n```\n")
        if self.torch_source is not None:
            text += (f"\n## The PyTorch reference of the same operation ({self.torch_name})\n```python\n"
                     f"{self.torch_source[:SOURCE_MAX_CHARS].rstrip()}\n```\n")
        return text

    def prompt(self, refused: Sequence[tuple[str, PortError]] = ()) -> str:
        label = LABELS[self.kind]
        text = f"Write reference.py for the {label} kernel above."
        if self.signature:
            arguments = "\n".join(f"  - {s}" for s in self.signature)
            text += (f" It will be run on the PyTorch module {self.torch_name}'s own inputs and weights and must "
                     "return what Model.forward returns (float32 within about 1e-4). computation must take exactly "
                     "these arguments, in this order (forward's inputs, then the module's weights, parameters and "
                     f"buffers):\n{arguments}\nget_inputs() must return arrays of exactly these shapes and dtypes, "
                     "in this order.")
        else:
            text += (" No PyTorch reference was given, so nothing will check your reference against the original: "
                     "read the source and its launch code carefully for the shapes and the exact arithmetic.")
        for i, (code, error) in enumerate(refused, start=1):
            text += (f"\n\nAnswer {i} was refused ({error.kind}): {error.message}\n\n```python\n{code.rstrip()}\n"
                     "```")
        if refused:
            text += "\n\nFix it: answer with the whole corrected reference.py in one ```python block."
        return text


# --- porting -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Verified:
    max_abs_err: float
    signature: tuple[str, ...]


class _Refused(Exception):
    """An answer that cannot become the task's reference; its PortError goes back to the brain."""

    def __init__(self, error: PortError):
        super().__init__(error.message)
        self.error = error


def reference_code(answer: str) -> str:
    """The last fenced Python block of the porter's answer, refused when it is not a pure-JAX reference.py with
    computation() and get_inputs()."""
    blocks = code_blocks(answer)
    if not blocks:
        raise _Refused(PortError("no_answer", "the answer has no ```python block with reference.py"))
    code = blocks[-1].strip() + "\n"
    try:
        tree = parse_source(code)
    except SyntaxError as exc:
        raise _Refused(PortError("syntax", f"reference.py is not valid Python (line {exc.lineno}): {exc.msg}",
                                 exc.lineno)) from None
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    missing = [f for f in ("computation", "get_inputs") if f not in defined]
    if missing:
        raise _Refused(PortError("no_answer", f"reference.py defines no {' and no '.join(missing)}()"))
    forbidden = _FORBIDDEN_IMPORT.search(code)
    if forbidden:
        line = code[:forbidden.start()].count("\n") + 1
        raise _Refused(PortError("not_pure_jax", f"reference.py imports {forbidden.group(1)} (line {line}): the "
                                 "reference must be pure JAX", line))
    return code


def port_source(source_path: Path, *, name: str, dest: Path, settings: Settings, brain: Brain,
                torch_reference: Path | None = None) -> PortResult:
    """Port the CUDA C++ or Triton kernel in `source_path` to a task at `dest` (named `name`), the JAX reference
    written by `brain`; checked against `torch_reference` through torchax when one is given (torch needed), else
    written marked unverified by an oracle. Nothing is written unless the reference passes every check."""
    source_path = Path(source_path)
    source = read_source(source_path)
    kind = detect_kind(source_path, source)
    if kind not in LABELS:
        raise SourceError(f"{source_path.name} is a PyTorch module: port it with port_pytorch (no LLM needed)")
    if brain.name == "offline":
        raise BrainUnavailable(LLM_NEEDED)
    spec = PortPrompt(kind=kind, source_name=source_path.name, source=source)
    if torch_reference is not None:
        torch_reference = Path(torch_reference)
        torch_source = read_source(torch_reference)
        if detect_kind(torch_reference, torch_source) != "pytorch":
            raise SourceError(f"the PyTorch reference {torch_reference.name} defines no `class Model(nn.Module)`")
        try:
            signature = describe_module(torch_reference, settings)
        except TaskError as exc:
            return PortResult(ok=False, name=name, error=PortError("torch_reference", str(exc)))
        spec = PortPrompt(kind=kind, source_name=source_path.name, source=source, torch_name=torch_reference.name,
                          torch_source=torch_source, signature=signature)

    refused: list[tuple[str, PortError]] = []
    for _ in range(ATTEMPTS):
        answer = ""
        try:
            reply = brain.ask(BrainRequest(role="porter", context=spec.context(), prompt=spec.prompt(refused),
                                           max_tokens=8192))
            answer = reply.text
            code = reference_code(answer)
            verified = _check_with_pytorch(code, torch_reference, settings) if torch_reference else None
            files = task_files(code, spec=spec, name=name, brain=brain.name, verified=verified)
            added = add_checked_task(files, dest=dest, settings=settings)
        except (BrainError, BudgetExceeded) as exc:
            return PortResult(ok=False, name=name, error=PortError("brain", f"the {brain.name} brain gave no answer: "
                                                                           f"{exc}"), notes=_notes(refused))
        except TaskError as exc:  # dest holds another task
            return PortResult(ok=False, name=name, error=PortError("exists", str(exc)))
        except _Refused as refusal:
            refused.append((_shown(answer), refusal.error))
            continue
        if added.task_dir is None:
            refused.append((code, PortError("check_failed", f"the reference check failed: {added.check.error}",
                                            added.check.line)))
            continue
        return _accepted(added, code=code, verified=verified, refused=refused, name=name,
                         source_name=source_path.name)
    last = refused[-1][1]
    return PortResult(ok=False, name=name, error=PortError(last.kind, f"after {ATTEMPTS} answers the {brain.name} "
                                                           f"brain's reference was still refused: {last.message}",
                                                           last.line), notes=_notes(refused[:-1]))


def _accepted(added: AddedTask, *, code: str, verified: _Verified | None, refused: Sequence[tuple[str, PortError]],
              name: str, source_name: str) -> PortResult:
    notes = [*_notes(refused), *added.check.notes]
    if verified is None:
        notes.append(f"not verified by an oracle: no PyTorch reference was given, so nothing checked that the JAX "
                     f"reference computes what {source_name} does; read reference.py before trusting results "
                     "against it, or port again with --torch-reference")
        return PortResult(ok=True, name=name, task_dir=added.task_dir, signature=_arguments(code, added.check.shapes),
                          outputs=added.check.outputs[:1], notes=tuple(notes))
    notes += _shape_notes(verified.signature, added.check.shapes)
    return PortResult(ok=True, name=name, task_dir=added.task_dir, signature=verified.signature,
                      outputs=added.check.outputs[:1], max_abs_err=verified.max_abs_err, verified_by="torchax",
                      notes=tuple(notes))


def _shown(answer: str) -> str:
    blocks = code_blocks(answer)
    return blocks[-1] if blocks else answer[-4000:]


def _notes(refused: Sequence[tuple[str, PortError]]) -> list[str]:
    return [f"answer {i} was refused ({e.kind}): {e.message}" for i, (_, e) in enumerate(refused, start=1)]


def _check_with_pytorch(code: str, torch_reference: Path, settings: Settings) -> _Verified:
    scratch = settings.home / "staging" / f"port-{uuid.uuid4().hex[:10]}"
    scratch.mkdir(parents=True)
    try:
        candidate = scratch / "reference.py"
        candidate.write_text(code)
        oracle = check_against_pytorch(torch_reference, candidate, settings)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if not oracle.ok:
        error = oracle.error or PortError("mismatch", "the oracle refused the reference without saying why")
        raise _Refused(PortError(error.kind, f"checked against the PyTorch reference {torch_reference.name}: "
                                 f"{error.message}", error.line))
    return _Verified(max_abs_err=float(oracle.max_abs_err or 0.0), signature=oracle.signature)


def task_files(code: str, *, spec: PortPrompt, name: str, brain: str, verified: _Verified | None) -> dict[str, str]:
    """reference.py (the brain's code, then where it came from and the original source as comments, so line
    numbers stay the brain's) and kernel_task.yaml (with `ported_from`)."""
    label = LABELS[spec.kind]
    if verified:
        how = (f"checked against the PyTorch reference {spec.torch_name} through torchax (max |diff| "
               f"{verified.max_abs_err:.3g} on the module's own inputs and weights)")
    else:
        how = "NOT verified by an oracle (no PyTorch reference was given)"
    original = "\n".join(f"# {line}".rstrip() for line in spec.source.strip().splitlines()[:400])
    provenance = textwrap.fill(f"Ported by `kernelbot port` from the {label} kernel {spec.source_name}: the "
                               f"reference above was written by the {brain} brain and {how}.", width=116,
                               initial_indent="# ", subsequent_indent="# ")
    reference = f"{code.rstrip()}\n\n\n{provenance}\n# The original source:\n#\n{original}\n"
    tree = parse_source(code)
    summary = (ast.get_docstring(tree) or "").strip().splitlines()
    blob = code + "\n".join(spec.signature)
    dtype = next((d for d in ("bfloat16", "float16") if d in blob), "float32")
    origin: dict[str, object] = {"kind": spec.kind, "file": spec.source_name, "brain": brain,
                                 "oracle": "torchax" if verified else "none"}
    if verified:
        origin |= {"torch_reference": spec.torch_name, "max_abs_err": float(f"{verified.max_abs_err:.6g}"),
                   "arguments": list(verified.signature)}
    description = (f"{summary[0].rstrip('.')}. " if summary else "") + \
        f"Ported from the {label} kernel {spec.source_name} by an LLM brain; {how}."
    meta = {"task_id": name, "description": description, "atol": TASK_TOLERANCE[dtype],
            "rtol": TASK_TOLERANCE[dtype], "ported_from": origin}
    return {"reference.py": reference, "kernel_task.yaml": yaml.safe_dump(meta, sort_keys=False, width=1000)}


def _arguments(code: str, shapes: Sequence[str]) -> tuple[str, ...]:
    """`x: float32[64,128]` per argument of computation, from its parameter names and the checked shapes."""
    tree = parse_source(code)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "computation")
    names = [a.arg for a in fn.args.args]
    given = shapes[0].split(", ") if shapes and shapes[0] else []
    return tuple(f"{n}: {given[i]}" if i < len(given) else n for i, n in enumerate(names))


def _shape_notes(signature: Sequence[str], shapes: Sequence[str]) -> list[str]:
    want = [s.split(": ", 1)[-1].split(" (")[0] for s in signature]
    got = shapes[0].split(", ") if shapes else []
    if got and got != want:
        return [f"get_inputs() gives {', '.join(got)}; the PyTorch module was checked on {', '.join(want)}"]
    return []


def port_file(source_path: Path, *, name: str, dest: Path, settings: Settings, brain: Brain | None = None,
              torch_reference: Path | None = None) -> PortResult:
    """Port any file `kernelbot port` reads: a PyTorch module exactly (no brain), CUDA or Triton through `brain`
    (BrainUnavailable when there is none)."""
    source_path = Path(source_path)
    kind = detect_kind(source_path, read_source(source_path))
    check_name(name)
    if kind == "pytorch":
        if torch_reference is not None:
            raise SourceError(f"{source_path.name} is a PyTorch module, its own oracle: --torch-reference is for CUDA "
                              "and Triton sources")
        return port_pytorch(source_path, name=name, dest=dest, settings=settings)
    if brain is None:
        raise BrainUnavailable(LLM_NEEDED)
    return port_source(source_path, name=name, dest=dest, settings=settings, brain=brain,
                       torch_reference=torch_reference)
