"""The evaluator's answer, as plain data that serialises to the documented JSON object."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Verdict = Literal["ok", "unverified", "rejected", "lowering_error", "compile_error", "incorrect", "timeout",
                  "crashed", "duplicate"]
Stage = Literal["static", "lower", "compile", "correctness", "performance", "profile", "done"]
Host = Literal["cpu", "tpu"]

# The verdict a failure at each stage gives (timeouts and crashes can happen at any stage).
VERDICT_FOR_STAGE: dict[str, Verdict] = {
    "static": "rejected",
    "lower": "lowering_error",
    "compile": "compile_error",
    "correctness": "incorrect",
    "performance": "crashed",
    "profile": "crashed",
}


@dataclass(frozen=True)
class EvalError:
    """What went wrong, in a form a self-debugging agent can act on."""

    kind: str  # vmem_oom, block_shape, unsupported_primitive, alignment, mismatch, nan, timeout, ...
    detail: str
    line: int | None = None  # the candidate's source line, when known
    stage: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "line": self.line, "detail": self.detail, "stage": self.stage}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EvalError:
        return cls(data["kind"], data["detail"], data.get("line"), data.get("stage"))


@dataclass
class CorrectnessCase:
    name: str  # e.g. "test[0]/normal/seed=1"
    status: Literal["passed", "failed", "skipped"]
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    note: str = ""


@dataclass
class Correctness:
    status: Literal["passed", "failed", "not_checked"]
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    cases: list[CorrectnessCase] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Performance:
    method: Literal["measured", "estimated"]
    unit: str  # "ms"
    reference: float
    candidate: float
    speedup: float
    roofline_fraction: float | None
    roofline_ms: float
    bound: str  # "compute" | "memory"
    flops: float
    bytes: float
    flags: list[str] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)
    # The speedup's likely range [low, high] from the estimate's measured fidelity (None: measured on a device).
    band: list[float] | None = None


@dataclass
class EvalResult:
    task: str
    target: str
    host: Host
    verdict: Verdict
    stage: Stage
    message: str
    error: EvalError | None = None
    correctness: Correctness | None = None
    performance: Performance | None = None
    profile: dict[str, Any] | None = None
    artifacts: dict[str, str] = field(default_factory=dict)
    # seconds spent per stage, plus "overhead"; and resident memory in MiB: the child's peak ("peak_rss_mib") and its
    # high-water mark at the end of each stage ("rss_mib.<stage>")
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    jax_version: str | None = None  # the evaluating host's JAX (what tuned parameters are kept per)
    ir_hash: str | None = None  # digest of the normalised lowered IR (tpu_runner.analysis.ir), once lowering succeeded

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["error"] = self.error.to_json() if self.error else None
        if self.correctness is None:
            data["correctness"] = {"status": "not_checked", "max_abs_err": None, "max_rel_err": None,
                                   "cases": [], "notes": []}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EvalResult:
        data = dict(data)
        err = data.get("error")
        data["error"] = EvalError(**err) if err else None
        corr = data.get("correctness")
        if corr:
            corr = dict(corr)
            corr["cases"] = [CorrectnessCase(**c) for c in corr.get("cases", [])]
            data["correctness"] = Correctness(**corr)
        perf = data.get("performance")
        data["performance"] = Performance(**perf) if perf else None
        return cls(**data)


def failure(*, task: str, target: str, host: Host, stage: Stage, error: EvalError,
            verdict: Verdict | None = None, **extra: Any) -> EvalResult:
    """A result for a candidate that stopped at `stage`."""
    verdict = verdict or VERDICT_FOR_STAGE[stage]
    message = f"{verdict} at {stage}: {error.kind}"
    if error.line:
        message += f" (line {error.line})"
    first_line = error.detail.strip().splitlines()[0] if error.detail.strip() else ""
    if first_line:
        message += f" — {first_line[:300]}"
    return EvalResult(task=task, target=target, host=host, verdict=verdict, stage=stage, message=message,
                      error=EvalError(error.kind, error.detail, error.line, stage), **extra)
