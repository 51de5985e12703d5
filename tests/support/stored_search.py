"""A finished-looking search as the database keeps it, written directly (no evaluation, no compile): for the
tests of what is read back from stored evaluations."""

from __future__ import annotations

from sqlalchemy import Engine
from sqlmodel import Session

from agents.search_decide import ROOT_STRATEGY, SearchConfig
from storage import sessions
from storage.models import Candidate, Evaluation


def _evaluated(s: Session, candidate: Candidate, speedup: float, band: list[float]) -> None:
    s.add(Evaluation(candidate_id=candidate.id, task=candidate.task, target="v6e", verdict="ok", stage="done",
                     speedup=speedup, method="estimated",
                     result={"performance": {"speedup": speedup, "method": "estimated", "band": band}}))


def stored_search(engine: Engine, *, owner: str | None = None, slack_channel: str | None = None) -> str:
    """A search session of two evaluated candidates: the seed's estimated x1.20 is a clear gain (likely
    x1.10-x1.30), its child's x1.30 is not (likely x0.90-x1.80) and is the best by the point estimate."""
    with Session(engine) as s, s.begin():
        record = sessions.create_session(s, mode="search", task="softmax", target="v6e", owner=owner,
                                         slack_channel=slack_channel,
                                         budget={"search": SearchConfig("beam", budget=4).to_json()})
        sessions.add_event(s, session_id=record.id, kind="session_started",
                           payload={"mode": "search", "task": "softmax", "target": "v6e", "owner": owner,
                                    "strategy": "beam", "budget": 4})
        seed = sessions.add_candidate(s, task="softmax", code="seed", content_hash="a", session_id=record.id,
                                      strategy=ROOT_STRATEGY, meta={"trajectory": 0, "depth": 0})
        child = sessions.add_candidate(s, task="softmax", code="child", content_hash="b", session_id=record.id,
                                       parent_id=seed.id, strategy="tile_rows", meta={"trajectory": 0, "depth": 1})
        _evaluated(s, seed, 1.2, [1.1, 1.3])
        _evaluated(s, child, 1.3, [0.9, 1.8])
        return record.id
