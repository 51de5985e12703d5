"""What the evaluator and its children say to each other, as typed records written as JSON files.

The candidate's child (`tpu_runner.child`) gets a `CandidateRequest` and writes a `CandidateReport`; the
reference's child (`tpu_runner.reference_run`) gets a `ReferenceRequest` and writes a `ReferenceReport`. Arrays
travel as files (`tpu_runner.arrays`); a report names them. Everything in a candidate's report is the
candidate process's word: the evaluator uses it to know what to compile and compare, never to decide.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from tpu_runner.result import EvalError


def write_json(path: Path, record: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(asdict(record), default=float))
    tmp.replace(path)


def _build[T](cls: type[T], data: dict[str, Any]) -> T:
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in names})


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
    host: str  # "cpu" | "tpu"
    allow_pure_jax: bool
    artifacts_dir: str
    workdir: str
    budget: Budget
    measure: bool = False
    ir_gate: bool = False

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
    error: dict[str, Any] | None = None  # EvalError.to_json() of a call that failed


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
class CandidateReport:
    stage: str
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    ir_hash: str | None = None
    error: dict[str, Any] | None = None
    verdict: str | None = None
    task_error: str | None = None
    programs: list[ProgramReport] = field(default_factory=list)
    coverage_unchecked: list[str] = field(default_factory=list)
    checks: list[CheckReport] = field(default_factory=list)
    measured: dict[str, Any] | None = None  # {"performance": ..., "profile": ...} when timed on this host
    sandbox: str = ""

    @classmethod
    def read(cls, path: Path) -> CandidateReport:
        data = json.loads(path.read_text())
        data["programs"] = [_build(ProgramReport, p) for p in data.get("programs", [])]
        checks = []
        for c in data.get("checks", []):
            c = dict(c)
            c["cases"] = [_build(CaseOutput, o) for o in c.get("cases", [])]
            checks.append(_build(CheckReport, c))
        data["checks"] = checks
        return _build(cls, data)

    @property
    def eval_error(self) -> EvalError | None:
        e = self.error
        return EvalError(e["kind"], e["detail"], e.get("line"), e.get("stage")) if e else None


@dataclass
class OutputJob:
    key: str  # the cache key of this configuration's reference outputs
    config: dict[str, Any]
    values_from: str | None
    cases: list[str]
    perturbed: bool = False  # only the float64 run on perturbed inputs (sensitivity), for these cases


@dataclass
class ReferenceRequest:
    task_dirs: list[str]
    out_dir: str
    export: bool  # describe each task's production configurations and export its reference's programs
    outputs: list[OutputJob] = field(default_factory=list)  # of the first task

    @classmethod
    def read(cls, path: Path) -> ReferenceRequest:
        data = json.loads(path.read_text())
        data["outputs"] = [_build(OutputJob, o) for o in data.get("outputs", [])]
        return _build(cls, data)


@dataclass
class ReferenceReport:
    # task dir -> {"production": [config JSON], "programs": [file names under out/<index>/], "used_inputs":
    # [[bool per input]], "task_error": str | None}
    exported: dict[str, dict[str, Any]] = field(default_factory=dict)
    outputs: dict[str, dict[str, dict[str, str | None]]] = field(default_factory=dict)  # key -> case -> files
    task_error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> ReferenceReport:
        return _build(cls, json.loads(path.read_text()))
