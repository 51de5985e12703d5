"""Tuned parameters per (task, chip, JAX version), on SQLite and PostgreSQL: kept, replaced only by a clearly faster
kernel, a measurement over an estimate and never the reverse."""

from __future__ import annotations

from sqlalchemy import Engine
from sqlmodel import Session

from storage.tuned import keep_tuned, tuned_for
from tpu_runner.timing import clear_improvement

KEY = {"task_digest": "d1", "target": "v5e", "jax_version": "0.10.2"}


def _keep(s: Session, params: dict, speedup: float, method: str, band: list[float] | None = None) -> bool:
    return keep_tuned(s, task="softmax", **KEY, params=params, speedup=speedup, method=method, band=band,
                      better=clear_improvement, session_id="s1")


def test_the_best_parameters_are_kept_per_task_chip_and_jax_and_replaced_only_when_clearly_beaten(
        engine: Engine) -> None:
    with Session(engine) as s, s.begin():
        assert tuned_for(s, **KEY) is None
        assert _keep(s, {"BLOCK": 256}, 1.8, "estimated")
        assert not _keep(s, {"BLOCK": 512}, 1.7, "estimated")  # slower
        assert _keep(s, {"BLOCK": 512}, 1.2, "measured", [1.19, 1.21])  # a time on the chip beats any estimate
        assert not _keep(s, {"BLOCK": 1024}, 2.5, "estimated")  # an estimate never replaces a measurement
        assert not _keep(s, {"BLOCK": 1024}, 1.21, "measured", [1.20, 1.22])  # inside its spread: no gain
        assert _keep(s, {"BLOCK": 1024}, 1.30, "measured", [1.28, 1.32])
        assert tuned_for(s, **{**KEY, "jax_version": "0.12.0.1"}) is None  # another JAX starts afresh
    with Session(engine) as s:
        kept = tuned_for(s, **KEY)
        assert kept is not None and (kept.params, kept.speedup, kept.method) == ({"BLOCK": 1024}, 1.30, "measured")
        assert kept.band == [1.28, 1.32] and kept.session_id == "s1"
