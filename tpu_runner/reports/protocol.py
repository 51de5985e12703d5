"""What the evaluator and its children say to each other, as typed records written as JSON.

Every sandboxed child starts from `SandboxLimits` (its command line) and a `ChildStart` (its first line on
stdin, `tpu_runner.sandbox.entry`). The candidate's child (`tpu_runner.candidate.child`) gets a `CandidateRequest` and
writes a `CandidateReport`; the reference's child (`tpu_runner.reference.child`) gets a `ReferenceRequest` and
writes a `ReferenceReport`; a compile server (`tpu_runner.compiler.server`) reads `CompileRequest` lines and
writes a `CompileReply` for each. Arrays travel as files (`tpu_runner.checking.arrays`); a report names them. Everything
in a candidate's report is the candidate process's word: the evaluator uses it to know what to compile and
compare, never to decide.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from tpu_runner.reports.result import EvalError, Host, Stage, Verdict


@contextlib.contextmanager
def timed(timings: dict[str, float], name: str) -> Iterator[None]:
    """Add the seconds spent inside to `timings[name]`: a report's parts of a stage, summed over the times it runs."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - t0


def write_json(path: Path, record: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(asdict(record), default=float))
    tmp.replace(path)


T = TypeVar("T")


def _error(data: dict[str, Any] | None) -> EvalError | None:
    return EvalError.from_json(data) if data else None


def _build(cls: type[T], data: dict[str, Any]) -> T:
    """`cls` from the keys of `data` it takes (a record written by an older or newer side may have others)."""
    names = set(inspect.signature(cls).parameters)
    return cls(**{k: v for k, v in data.items() if k in names})


# Where a sandboxed child finds its memory limit (sandbox.entry sets it): work it may skip, such as the float64 truth
# of a large reference, is sized to it.
MEMORY_LIMIT_ENV = "KERNELBOT_CHILD_MEMORY_MIB"


@dataclass(frozen=True)
class SandboxLimits:
    """The limits `sandbox.entry` applies before anything else runs: its first argument, as JSON."""

    cpu_seconds: int
    file_bytes: int
    memory_mib: int = 0  # the supervisor's limit on the child's resident memory (0: none known)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> SandboxLimits:
        return _build(cls, json.loads(text))


@dataclass(frozen=True)
class ChildStart:
    """A waiting child's first line on stdin: the arguments of the code it imported, the directories it may
    write besides its working directory, and - for a child that runs untrusted code - what it may read (Landlock)."""

    argv: list[str]
    writable: list[str] = field(default_factory=list)
    readable: list[str] | None = None  # None: reads not confined (code the runner trusts)
    listable: list[str] = field(default_factory=list)  # directories whose entries may be looked up, not read
    # The memory limit its supervisor enforces on this run: a spare is started before its run is known, and one on
    # the chip may hold more (`hardware.with_chip_memory`). None: the limit it was started with.
    memory_mib: int | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ChildStart:
        data = json.loads(text)
        if isinstance(data, list):  # the bare form: arguments only
            return cls(argv=[str(a) for a in data])
        readable = data.get("readable")
        return cls(argv=list(data["argv"]), writable=list(data.get("writable", [])),
                   readable=None if readable is None else list(readable), listable=list(data.get("listable", [])),
                   memory_mib=data.get("memory_mib"))


@dataclass(frozen=True)
class Budget:
    """What interpret mode may afford at production shapes (inputs and outputs, reference FLOPs, grid steps)."""

    elements: int
    flops: float
    grid_steps: int


@dataclass
class CandidateRequest:
    task_dir: str
    kernel_path: str
    target: str
    host: Host
    allow_pure_jax: bool
    artifacts_dir: str
    workdir: str
    budget: Budget
    measure: bool = False
    ir_gate: bool = False
    # The task's own values the reference's child computed its outputs on, by `values_from` ("production:0"):
    # files in the work directory, read instead of calling get_inputs() again.
    task_values: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> CandidateRequest:
        data = json.loads(path.read_text())
        data["budget"] = Budget(**data["budget"])
        return _build(cls, data)


@dataclass
class CaseOutput:
    case: str
    outputs: str | None = None  # file name in the outputs directory
    again: str | None = None  # a second run on the same inputs, for determinism
    error: EvalError | None = None  # of a call that failed

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaseOutput:
        return _build(cls, {**data, "error": _error(data.get("error"))})


@dataclass
class CheckReport:
    name: str
    config: dict[str, Any]  # tasks.config_to_json
    values_from: str | None  # "test:J" / "production:I": the task's own values were used for the "task" case
    why: str
    differs: list[str] = field(default_factory=list)
    production: bool = False
    cases: list[CaseOutput] = field(default_factory=list)


@dataclass
class ProgramReport:
    """The candidate at one production configuration."""

    config: dict[str, Any]
    exported: str  # file name of the jax.export serialization, in the work directory
    traffic: dict[str, Any]  # traffic.traffic_to_json
    vmem_limits: list[int | None]
    kernels: list[tuple[str, int]]  # (kernel function, line) defined in the candidate


@dataclass
class KeptDifference:
    """Outputs that differed from the reference's while timing, beyond the tolerance in values only, kept for the
    evaluator to judge against a float64 run of the reference on the same inputs (the candidate's child has neither
    the memory for one at production shapes nor any business running the reference in float64)."""

    case: str  # the timing input set (tasks.TIMING_CASES)
    iterations: list[int]  # the timed iterations that gave these outputs
    candidate: str  # file names in the outputs directory
    reference: str


@dataclass
class MeasuredTimes:
    """The candidate and the reference timed in the candidate's child (interleaved, first production shape)."""

    candidate_ms: float
    reference_ms: float
    candidate_spread_ms: float
    reference_spread_ms: float
    iterations: int
    source: str  # "trace:device", "trace:host" or "wall_clock"
    device: str  # the backend's device kind
    mismatches: list[str]  # outputs that differed from the reference's while timing (the first three)
    configuration: str
    on_device: bool  # timed on a TPU of the target, not on whatever backend this is
    # The device's ops within one call (name, median ns), from the trace's device lane; empty without one.
    candidate_ops: list[tuple[str, float]] = field(default_factory=list)
    reference_ops: list[tuple[str, float]] = field(default_factory=list)
    kept: list[KeptDifference] = field(default_factory=list)  # for the evaluator to judge


@dataclass
class CandidateReport:
    stage: Stage | Literal["load"]  # where the child is, or where it stopped
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    ir_hash: str | None = None
    error: EvalError | None = None
    verdict: Verdict | None = None
    task_error: str | None = None
    programs: list[ProgramReport] = field(default_factory=list)
    coverage_unchecked: list[str] = field(default_factory=list)
    checks: list[CheckReport] = field(default_factory=list)
    measured: MeasuredTimes | None = None  # when timed on this host
    sandbox: str = ""
    chip_busy: str | None = None  # the TPU was held by a process outside kernelbot: why, naming it

    @classmethod
    def read(cls, path: Path) -> CandidateReport:
        data = json.loads(path.read_text())
        data["programs"] = [_build(ProgramReport, p) for p in data.get("programs", [])]
        checks = []
        for c in data.get("checks", []):
            c = dict(c)
            c["cases"] = [CaseOutput.from_json(o) for o in c.get("cases", [])]
            checks.append(_build(CheckReport, c))
        data["checks"] = checks
        data["error"] = _error(data.get("error"))
        if measured := data.get("measured"):
            measured = {**measured, "kept": [_build(KeptDifference, k) for k in measured.get("kept", [])]}
        data["measured"] = _build(MeasuredTimes, measured) if measured else None
        return _build(cls, data)


@dataclass
class OutputJob:
    key: str  # the cache key of this configuration's reference outputs
    config: dict[str, Any]
    values_from: str | None
    cases: list[str]
    # Only this float64 run, on the CPU, for these cases, computed when the judge asks: "truth" (where it was not
    # computed with the outputs) or "perturbed" (on inputs rounded once more: the task's sensitivity).
    float64: str | None = None
    task: int = 0  # which of the request's tasks
    # The task's own values (`values_from`) as kept with this job's outputs, copied where the child may read them:
    # a float64 run judges the values the outputs were computed on, without calling get_inputs() again.
    values_file: str | None = None


@dataclass
class ReferenceRequest:
    task_dirs: list[str]
    out_dir: str
    export: bool  # describe each task's production configurations and export its reference's programs
    outputs: list[OutputJob] = field(default_factory=list)
    on_chip: bool = False  # compute the outputs on this host's TPU (the float64 truth stays on the CPU)
    truth_gflops: float | None = None  # no float64 truth with the outputs for a reference with more dot GFLOPs
    # outputs only for configurations an interpret-mode check runs at (its elements and FLOPs); None: all
    interpret_budget: Budget | None = None

    @classmethod
    def read(cls, path: Path) -> ReferenceRequest:
        data = json.loads(path.read_text())
        data["outputs"] = [_build(OutputJob, o) for o in data.get("outputs", [])]
        if data.get("interpret_budget"):
            data["interpret_budget"] = Budget(**data["interpret_budget"])
        return _build(cls, data)


@dataclass
class ExportedTask:
    """One task's reference described: its production configurations, its exported program for each, and which
    share of each input its outputs can depend on; or why it could not be (`task_error`)."""

    production: list[dict[str, Any]] = field(default_factory=list)  # tasks.config_to_json
    programs: list[str] = field(default_factory=list)  # file names under out/<index>/
    # Per configuration, per input: the fraction of its elements the outputs can depend on (0: not read at all;
    # below 1 where a constant mask drops some, analysis.liveness).
    used_inputs: list[list[float]] = field(default_factory=list)
    task_error: str | None = None


@dataclass
class ReferenceReport:
    exported: dict[str, ExportedTask] = field(default_factory=dict)  # by task dir
    # key -> case -> {"expected" | "truth" | "perturbed": file name}: only the parts computed are present, which
    # is how the outputs cache tells a part not computed yet from one that has no file
    outputs: dict[str, dict[str, dict[str, str | None]]] = field(default_factory=dict)
    task_error: str | None = None  # why the outputs could not be computed (of the first task that failed)
    output_errors: dict[str, str] = field(default_factory=dict)  # by task dir: why its outputs could not be
    timings: dict[str, float] = field(default_factory=dict)
    chip_busy: str | None = None  # the TPU was held by a process outside kernelbot: why, naming it
    finished: list[str] = field(default_factory=list)  # task dirs whose outputs are done (written after each)
    out_of_memory: list[str] = field(default_factory=list)  # task dirs whose reference ran out of device memory

    @classmethod
    def read(cls, path: Path) -> ReferenceReport:
        data = json.loads(path.read_text())
        data["exported"] = {k: _build(ExportedTask, v) for k, v in data.get("exported", {}).items()}
        return _build(cls, data)


@dataclass(frozen=True)
class CompileRequest:
    """One line on a compile server's stdin; the reply is `out/<id>/result.json` in its scratch directory."""

    id: str
    exported: str  # the jax.export serialization to compile
    target: str

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> CompileRequest:
        return _build(cls, json.loads(text))


@dataclass
class CompileReply:
    """A compile server's answer: the compiler's figures, or its refusal (`error_type`, `error`)."""

    ok: bool
    compile_seconds: float = 0.0
    ops: list[tuple[str, int]] = field(default_factory=list)  # (op, estimated cycles) from the static profile
    memory: dict[str, int] = field(default_factory=dict)
    hlo_text: str = ""
    cost: dict[str, float] = field(default_factory=dict)
    profiled: bool = False
    error_type: str = ""
    error: str = ""
    traceback: str = ""

    @classmethod
    def read(cls, path: Path) -> CompileReply:
        data = json.loads(path.read_text())
        data["ops"] = [(str(n), int(c)) for n, c in data.get("ops", [])]
        return _build(cls, data)
