"""A speedup as people read it on every surface (terminal, result card, summaries, digests, App Home): the point
estimate, how it was obtained and, for an estimate, its likely range - 'x1.04 estimated, likely x0.90-x1.20: no
clear gain'. The wording is `tpu_runner.timing.band`'s; this only reads it from the plain data the surfaces hold (step
outputs, stored evaluations, summaries). Ranking stays on the point estimate."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tpu_runner.timing import clear_gain, describe_speedup


def stored_band(result: dict[str, Any] | None) -> list[float] | None:
    """The band of a stored evaluator answer (`EvalResult.to_json`); None when measured or stored before bands."""
    band = ((result or {}).get("performance") or {}).get("band")
    return [float(v) for v in band] if band else None


def speedup_text(speedup: float | None, method: str | None, band: list[float] | None = None) -> str:
    """'x1.04 estimated, likely x0.90-x1.20: no clear gain', 'x2.10 measured'; '' when there is no speedup."""
    if speedup is None:
        return ""
    return describe_speedup(SimpleNamespace(speedup=speedup, method=method or "estimated", band=band))


def outcome_speedup(outcome: dict[str, Any]) -> str:
    """`speedup_text` of a dict holding speedup, method and (when estimated) band."""
    return speedup_text(outcome.get("speedup"), outcome.get("method"), outcome.get("band"))


def evaluation_speedup(evaluation: Any) -> str:
    """`speedup_text` of a stored Evaluation row (its band read from the evaluator's answer); '' without one."""
    if evaluation is None or not evaluation.speedup:
        return ""
    return speedup_text(evaluation.speedup, evaluation.method, stored_band(evaluation.result))


def no_clear_gain(band: list[float] | None) -> bool:
    """True when the band includes 1 or lies below it (False when there is no band: a measured speedup)."""
    return clear_gain(SimpleNamespace(band=band)) is False
