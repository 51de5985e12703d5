"""Tuned parameters per (task, chip, JAX version): what a search found best, kept for the next search to start from.

A record is replaced only by a clearly faster kernel (`better`: a measured one beyond its spread), so a rerun
that lands inside the noise of the kept one does not churn it; a measurement replaces an estimate whatever the
figures (an estimate is not a time on the chip), and an estimate never replaces a measurement.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlmodel import Session, select

from storage.models import TunedParams, now

# (speedup, band, method, over) -> whether that kernel is clearly faster than `over`
Better = Callable[[float, list[float] | None, str | None, float], bool]


def tuned_for(s: Session, *, task_digest: str, target: str, jax_version: str) -> TunedParams | None:
    return s.exec(select(TunedParams).where(TunedParams.task_digest == task_digest, TunedParams.target == target,
                                            TunedParams.jax_version == jax_version)).first()


def keep_tuned(s: Session, *, task: str, task_digest: str, target: str, jax_version: str, params: dict[str, Any],
               speedup: float, method: str, band: list[float] | None, better: Better,
               session_id: str | None = None, candidate_id: int | None = None) -> bool:
    """Keep `params` for the key unless what is kept there already is as fast (by `better`); True if kept."""
    kept = tuned_for(s, task_digest=task_digest, target=target, jax_version=jax_version)
    if kept is not None:
        measured, was_measured = method == "measured", kept.method == "measured"
        if kept.params == params or (was_measured and not measured):
            return False
        if measured == was_measured and not better(speedup, band, method, kept.speedup):
            return False
    row = kept or TunedParams(task=task, task_digest=task_digest, target=target, jax_version=jax_version,
                              params=params, speedup=speedup, method=method)
    row.params, row.speedup, row.method, row.band = params, speedup, method, band
    row.session_id, row.candidate_id, row.updated_at = session_id, candidate_id, now()
    s.add(row)
    s.flush()
    return True
