"""The Search paradigm end to end: the real evaluator, the real queue and runner daemon, SQLite and PostgreSQL,
the real Anthropic SDK against the fake Messages API."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select

from agents import tunable
from agents.local import run_until_settled
from agents.search import NODE_JOB, load_graph, outcome, start_search, stop_search
from agents.search_decide import SearchConfig
from agents.search_node import NodeRunner
from storage import queue, sessions
from storage.connect import open_database
from storage.engine import make_engine
from storage.migrate import upgrade
from storage.models import Candidate, Evaluation, Job, SessionEvent
from storage.settings import Settings, load_settings
from tests.agents.test_auto import BROKEN, GOOD, PLAN, code
from tests.conftest import TASKS
from tests.fakes.anthropic_api import API_KEY, fake_anthropic
from tests.storage.conftest import fresh_database_url
from tests.support.stored_search import stored_search
from tpu_runner.tasks import load_task

SOFTMAX = load_task(TASKS / "softmax")


@pytest.fixture(params=["sqlite", "postgresql"])
def search_settings(request: pytest.FixtureRequest, tmp_path: Path, shared_cache: Path) -> Iterator[Settings]:
    for url in fresh_database_url(request.param, tmp_path):
        engine = make_engine(url)
        upgrade(engine)  # an operator's `kernelbot db upgrade`
        engine.dispose()
        yield load_settings({"KERNELBOT_HOME": str(tmp_path / "home"), "KERNELBOT_DATABASE_URL": url,
                             "KERNELBOT_EVAL_WORKERS": "2", "KERNELBOT_CACHE_DIR": str(shared_cache)})


def _start(engine: Engine, config: SearchConfig, seed: str | None = GOOD, brain: str | None = None) -> str:
    with Session(engine) as s, s.begin():
        return start_search(s, task=SOFTMAX, target="v6e", config=config, seed_code=seed, brain=brain)


@pytest.mark.slow
def test_beam_search_evaluates_each_program_once_and_keeps_the_best(search_settings: Settings) -> None:
    engine = open_database(search_settings)
    session_id = _start(engine, SearchConfig("beam", budget=4, width=2))
    status = run_until_settled(engine, search_settings, session_id, kinds=(NODE_JOB,), workers=2, poll_seconds=0.3)
    assert status == "done"
    with Session(engine) as s:
        result = outcome(s, session_id)
        graph, candidates, evaluations = load_graph(s, session_id)
        jobs = s.exec(select(Job).where(Job.session_id == session_id)).all()
    # A move the compiler refuses for the chip's VMEM is recorded but spends none of the budget; which moves a beam
    # makes depends on which of its two workers finishes first, so some runs have one and some none.
    refused = [cid for cid, e in evaluations.items() if e.error_kind == "vmem_oom"]
    assert result.infeasible == len(refused)
    assert result.evaluations == len(evaluations) - len(refused) <= 4
    ok = [e.speedup for e in evaluations.values() if e.verdict == "ok"]
    assert ok and result.speedup == max(ok) and result.verdict == "ok"  # never worse than its best evaluation
    assert Path(result.kernel_path or "").read_text() == candidates[result.best_candidate_id].code
    # The seed's row tiles are capped by the block-bytes target, so moving them gives the seed's own program:
    duplicates = [c for c in candidates.values() if c.duplicate_of is not None]
    assert duplicates and result.duplicates == len(duplicates)
    assert all(c.id not in evaluations for c in duplicates)
    hashes = [candidates[cid].ir_hash for cid in evaluations if cid not in refused]
    assert None not in hashes and len(set(hashes)) == len(hashes)
    assert all(j.status == "done" for j in jobs) and len(jobs) == len(candidates)
    assert all(c.strategy for c in candidates.values())
    assert sum(n.parent_id is None for n in graph.nodes) == 1


@pytest.mark.slow
def test_a_search_resumes_after_its_runner_died_mid_job(tmp_path: Path, shared_cache: Path) -> None:
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path / "home"), "KERNELBOT_CACHE_DIR": str(shared_cache),
                              "KERNELBOT_DATABASE_URL": f"sqlite:///{tmp_path / 'kb.db'}"})
    engine = open_database(settings)
    session_id = _start(engine, SearchConfig("tune", budget=3, width=1))
    with Session(engine) as s, s.begin():
        # A runner claims every queued job and dies without a word: its leases run out.
        dead = queue.claim(s, runner_id="dead-runner", kinds=[NODE_JOB], targets=["v6e"], lease_seconds=1, limit=10)
    assert len(dead) == 3  # the autotuner queued the seed and two points of its space at once
    status = run_until_settled(engine, settings, session_id, kinds=(NODE_JOB,), workers=2, poll_seconds=0.3)
    assert status == "done"
    with Session(engine) as s:
        result = outcome(s, session_id)
        graph, candidates, evaluations = load_graph(s, session_id)
        retried = [s.get(Job, lease.job_id) for lease in dead]
    assert result.evaluations == 3 and not graph.pending  # duplicates were replaced by fresh points
    assert all(j is not None and j.status == "done" and j.attempts == 2 for j in retried)
    # A node whose work is done only tops up: running it again adds nothing.
    again = NodeRunner(engine=engine, settings=settings, make_brain=lambda record, task: None)  # type: ignore[arg-type,return-value]
    again.run(min(candidates))
    with Session(engine) as s:
        assert len(s.exec(select(Evaluation)).all()) == len(evaluations)
        assert sessions.get_session(s, session_id=session_id).status == "done"


def test_the_best_kernels_likely_range_is_read_back_and_the_ranking_stays_on_the_estimate(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'kernelbot.db'}")
    upgrade(engine)
    session_id = stored_search(engine)
    with Session(engine) as s, s.begin():
        result = outcome(s, session_id)
        stop_search(s, session_id, "enough")
        payload = dict(s.exec(select(SessionEvent).where(SessionEvent.kind == "search_finished")).one().payload or {})
    assert result.speedup == 1.3 and result.best_strategy_path == ["tile_rows"]  # the point estimate ranks
    assert result.band == [0.9, 1.8] and result.seed_band == [1.1, 1.3]
    assert result.to_json()["band"] == [0.9, 1.8]  # in `kernelbot search --json`
    assert (payload["best_speedup"], payload["best_method"], payload["best_band"]) == (1.3, "estimated", [0.9, 1.8])


def test_a_move_the_compiler_refused_for_vmem_is_read_back_apart_and_costs_no_evaluation(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'kernelbot.db'}")
    upgrade(engine)
    session_id = stored_search(engine)
    with Session(engine) as s, s.begin():
        seed = s.exec(select(Candidate).where(Candidate.session_id == session_id, Candidate.parent_id == None)  # noqa: E711
                      ).one()
        tried = (({"BLOCK_ROWS": 4096}, "vmem_oom"), ({"BLOCK_ROWS": 8}, "lowering_error"), (None, "vmem_oom"))
        for params, kind in tried:
            moved = sessions.add_candidate(s, task="softmax", code=f"moved {params} {kind}",
                                           content_hash=f"{params}{kind}", session_id=session_id,
                                           parent_id=seed.id, strategy="grow_block_rows",
                                           meta={"trajectory": 0, "depth": 1, "params": params})
            s.add(Evaluation(candidate_id=moved.id, task="softmax", target="v6e", verdict="compile_error",
                             stage="compile", result={"error": {"kind": kind, "detail": "Ran out of memory in vmem"}}))
    with Session(engine) as s:
        graph, _, _ = load_graph(s, session_id)
        result = outcome(s, session_id)
    # Only the parametric move refused for VMEM is apart: a brain's rewrite that overflows is an evaluation spent.
    assert [n.infeasible for n in graph.nodes] == [False, False, True, False, False]
    assert (result.evaluations, result.infeasible, result.to_json()["infeasible"]) == (4, 1, 1)


def test_a_searchs_best_parameters_are_kept_and_the_next_search_of_the_task_starts_from_them(
        tmp_path: Path) -> None:
    from agents.search import host_jax_version
    from agents.search_decide import ROOT_STRATEGY
    from storage.tuned import tuned_for

    engine = open_database(load_settings({"KERNELBOT_HOME": str(tmp_path)}))
    seed = GOOD
    space = tunable.space(seed)
    assert space, "the seed kernel declares a TUNABLE space"
    name = next(iter(space))
    other = next(v for v in space[name] if v != tunable.current(seed)[name])
    first = _start(engine, SearchConfig("beam", budget=2))
    with Session(engine) as s, s.begin():  # its root evaluated (as a runner records it), then a child, faster
        root = s.exec(select(Candidate).where(Candidate.session_id == first)).one()
        child = sessions.add_candidate(s, task="softmax", code=tunable.with_params(seed, {name: other}),
                                       content_hash="c", session_id=first, parent_id=root.id, strategy="tile",
                                       meta={"trajectory": 0, "depth": 1, "params": {**tunable.current(seed),
                                                                                     name: other}})
        for candidate, speedup in ((root, 1.2), (child, 1.5)):
            s.add(Evaluation(candidate_id=candidate.id, task="softmax", target="v6e", verdict="ok", stage="done",
                             speedup=speedup, method="estimated",
                             result={"jax_version": host_jax_version(), "performance": {"band": None}}))
        s.flush()
        stop_search(s, first, "enough")
        kept = tuned_for(s, task_digest=SOFTMAX.digest, target="v6e", jax_version=host_jax_version() or "")
        assert kept is not None and kept.params and kept.params[name] == other and kept.speedup == 1.5

    second = _start(engine, SearchConfig("beam", budget=2))
    with Session(engine) as s:
        root = s.exec(select(Candidate).where(Candidate.session_id == second,
                                              Candidate.strategy == ROOT_STRATEGY)).one()
        assert tunable.current(root.code)[name] == other  # the seed starts from what the last search found
        reused = s.exec(select(SessionEvent).where(SessionEvent.session_id == second,
                                                   SessionEvent.kind == "tuned_params_reused")).one()
        assert reused.payload and reused.payload["from_session"] == first


def test_a_search_that_cannot_start_says_why(tmp_path: Path) -> None:
    engine = open_database(load_settings({"KERNELBOT_HOME": str(tmp_path)}))
    with pytest.raises(ValueError, match="needs a seed kernel"):
        _start(engine, SearchConfig(), seed=None)
    with pytest.raises(ValueError, match="declares no TUNABLE space"):
        _start(engine, SearchConfig(), seed="def computation(x):\n    return x\n")
    with pytest.raises(ValueError, match="TUNABLE declaration is malformed"):
        _start(engine, SearchConfig(), seed="TUNABLE = {'X': (1,)}\ndef computation(x):\n    return x\n")


@pytest.mark.slow
def test_an_llm_search_repairs_a_broken_root_through_the_self_debugger(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    script = [{"text": PLAN}, {"text": code(BROKEN)}, {"text": code(GOOD)}]
    with fake_anthropic(script) as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
        settings = load_settings({"KERNELBOT_HOME": str(tmp_path / "home"), "ANTHROPIC_API_KEY": API_KEY,
                                  "KERNELBOT_DATABASE_URL": f"sqlite:///{tmp_path / 'kb.db'}",
                                  "KERNELBOT_MODEL": "claude-opus-5-5"})
        engine = open_database(settings)
        session_id = _start(engine, SearchConfig("beam", budget=2, width=1), seed=None, brain="anthropic")
        status = run_until_settled(engine, settings, session_id, kinds=(NODE_JOB,), workers=1, poll_seconds=0.3)
    assert status == "done"
    with Session(engine) as s:
        result = outcome(s, session_id)
        rows = s.exec(select(Candidate).order_by(Candidate.id)).all()
        verdicts = [e.verdict for e in s.exec(select(Evaluation).order_by(Evaluation.id)).all()]
    assert verdicts == ["lowering_error", "ok"]
    assert [c.strategy for c in rows] == ["seed", "self_debug"] and rows[1].parent_id == rows[0].id
    assert result.best_candidate_id == rows[1].id and result.improved
    debug_prompt = fake.requests[2]["body"]["messages"][0]["content"]
    assert "block_shape" in debug_prompt  # the evaluator's structured error reached the self-debugger


@pytest.mark.slow
def test_a_search_on_a_task_this_host_never_had_runs_from_the_files_it_carries(tmp_path: Path) -> None:
    """A task pasted in Slack lives on the host that checked it; a runner elsewhere gets it from the session."""
    pasted = tmp_path / "pasted" / "softmax"
    shutil.copytree(TASKS / "softmax", pasted, ignore=shutil.ignore_patterns("solutions"))
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path / "home"),
                              "KERNELBOT_DATABASE_URL": f"sqlite:///{tmp_path / 'kb.db'}"})
    engine = open_database(settings)
    with Session(engine) as s, s.begin():
        session_id = start_search(s, task=load_task(pasted), target="v6e", config=SearchConfig("tune", budget=1,
                                                                                               width=1),
                                  seed_code=GOOD, brain=None)
    shutil.rmtree(tmp_path / "pasted")  # the runner's host: no such directory
    status = run_until_settled(engine, settings, session_id, kinds=(NODE_JOB,), workers=1, poll_seconds=0.3)
    assert status == "done"
    with Session(engine) as s:
        result = outcome(s, session_id)
    assert result.evaluations == 1 and result.verdict == "ok"
    written = list((tmp_path / "home" / "tasks").glob("softmax-*"))
    assert len(written) == 1
    assert (written[0] / "reference.py").read_text() == (TASKS / "softmax/reference.py").read_text()
