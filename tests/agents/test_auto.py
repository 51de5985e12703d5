"""The Auto paradigm: its decisions, an end-to-end session with the real SDK against the fake Messages API and
the real evaluator, and a crash between steps that resumes where it was."""

from __future__ import annotations

from pathlib import Path

import anthropic
import pytest
from sqlmodel import Session, select

from agents.anthropic_brain import AnthropicBrain
from agents.auto import AutoLoop
from agents.auto_decide import AutoConfig, StepRecord, next_action, progress
from agents.brain import BrainReply, BrainRequest, Budget, ScriptedBrain
from agents.subagents import PLAN_SECTIONS, TaskContext
from storage import sessions
from storage.engine import make_engine
from storage.migrate import upgrade
from storage.models import Candidate, Evaluation, SessionEvent, Step
from storage.settings import Settings
from tests.conftest import CORPUS, TASKS
from tests.fakes.anthropic_api import API_KEY, fake_anthropic
from tpu_runner.candidate import SparePool
from tpu_runner.evaluation import EvalRequest, KernelSource
from tpu_runner.evaluation.evaluate import evaluate

PLAN = "\n".join(f"## {s.title()}\n{s}: details" for s in PLAN_SECTIONS)
BROKEN = (CORPUS / "bad/misaligned_block.py").read_text()
GOOD = (TASKS / "softmax/solutions/pallas.py").read_text()
CTX = TaskContext(task_id="softmax", reference_source=(TASKS / "softmax/reference.py").read_text(),
                  signature="computation(x: f32[8192,8192])", target="v6e", hardware="v6e")


def code(source: str) -> str:
    return f"```python\n{source}```"


def S(kind: str, **outputs: object) -> StepRecord:  # noqa: N802
    return StepRecord(kind, dict(outputs))


# --- decisions ----------------------------------------------------------------------------------------------------


def test_an_iteration_runs_plan_implement_evaluate_analyse() -> None:
    config = AutoConfig(max_iterations=2)
    assert next_action([], config) == "plan"
    assert next_action([S("plan")], config) == "implement"
    assert next_action([S("plan"), S("implement")], config) == "evaluate"
    ok = [S("plan"), S("implement"), S("evaluate", verdict="ok", speedup=1.5, candidate_id=1)]
    assert next_action(ok, config) == "analyse"
    assert next_action([*ok, S("analyse")], config) == "plan"
    assert next_action([*ok, S("analyse"), *ok, S("analyse")], config) == "stop:iterations"


def test_failures_are_debugged_then_given_up() -> None:
    config = AutoConfig(max_debug_attempts=1)
    failed = [S("plan"), S("implement"), S("evaluate", verdict="compile_error")]
    assert next_action(failed, config) == "debug"
    twice = [*failed, S("debug"), S("evaluate", verdict="compile_error")]
    assert next_action(twice, config) == "give_up"
    assert next_action([*twice, S("give_up")], config) == "plan"


def test_a_kernel_slower_than_the_reference_is_never_the_best() -> None:
    slow = [S("plan"), S("implement"), S("evaluate", verdict="ok", speedup=0.8, candidate_id=7), S("analyse")]
    assert progress(slow).best_candidate_id is None
    faster = [*slow, S("plan"), S("implement"), S("evaluate", verdict="ok", speedup=1.2, candidate_id=8)]
    assert progress(faster).best_candidate_id == 8


def test_a_measured_kernel_is_better_only_beyond_its_spread() -> None:
    first = [S("plan"), S("implement"), S("evaluate", verdict="ok", speedup=1.20, candidate_id=1,
                                         method="measured", band=[1.19, 1.21]), S("analyse")]
    inside = [S("plan"), S("implement"), S("evaluate", verdict="ok", speedup=1.205, candidate_id=2,
                                          method="measured", band=[1.19, 1.22]), S("analyse")]
    beyond = [S("plan"), S("implement"), S("evaluate", verdict="ok", speedup=1.30, candidate_id=3,
                                          method="measured", band=[1.28, 1.32]), S("analyse")]
    assert progress([*first, *inside]).best_candidate_id == 1
    assert progress([*first, *inside]).since_improvement == 1
    assert progress([*first, *inside, *beyond]).best_candidate_id == 3
    within_noise_of_the_reference = [S("plan"), S("implement"), S("evaluate", verdict="ok", speedup=1.005,
                                                                  candidate_id=4, method="measured",
                                                                  band=[0.99, 1.02])]
    assert progress(within_noise_of_the_reference).best_candidate_id is None


def test_plateau_and_target_stop_the_loop() -> None:
    it = [S("plan"), S("implement"), S("evaluate", verdict="ok", speedup=2.0, candidate_id=1), S("analyse")]
    flat = [S("plan"), S("implement"), S("evaluate", verdict="ok", speedup=1.5, candidate_id=2), S("analyse")]
    assert next_action([*it, *flat, *flat], AutoConfig(max_iterations=9, plateau=2)) == "stop:plateau"
    assert next_action(it, AutoConfig(target_speedup=1.9)) == "stop:target"
    with pytest.raises(ValueError):
        AutoConfig(max_iterations=0)


# --- sessions -----------------------------------------------------------------------------------------------------


def _engine(tmp_path: Path):  # type: ignore[no-untyped-def]
    engine = make_engine(f"sqlite:///{tmp_path / 'kernelbot.db'}")
    upgrade(engine)
    return engine


def _new_session(engine) -> str:  # type: ignore[no-untyped-def]
    with Session(engine) as s, s.begin():
        return sessions.create_session(s, mode="auto", task="softmax", target="v6e").id


def _evaluator(settings: Settings, spares: SparePool):  # type: ignore[no-untyped-def]
    # The worker's pool, as a runner keeps one: its compile servers start once, not per evaluation.
    return lambda code, on_stage=None: evaluate(EvalRequest(TASKS / "softmax", KernelSource(code), "v6e"), settings,
                                                on_stage=on_stage, spares=spares)


@pytest.mark.slow
def test_scripted_anthropic_session_fixes_a_compile_failure_and_stops_on_budget(tmp_path: Path, settings: Settings,
                                                                                 spares: SparePool) -> None:
    script = [{"text": PLAN}, {"text": code(BROKEN)}, {"text": code(GOOD)}, {"text": "HBM-bound at the roofline."},
              {"text": PLAN}]
    engine = _engine(tmp_path)
    session_id = _new_session(engine)
    with fake_anthropic(script) as fake:
        client = anthropic.Anthropic(api_key=API_KEY, base_url=fake.base_url, max_retries=0)
        brain = AnthropicBrain(client=client, model="claude-opus-5-5", budget=Budget(max_requests=5))
        loop = AutoLoop(engine=engine, brain=brain, ctx=CTX, evaluate=_evaluator(settings, spares),
                        workdir=tmp_path / "k", config=AutoConfig(max_iterations=5))
        outcome = loop.run(session_id)
    assert outcome.stop_reason.startswith("budget: request budget spent")
    assert outcome.evaluations == 2 and outcome.best_speedup is not None and outcome.best_speedup > 1.0
    assert outcome.best_result is not None and outcome.best_result["verdict"] == "ok"
    assert Path(outcome.best_kernel_path or "").read_text() == GOOD
    with Session(engine) as s:
        kinds = [st.kind for st in sessions.get_steps(s, session_id=session_id)]
        assert kinds == ["plan", "implement", "evaluate", "debug", "evaluate", "analyse", "plan"]
        verdicts = [e.verdict for e in s.exec(select(Evaluation).order_by(Evaluation.id)).all()]
        assert verdicts == ["lowering_error", "ok"]
        fixed = s.get(Candidate, outcome.best_candidate_id)
        assert fixed is not None and fixed.parent_id is not None  # the debugger's fix descends from the original
        (event,) = s.exec(select(SessionEvent).where(SessionEvent.kind == "auto_finished")).all()
        assert event.payload["best_candidate_id"] == outcome.best_candidate_id
        step_events = s.exec(select(SessionEvent).where(SessionEvent.kind == "step").order_by(SessionEvent.id)).all()
        assert [e.payload["kind"] for e in step_events] == kinds  # every step reaches the surfaces, in order
        assert [e.payload.get("verdict") for e in step_events if e.payload["kind"] == "evaluate"] == \
            ["lowering_error", "ok"]
        assert sessions.get_session(s, session_id=session_id).status == "done"
    debug_prompt = fake.requests[2]["body"]["messages"][0]["content"]
    assert "lower stage (block_shape" in debug_prompt  # the structured error reached the self-debugger


class CrashingBrain(ScriptedBrain):
    def ask(self, request: BrainRequest) -> BrainReply:
        if request.role == "analyst":
            raise KeyboardInterrupt("the process died")  # not an error the loop handles: like a crash
        return super().ask(request)


@pytest.mark.slow
def test_a_crash_between_steps_resumes_where_it_was(tmp_path: Path, settings: Settings, spares: SparePool) -> None:
    engine = _engine(tmp_path)
    session_id = _new_session(engine)
    first = CrashingBrain([PLAN, code(GOOD)])
    loop = AutoLoop(engine=engine, brain=first, ctx=CTX, evaluate=_evaluator(settings, spares), workdir=tmp_path / "k",
                    config=AutoConfig(max_iterations=1))
    with pytest.raises(KeyboardInterrupt):
        loop.run(session_id)
    with Session(engine) as s:
        assert [st.kind for st in sessions.get_steps(s, session_id=session_id)] == ["plan", "implement", "evaluate"]
    second = ScriptedBrain(["the kernel is at the HBM roofline"])
    resumed = AutoLoop(engine=engine, brain=second, ctx=CTX, evaluate=_evaluator(settings, spares),
                       workdir=tmp_path / "k", config=AutoConfig(max_iterations=1))
    outcome = resumed.run(session_id)
    assert [r.role for r in second.asked] == ["analyst"]  # nothing already done was asked again
    assert outcome.stop_reason == "iterations" and outcome.evaluations == 1 and outcome.improved
    with Session(engine) as s:
        assert len(s.exec(select(Step).where(Step.session_id == session_id)).all()) == 4


def test_a_redirected_plan_is_not_a_new_iteration() -> None:
    steps = [S("plan"), S("decision", action="redirect", text="x"), S("plan")]
    assert progress(steps).iterations == 1
    assert progress([*steps, S("decision", action="approve"), S("implement")]).iterations == 1


# --- a model that is no help: every run ends within its budgets, with a reason a person understands -----------

NO_SECTIONS = "Plan: tile rows by 256 and keep the max in VMEM.\n" + code(GOOD)


def _anthropic_loop(tmp_path: Path, base_url: str, config: AutoConfig, budget: Budget | None = None
                    ) -> tuple[AutoLoop, str]:
    engine = _engine(tmp_path)
    client = anthropic.Anthropic(api_key=API_KEY, base_url=base_url, max_retries=0)
    brain = AnthropicBrain(client=client, model="claude-opus-5-5", budget=budget or Budget(max_cost_usd=5.0),
                           sleep=lambda _: None)

    def never_evaluated(code: str, on_stage: object = None) -> object:
        raise AssertionError("nothing usable should reach the evaluator")

    loop = AutoLoop(engine=engine, brain=brain, ctx=CTX, evaluate=never_evaluated,  # type: ignore[arg-type]
                    workdir=tmp_path / "k", config=config)
    return loop, _new_session(engine)


def test_a_model_that_never_follows_the_plan_format_stops_after_three_answers(tmp_path: Path) -> None:
    with fake_anthropic([{"text": NO_SECTIONS, "repeat": True}]) as fake:
        loop, session_id = _anthropic_loop(tmp_path, fake.base_url, AutoConfig(max_iterations=50, plateau=50))
        outcome = loop.run(session_id)
    assert len(fake.requests) == 3  # each one paid for, each one an iteration
    assert outcome.stop_reason == ("unusable answers: the model's plans could not be used 3 times in a row (they "
                                   "did not follow the format, were cut off, or were refused)")
    assert loop.brain.budget.spent.requests == 3  # type: ignore[attr-defined]
    with Session(loop.engine) as s:
        assert [st.kind for st in sessions.get_steps(s, session_id=session_id)] == ["give_up"] * 3
        assert sessions.get_session(s, session_id=session_id).status == "done"


def test_unusable_plans_count_against_the_iteration_budget(tmp_path: Path) -> None:
    with fake_anthropic([{"text": NO_SECTIONS, "repeat": True}]) as fake:
        loop, session_id = _anthropic_loop(tmp_path, fake.base_url, AutoConfig(max_iterations=2, max_unusable=5))
        outcome = loop.run(session_id)
    assert outcome.stop_reason == "iterations" and len(fake.requests) == 2


def test_kernels_cut_off_at_max_tokens_stop_the_session(tmp_path: Path) -> None:
    half = {"text": "```python\nimport jax\ndef computation(x):\n", "stop_reason": "max_tokens"}
    script = [{"text": PLAN}, half, half, {"text": PLAN}, half, half, {"text": PLAN}, half, half]
    with fake_anthropic(script) as fake:
        loop, session_id = _anthropic_loop(tmp_path, fake.base_url, AutoConfig(max_iterations=9, plateau=9))
        outcome = loop.run(session_id)
    assert len(fake.requests) == 9  # each kernel: the answer and one continuation, both cut off
    assert outcome.stop_reason.startswith("unusable answers: the model's kernels could not be used 3 times")
    with Session(loop.engine) as s:
        steps = sessions.get_steps(s, session_id=session_id)
        assert [st.kind for st in steps] == ["plan", "give_up"] * 3
        assert "cut off at max_tokens" in steps[1].outputs["reason"]


def test_refusals_stop_the_session(tmp_path: Path) -> None:
    with fake_anthropic([{"text": "", "stop_reason": "refusal", "repeat": True}]) as fake:
        loop, session_id = _anthropic_loop(tmp_path, fake.base_url, AutoConfig(max_iterations=9, plateau=9))
        outcome = loop.run(session_id)
    assert len(fake.requests) == 3 and outcome.stop_reason.startswith("unusable answers: the model's plans")


def test_an_api_overloaded_for_good_ends_the_session_with_one_line(tmp_path: Path) -> None:
    with fake_anthropic([{"status": 529, "repeat": True}]) as fake:
        loop, session_id = _anthropic_loop(tmp_path, fake.base_url, AutoConfig(max_iterations=9))
        outcome = loop.run(session_id)
    assert len(fake.requests) == 5  # one request's attempts, then the session stops
    assert outcome.stop_reason.startswith("brain: the Anthropic API kept failing (529)")
    assert "--brain offline" in outcome.stop_reason and "\n" not in outcome.stop_reason


def test_every_request_counts_against_the_cost_cap(tmp_path: Path) -> None:
    with fake_anthropic([{"text": NO_SECTIONS, "repeat": True}]) as fake:
        loop, session_id = _anthropic_loop(tmp_path, fake.base_url, AutoConfig(max_iterations=50, max_unusable=50,
                                                                                plateau=50),
                                           budget=Budget(max_cost_usd=0.05))
        outcome = loop.run(session_id)
    assert outcome.stop_reason.startswith("budget: cost budget spent")
    spent = loop.brain.budget.spent  # type: ignore[attr-defined]
    assert spent.requests == len(fake.requests) and spent.cost_usd > 0.05
    assert len(fake.requests) < 50
