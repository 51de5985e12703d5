"""The Search paradigm over the database: the graph is the session's candidates, every expansion a queue job.

`start_search` records the session and its seed; `top_up` (called at the start and at the end of every node
job, under the session's row lock) asks `search_decide` what to create next and enqueues one `search_node` job
per new candidate, so the expansions spread over every free runner and nothing blocks waiting. A node job
(`agents.search_node`) generates its candidate when a brain must write it, evaluates it with the IR gate (a
program the session has evaluated is not evaluated again) and records the evaluation. A crash loses nothing:
the graph and the queue are the whole state, and a node job that finds its work done only tops up.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlmodel import Session, col, select

from agents import strategies, tunable
from agents.search_decide import ROOT_STRATEGY, Graph, Node, SearchConfig, next_expansions
from agents.session_task import carried_files
from storage import queue, sessions, tuned
from storage.errors import KernelbotError
from storage.models import Candidate, Evaluation, Job, KernelSession
from tpu_runner.tasks import Task
from tpu_runner.timing import clear_improvement

NODE_JOB = "search_node"


class SearchError(KernelbotError, ValueError):
    """The search cannot start as asked; the message says why and what to do."""
    next_step = ("give the search what the message names: a seed kernel (--seed FILE; one with a TUNABLE space "
                 "for the tuner) or a brain (--brain)")


@dataclass(frozen=True)
class SearchOutcome:
    session_id: str
    task: str
    status: str
    strategy: str
    verdict: str | None  # of the best candidate (ok), or of the seed when no candidate was ok
    speedup: float | None
    method: str | None
    kernel_path: str | None
    evaluations: int
    duplicates: int
    budget: int
    best_candidate_id: int | None
    best_strategy_path: list[str]  # the strategies from the seed to the best candidate
    reference_ms: float | None = None  # the XLA reference's time, and the reported candidate's
    kernel_ms: float | None = None
    roofline_fraction: float | None = None
    profile_chart: str | None = None
    seed_speedup: float | None = None  # where the search started (the seed's own evaluation)
    band: list[float] | None = None  # the best speedup's likely range (None: measured, or stored before bands)
    seed_band: list[float] | None = None
    infeasible: int = 0  # moves the compiler refused for the chip's VMEM (not counted as evaluations)

    @property
    def improved(self) -> bool:
        """Only an ok candidate faster than the reference is an improvement."""
        return self.speedup is not None and self.speedup > 1.0

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "verdict": self.verdict, "speedup": self.speedup, "method": self.method,
                "kernel_path": self.kernel_path, "evaluations": self.evaluations, "session_id": self.session_id,
                "status": self.status, "strategy": self.strategy, "duplicates": self.duplicates,
                "budget": self.budget, "best_candidate_id": self.best_candidate_id, "improved": self.improved,
                "best_strategy_path": self.best_strategy_path, "reference_ms": self.reference_ms,
                "kernel_ms": self.kernel_ms, "roofline_fraction": self.roofline_fraction,
                "profile_chart": self.profile_chart, "seed_speedup": self.seed_speedup, "band": self.band,
                "seed_band": self.seed_band, "infeasible": self.infeasible}


def program_digest(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()[:16]


def params_of(code: str) -> dict[str, Any] | None:
    try:
        return tunable.current(code) if tunable.space(code) else None
    except tunable.TunableError:
        return None


def start_search(s: Session, *, task: Task, target: str, config: SearchConfig, seed_code: str | None,
                 brain: str | None, owner: str | None = None, slack_channel: str | None = None,
                 slack_thread_ts: str | None = None) -> str:
    """Record a search session with its seed candidate and enqueue the first jobs; returns the session id. The
    session carries its task's files, so a runner on any host can run it."""
    if seed_code is None and brain is None:
        raise SearchError("a search needs a seed kernel (--seed FILE) or a brain to write one (--brain)")
    if seed_code is not None:
        try:
            space = tunable.space(seed_code)
        except tunable.TunableError as exc:
            raise SearchError(f"the seed kernel's TUNABLE declaration is malformed: {exc}") from exc
        if config.strategy == "tune" and not space:
            raise SearchError("the autotuner (--strategy tune) needs a seed kernel that declares a TUNABLE space")
        if brain is None and not space:
            raise SearchError("without a brain the search can only move tunable parameters, and the seed kernel "
                              "declares no TUNABLE space; add one (see agents/tunable.py) or use --brain")
    record = sessions.create_session(s, mode="search", task=task.task_id, target=target, owner=owner,
                                     task_dir=str(task.path), budget={"search": config.to_json(), "brain": brain,
                                                                      "task_files": carried_files(task),
                                                                      "task_digest": task.digest},
                                     slack_channel=slack_channel, slack_thread_ts=slack_thread_ts)
    sessions.add_event(s, session_id=record.id, kind="session_started",
                       payload={"mode": "search", "task": task.task_id, "target": target, "owner": owner,
                                "strategy": config.strategy, "budget": config.budget})
    code = _from_tuned(s, seed_code, task, target, record.id) if seed_code else ""
    sessions.add_candidate(s, task=task.task_id, code=code, content_hash=program_digest(code) if code else "",
                           session_id=record.id, strategy=ROOT_STRATEGY,
                           meta={"trajectory": 0, "depth": 0, "params": params_of(code) if code else None})
    top_up(s, record.id, task=task)
    return record.id


def host_jax_version() -> str | None:
    """This host's JAX, read from its metadata (no import of JAX): what tuned parameters are looked up by."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jax")
    except PackageNotFoundError:
        return None


def _from_tuned(s: Session, seed_code: str, task: Task, target: str, session_id: str) -> str:
    """The seed with the parameters an earlier search of this task found best on this chip under this host's JAX,
    where the seed declares them all among its choices (else the seed as given)."""
    jax_version = host_jax_version()
    kept = tuned.tuned_for(s, task_digest=task.digest, target=target, jax_version=jax_version) \
        if jax_version else None
    if kept is None or not kept.params:
        return seed_code
    space = tunable.space(seed_code)
    if not all(name in space and value in space[name] for name, value in kept.params.items()):
        return seed_code
    sessions.add_event(s, session_id=session_id, kind="tuned_params_reused", payload={
        "params": kept.params, "speedup": kept.speedup, "method": kept.method, "from_session": kept.session_id,
        "jax_version": jax_version})
    return tunable.with_params(seed_code, kept.params)


def _keep_best(s: Session, record: KernelSession, best: Node | None, e: Evaluation | None) -> None:
    """The best kernel's parameters, kept for the next search of the task on this chip under the JAX it was
    evaluated with, unless a kernel kept there is as fast."""
    digest = (record.budget or {}).get("task_digest")
    jax_version = (e.result or {}).get("jax_version") if e else None
    if best is None or best.score is None or not best.params or not digest or e is None or not jax_version:
        return
    tuned.keep_tuned(s, task=record.task, task_digest=digest, target=record.target, jax_version=jax_version,
                     params=best.params, speedup=best.score, method=e.method or "estimated", band=_band(e),
                     better=clear_improvement, session_id=record.id, candidate_id=best.id)


# -- the graph as the decisions see it ------------------------------------------------------------------------
def load_graph(s: Session, session_id: str) -> tuple[Graph, dict[int, Candidate], dict[int, Evaluation]]:
    candidates = {c.id: c for c in s.exec(select(Candidate).where(Candidate.session_id == session_id)
                                          .order_by(col(Candidate.id))).all() if c.id is not None}
    evaluations: dict[int, Evaluation] = {}
    if candidates:
        for e in s.exec(select(Evaluation).where(col(Evaluation.candidate_id).in_(list(candidates)))
                        .order_by(col(Evaluation.id))).all():
            evaluations[e.candidate_id] = e  # type: ignore[index]
    nodes = []
    for cid, c in candidates.items():
        meta = c.meta or {}
        e = evaluations.get(cid)
        state = ("evaluated" if e else "duplicate" if c.duplicate_of else "failed" if meta.get("error")
                 else "pending")
        nodes.append(Node(id=cid, parent_id=c.parent_id, strategy=c.strategy, trajectory=int(meta.get("trajectory", 0)),
                          depth=int(meta.get("depth", 0)), state=state, verdict=e.verdict if e else None,
                          speedup=e.speedup if e else None, params=meta.get("params"),
                          method=e.method if e else None, band=_range(e),
                          infeasible=_beyond_vmem(c, e)))
    return Graph(nodes), candidates, evaluations


def _beyond_vmem(c: Candidate, e: Evaluation | None) -> bool:
    """A parametric move (a child with tunables set) the compiler refused for the chip's VMEM."""
    return (e is not None and c.parent_id is not None and (c.meta or {}).get("params") is not None
            and e.verdict == "compile_error" and e.error_kind == "vmem_oom")


def _options(candidates: dict[int, Candidate], family: str | None, brain: str | None):
    """What may be done to a node: parametric moves always; strategies in words only with an LLM brain; repairs
    of a candidate that failed to lower or compile with any brain (the offline one shrinks its blocks)."""
    with_llm = brain not in (None, "offline")

    def options(node: Node) -> list[tuple[str, dict[str, Any] | None]]:
        if node.score is None:
            return [("self_debug", None)] if brain else []
        code = candidates[node.id].code
        try:
            space = tunable.space(code)
        except tunable.TunableError:
            space = {}
        params = tunable.current(code) if space else {}
        out: list[tuple[str, dict[str, Any] | None]] = []
        for strategy in strategies.for_family(family):
            moved = strategy.apply(params, space) if space else None
            if moved is not None:
                out.append((strategy.id, moved))
            elif with_llm:
                out.append((strategy.id, None))
        return out

    return options


def _sampler(seed_code: str):
    space = tunable.space(seed_code) if seed_code else {}

    def sample(n: int, rng: Any, known: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return tunable.sample(space, n, rng, tuple(known)) if space else []

    return sample


def _lock(s: Session, session_id: str) -> KernelSession:
    record = s.exec(select(KernelSession).where(KernelSession.id == session_id).with_for_update()).first()
    if record is None:
        raise LookupError(f"no session {session_id}")
    return record


def top_up(s: Session, session_id: str, *, task: Task) -> list[int]:
    """Create and enqueue what the search should do next; finish the session when nothing is left.
    Runs in the caller's transaction, under the session's row lock, on the task as the caller loaded it. Returns
    the new candidate ids."""
    record = _lock(s, session_id)
    if record.status != "active":
        return []
    budget = dict(record.budget or {})
    config = SearchConfig(**budget["search"])
    graph, candidates, _ = load_graph(s, session_id)
    root = candidates[min(candidates)]
    options = _options(candidates, task.family, budget.get("brain"))
    created: list[int] = []
    for exp in next_expansions(graph, config, options, _sampler(root.code)):
        parent = candidates[exp.parent_id] if exp.parent_id is not None else None
        code = tunable.with_params(parent.code, exp.params) if parent is not None and exp.params is not None else ""
        depth = int((parent.meta or {}).get("depth", 0)) + 1 if parent is not None else 0
        digest = program_digest(code) if code else ""
        child = sessions.add_candidate(s, task=record.task, code=code, content_hash=digest, session_id=session_id,
                                       parent_id=exp.parent_id, strategy=exp.strategy,
                                       meta={"trajectory": exp.trajectory, "depth": depth, "params": exp.params})
        created.append(child.id)  # type: ignore[arg-type]
    pending = _without_failed_jobs(s, [n.id for n in graph.pending]) + created
    for cid in pending:
        queue.enqueue(s, kind=NODE_JOB, payload={"session_id": session_id, "candidate_id": cid},
                      dedup_key=f"{NODE_JOB}:{cid}", target=record.target, session_id=session_id)
    if not pending:
        _finish(s, record, graph)
    return created


def _without_failed_jobs(s: Session, candidate_ids: list[int]) -> list[int]:
    """Pending candidates whose job has failed for good are marked failed rather than queued again."""
    if not candidate_ids:
        return []
    keys = {f"{NODE_JOB}:{cid}": cid for cid in candidate_ids}
    jobs = s.exec(select(Job).where(col(Job.dedup_key).in_(list(keys))).order_by(col(Job.id))).all()
    latest = {job.dedup_key: job for job in jobs}
    keep = []
    for key, cid in keys.items():
        job = latest.get(key)
        if job is not None and job.status == "failed":
            candidate = s.get(Candidate, cid)
            assert candidate is not None
            candidate.meta = {**(candidate.meta or {}), "error": f"its job failed: {job.last_error or ''}"[:500]}
            s.add(candidate)
        else:
            keep.append(cid)
    return keep


def _latest_evaluation(s: Session, candidate_id: int | None) -> Evaluation | None:
    if candidate_id is None:
        return None
    return s.exec(select(Evaluation).where(Evaluation.candidate_id == candidate_id)
                  .order_by(col(Evaluation.id).desc())).first()


def _range(e: Evaluation | None) -> tuple[float, float] | None:
    band = _band(e)
    return (band[0], band[1]) if band else None


def _band(e: Evaluation | None) -> list[float] | None:
    """An evaluated speedup's likely range (None: measured, not evaluated, or stored before bands)."""
    return ((e.result or {}).get("performance") or {}).get("band") if e else None


def _finish(s: Session, record: KernelSession, graph: Graph, reason: str = "") -> None:
    best = graph.best()
    record.status = "done"
    record.best_candidate_id = best.id if best else None
    s.add(record)
    e = _latest_evaluation(s, record.best_candidate_id)
    _keep_best(s, record, best, e)
    # The best speedup's method and likely range (band None: measured) for the thread's root and the digests.
    sessions.add_event(s, session_id=record.id, kind="search_finished", payload={
        "evaluations": graph.evaluations, "best_candidate_id": record.best_candidate_id,
        "best_speedup": best.score if best else None, "best_method": e.method if e else None,
        "best_band": _band(e),
        "reason": reason or "budget or strategies exhausted"})


def stop_search(s: Session, session_id: str, reason: str) -> None:
    record = _lock(s, session_id)
    if record.status == "active":
        graph, _, _ = load_graph(s, session_id)
        _finish(s, record, graph, reason)


# -- results ----------------------------------------------------------------------------------------------------
def outcome(s: Session, session_id: str) -> SearchOutcome:
    record = sessions.get_session(s, session_id=session_id)
    graph, candidates, evaluations = load_graph(s, session_id)
    config = SearchConfig(**(record.budget or {})["search"])
    best = graph.best()
    shown = best or next((n for n in graph.nodes if n.state == "evaluated"), None)
    e = evaluations.get(shown.id) if shown else None
    path: list[str] = []
    node = best
    by_id = {n.id: n for n in graph.nodes}
    while node is not None and node.parent_id is not None:
        path.insert(0, node.strategy or "")
        node = by_id.get(node.parent_id)
    kernel = str(Path(e.artifacts_dir) / "candidate.py") if e and e.artifacts_dir and best else None
    perf = ((e.result or {}).get("performance") or {}) if e else {}
    root = min(candidates) if candidates else None
    seed_eval = evaluations.get(root) if root is not None else None
    return SearchOutcome(session_id=session_id, task=record.task, status=record.status, strategy=config.strategy,
                         verdict=e.verdict if e else None, speedup=e.speedup if e and best else None,
                         method=e.method if e else None, kernel_path=kernel, evaluations=graph.evaluations,
                         duplicates=sum(n.state == "duplicate" for n in graph.nodes), budget=config.budget,
                         best_candidate_id=best.id if best else None, best_strategy_path=path,
                         reference_ms=perf.get("reference"), kernel_ms=perf.get("candidate") if best else None,
                         roofline_fraction=perf.get("roofline_fraction") if best else None,
                         profile_chart=((e.result or {}).get("artifacts") or {}).get("profile_chart") if e and best
                         else None,
                         seed_speedup=seed_eval.speedup if seed_eval and seed_eval.verdict == "ok" else None,
                         band=_band(e) if best else None,
                         seed_band=_band(seed_eval) if seed_eval and seed_eval.verdict == "ok" else None,
                         infeasible=graph.infeasible)
