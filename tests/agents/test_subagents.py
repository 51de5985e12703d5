"""The sub-agent pool with a scripted brain, and the self-debugger fixing a candidate the real evaluator rejected."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.brain import ScriptedBrain
from agents.subagents import (
    PLAN_SECTIONS,
    AgentAnswerError,
    Attempt,
    TaskContext,
    analyse_profile,
    extract_code,
    implement,
    parse_plan,
    plan,
    self_debug,
)
from storage.settings import Settings
from tests.conftest import CORPUS, TASKS
from tpu_runner.candidate import SparePool
from tpu_runner.evaluation import EvalRequest
from tpu_runner.evaluation.evaluate import evaluate
from tpu_runner.reports import EvalError

PLAN_TEXT = "\n".join(f"## {s.title()}\n{s} text" for s in PLAN_SECTIONS)
CTX = TaskContext(task_id="softmax", reference_source=(TASKS / "softmax/reference.py").read_text(),
                  signature="computation(x: f32[8192,8192])", target="v6e", hardware="v6e: 918 TFLOP/s bf16")


def _fenced(code: str) -> str:
    return f"Here it is:\n```python\n{code}```\n"


def test_plan_has_every_section_and_carries_the_redirect() -> None:
    brain = ScriptedBrain([PLAN_TEXT])
    result = plan(brain, CTX, previous="x2.0, memory-bound", redirect="block 256x512")
    assert set(result.sections) == set(PLAN_SECTIONS)
    (request,) = brain.asked
    assert request.role == "planner" and "block 256x512" in request.prompt and "x2.0" in request.prompt
    assert "Task softmax on v6e" in request.context and "def computation" in request.context


def test_a_plan_missing_sections_is_refused_naming_them() -> None:
    with pytest.raises(AgentAnswerError, match="'pipelining'"):
        parse_plan(PLAN_TEXT.replace("## Pipelining", "## Something else"))


def test_code_extraction_takes_the_last_block_and_needs_computation() -> None:
    text = "draft:\n```python\ndef computation(x):\n    return 1\n```\nfinal:\n```python\ndef computation(x):\n" \
           "    return 2\n```"
    assert extract_code(text).endswith("return 2\n")
    with pytest.raises(AgentAnswerError, match="no ```python"):
        extract_code("no code here")
    with pytest.raises(AgentAnswerError, match="does not define `computation`"):
        extract_code("```python\nx = 1\n```")


def test_implement_sends_the_plan() -> None:
    brain = ScriptedBrain([_fenced("def computation(x):\n    return x\n")])
    code = implement(brain, CTX, parse_plan(PLAN_TEXT))
    assert code.startswith("def computation")
    assert "## Tiling and memory" in brain.asked[0].prompt and brain.asked[0].role == "implementer"


def test_analysis_must_say_something() -> None:
    assert analyse_profile(ScriptedBrain(["HBM-bound; raise block rows."]), CTX, "summary") == \
        "HBM-bound; raise block rows."
    with pytest.raises(AgentAnswerError):
        analyse_profile(ScriptedBrain(["  "]), CTX, "summary")


@pytest.mark.slow
def test_self_debugger_fixes_a_candidate_the_evaluator_rejected(tmp_path: Path, settings: Settings,
                                                                spares: SparePool) -> None:
    broken = (CORPUS / "bad/misaligned_block.py").read_text()
    first = tmp_path / "attempt1.py"
    first.write_text(broken)
    rejected = evaluate(EvalRequest(TASKS / "softmax", first, "v6e"), settings, spares=spares)
    assert rejected.verdict == "lowering_error" and rejected.error is not None

    fixed_source = (TASKS / "softmax/solutions/pallas.py").read_text()
    earlier = Attempt(code="def computation(x): ...", error=EvalError("syntax_error", "bad", 1, "static"))
    brain = ScriptedBrain([_fenced(fixed_source)])
    fixed = self_debug(brain, CTX, broken, rejected.error, history=[earlier])
    prompt = brain.asked[0].prompt
    assert "in the lower stage (block_shape" in prompt and broken.strip() in prompt
    assert "attempt 1: static/syntax_error" in prompt
    second = tmp_path / "attempt2.py"
    second.write_text(fixed)
    assert evaluate(EvalRequest(TASKS / "softmax", second, "v6e"), settings, spares=spares).verdict == "ok"
