"""Porting: tasks from kernels a team already has. A PyTorch module becomes a task whose reference is the module's
exact JAX program (through torchax), checked against PyTorch before the task is written.

This package is all of porting below the agents: this module is the parent's side (the public API, which also
exports `emit`'s `identifier`); `child` is the sandboxed process that imports the module file, traces it and checks
it; `emit` writes a traced program back as JAX source. A CUDA or Triton source needs an LLM to write its reference:
that porter is `agents.porter`, which checks its answer with `check_against_pytorch` here.

The module file is someone's code: it runs only in the sandboxed child (`tpu_runner.porting.child`), never here.
The written task is then checked like a pasted reference (`reference_check.add_checked_task`) and put in place
at once. torch and torchax are an optional extra; without them porting says which extra to install.
"""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storage.errors import KernelbotError
from storage.settings import EvalLimits, Settings
from tpu_runner import lazy_exports
from tpu_runner.sandbox import ChildOutcome, run_one_shot
from tpu_runner.tasks import AddedTask, TaskError, add_checked_task

__all__, __getattr__, __dir__ = lazy_exports(__name__, {"identifier": "emit"}, defined_here=(
    "EXTRA", "PORT_SECONDS", "PortError", "PortResult", "PortUnavailable", "check_against_pytorch", "describe_module",
    "port_pytorch"))

PORT_SECONDS = 300
PORT_MEMORY_MIB = 8192
EXTRA = ("install the port extra (torch and torchax, ~4 GB): `pip install -e '.[port]'` in a checkout, or "
         "`pip install 'kernelbot[port]'`; `./kb port` and `./kb test` install it themselves")


class PortUnavailable(KernelbotError, RuntimeError):
    """torch or torchax is not installed; the message says what to install."""
    next_step = "install the extra named above, then run the command again"


@dataclass(frozen=True)
class PortError:
    kind: str  # syntax | no_model | no_get_inputs | module_raised | unsupported_op | data_dependent | mismatch | ...
    message: str
    line: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "line": self.line}


@dataclass(frozen=True)
class PortResult:
    ok: bool
    name: str
    task_dir: Path | None = None
    signature: tuple[str, ...] = ()  # the computation's arguments: inputs, then weights
    outputs: tuple[str, ...] = ()
    max_abs_err: float | None = None  # of the written reference against PyTorch
    verified_by: str | None = None  # "torchax" when checked against PyTorch; None: not verified by an oracle
    error: PortError | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "name": self.name, "task_dir": str(self.task_dir) if self.task_dir else None,
                "signature": list(self.signature), "outputs": list(self.outputs), "max_abs_err": self.max_abs_err,
                "verified_by": self.verified_by, "error": self.error.to_json() if self.error else None,
                "notes": list(self.notes)}


def require_torch() -> None:
    missing = [m for m in ("torch", "torchax") if importlib.util.find_spec(m) is None]
    if missing:
        raise PortUnavailable(f"porting needs {' and '.join(missing)}, which are not installed: {EXTRA}")


def _stopped(outcome: ChildOutcome, wall_seconds: int, memory_mib: int) -> PortError:
    stop = outcome.why_stopped(wall_seconds=wall_seconds, memory_mib=memory_mib, tail_lines=6)
    if stop.kind == "timeout":
        return PortError("timeout", f"porting {stop.how} (it was {stop.doing})")
    if stop.kind == "memory_limit":
        return PortError("memory_limit", f"porting {stop.how} while {stop.doing} and was stopped; "
                         "make get_inputs() and the module smaller")
    return PortError("crashed", f"the porting process {stop.how} while {stop.doing}.\n{stop.tail[-1000:]}".strip())


def run_port_child(request: dict[str, Any], settings: Settings, *, wall_seconds: int = PORT_SECONDS,
                   memory_mib: int = PORT_MEMORY_MIB) -> dict[str, Any]:
    """Run `tpu_runner.porting.child` on `request` (files it names are copied into the child's scratch directory)
    and return its report, or {"ok": False, "error": ...} when it did not finish."""
    require_torch()

    def staged(scratch: Path) -> dict[str, Any]:
        copied = dict(request)
        for key in ("source_path", "reference_path"):
            if key in copied:
                copy = scratch / f"{key.removesuffix('_path')}.py"
                shutil.copyfile(copied[key], copy)
                copied[key] = str(copy)
        return copied

    limits = EvalLimits(wall_seconds=wall_seconds, cpu_seconds=max(60, 2 * wall_seconds), memory_mib=memory_mib,
                        output_bytes=settings.limits.output_bytes)
    outcome, report = run_one_shot(module="tpu_runner.porting.child", root=settings.sandbox_dir, prefix="port",
                                   limits=limits, request_for=staged, report_name="port_result.json")
    if report is None:
        return {"ok": False, "error": _stopped(outcome, wall_seconds, memory_mib).to_json()}
    return report


def _error(report: dict[str, Any]) -> PortError:
    e = report.get("error") or {}
    return PortError(str(e.get("kind", "failed")), str(e.get("message", "porting failed without saying why")),
                     e.get("line"))


def port_pytorch(source_path: Path, *, name: str, dest: Path, settings: Settings) -> PortResult:
    """Port the PyTorch module in `source_path` to a task at `dest` (named `name`); nothing is written unless the
    written reference matches PyTorch and passes the reference check."""
    report = run_port_child({"mode": "port", "source_path": str(source_path), "name": name,
                             "display_name": Path(source_path).name}, settings)
    if not report.get("ok"):
        return PortResult(ok=False, name=name, error=_error(report))
    try:
        added: AddedTask = add_checked_task(report["files"], dest=dest, settings=settings)
    except TaskError as exc:
        return PortResult(ok=False, name=name, error=PortError("exists", str(exc)))
    if added.task_dir is None:
        message = f"the written task did not pass the reference check: {added.check.error}"
        return PortResult(ok=False, name=name, error=PortError("check_failed", message))
    return PortResult(ok=True, name=name, task_dir=added.task_dir, signature=tuple(report["signature"]),
                      outputs=tuple(report["outputs"]), max_abs_err=float(report["max_abs_err"]["reference"]),
                      verified_by="torchax", notes=added.check.notes)


@dataclass(frozen=True)
class OracleCheck:
    ok: bool
    max_abs_err: float | None = None
    signature: tuple[str, ...] = ()
    error: PortError | None = None


def check_against_pytorch(torch_source: Path, reference_source: Path, settings: Settings) -> OracleCheck:
    """Does the JAX reference in `reference_source` compute what the PyTorch module in `torch_source` does, on the
    module's own weights and inputs? (The reference takes forward's inputs, then the weights, in that order.)"""
    report = run_port_child({"mode": "oracle", "source_path": str(torch_source), "reference_path":
                             str(reference_source), "name": "oracle"}, settings)
    if not report.get("ok"):
        return OracleCheck(ok=False, signature=tuple(report.get("signature") or ()), error=_error(report))
    return OracleCheck(ok=True, max_abs_err=float(report["max_abs_err"]), signature=tuple(report["signature"]))


def describe_module(torch_source: Path, settings: Settings) -> tuple[str, ...]:
    """The arguments the JAX reference of this PyTorch module takes (for a brain writing one): raises when the
    module cannot be run."""
    report = run_port_child({"mode": "port", "source_path": str(torch_source), "name": "signature",
                             "display_name": Path(torch_source).name}, settings)
    if not report.get("ok"):
        error = _error(report)
        raise TaskError(f"the PyTorch reference {Path(torch_source).name} cannot be used as an oracle: "
                        f"{error.message}")
    return tuple(report["signature"])
