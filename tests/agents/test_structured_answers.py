"""Plans, kernels and analyses asked for in a structure (tool use with JSON schemas), validated and re-asked
once with what was wrong; text answers from brains that write only text still parse."""

from __future__ import annotations

import anthropic
import pytest

from agents.anthropic_brain import AnthropicBrain
from agents.brain import Budget, ScriptedBrain
from agents.subagents import (
    KERNEL_FORM,
    PLAN_FORM,
    PLAN_SECTIONS,
    AgentAnswerError,
    TaskContext,
    analyse_profile,
    implement,
    parse_plan,
    plan,
)
from tests.fakes.anthropic_api import API_KEY, fake_anthropic

CTX = TaskContext(task_id="softmax", reference_source="def computation(x): ...", signature="computation(x)",
                  target="v6e", hardware="v6e")
SECTIONS = {s: f"{s}: details" for s in PLAN_SECTIONS}
GOOD = "import jax\n\ndef computation(x):\n    return x\n"


def _brain(base_url: str) -> AnthropicBrain:
    client = anthropic.Anthropic(api_key=API_KEY, base_url=base_url, max_retries=0)
    return AnthropicBrain(client=client, model="claude-opus-5-5", budget=Budget(max_cost_usd=5.0),
                          sleep=lambda _: None)


def test_a_plan_comes_through_its_tool_and_the_request_asks_for_it() -> None:
    with fake_anthropic([{"tool_use": {"name": "submit_plan", "input": SECTIONS}}]) as fake:
        made = plan(_brain(fake.base_url), CTX)
    assert made.sections == SECTIONS
    body = fake.requests[0]["body"]
    assert body["tool_choice"] == {"type": "any"}
    (tool,) = [t for t in body["tools"] if t["name"] == "submit_plan"]
    assert tool["input_schema"]["required"] == list(PLAN_SECTIONS) == PLAN_FORM.schema["required"]


def test_an_answer_that_does_not_validate_is_asked_again_once_with_the_error() -> None:
    partial = {**SECTIONS, "risks": ""}
    script = [{"tool_use": {"name": "submit_plan", "input": partial}},
              {"tool_use": {"name": "submit_plan", "input": SECTIONS}}]
    with fake_anthropic(script) as fake:
        made = plan(_brain(fake.base_url), CTX)
    assert made.sections["risks"] == "risks: details" and len(fake.requests) == 2
    assert "could not be used: the plan's fields ['risks'] are empty" in \
        fake.requests[1]["body"]["messages"][0]["content"]
    twice = [{"tool_use": {"name": "submit_plan", "input": partial}, "repeat": True}]
    with fake_anthropic(twice) as fake, pytest.raises(AgentAnswerError, match="are empty"):
        plan(_brain(fake.base_url), CTX)
    assert len(fake.requests) == 2  # one re-ask, not more


def test_a_kernel_comes_through_its_tool_fences_forgiven_and_a_free_text_answer_still_parses() -> None:
    script = [{"tool_use": {"name": "submit_kernel", "input": {"code": f"```python\n{GOOD}```"}}},
              {"text": f"Here it is:\n```python\n{GOOD}```"}]
    with fake_anthropic(script) as fake:
        brain = _brain(fake.base_url)
        approved = parse_plan("\n".join(f"## {k}\n{v}" for k, v in SECTIONS.items()))
        assert implement(brain, CTX, approved) == GOOD
        assert implement(brain, CTX, approved) == GOOD  # a model that answered in text anyway
    assert fake.requests[0]["body"]["tools"][-1]["name"] == KERNEL_FORM.name


def test_an_analysis_needs_both_parts_and_text_brains_keep_working() -> None:
    answer = {"where_time_goes": "HBM-bound at the roofline.", "next_change": "fuse the two passes"}
    with fake_anthropic([{"tool_use": {"name": "submit_analysis", "input": answer}}]) as fake:
        assert analyse_profile(_brain(fake.base_url), CTX, "profile") == \
            "HBM-bound at the roofline. Next: fuse the two passes"
    assert analyse_profile(ScriptedBrain(["all HBM"]), CTX, "profile") == "all HBM"
    with pytest.raises(AgentAnswerError, match="empty"):
        analyse_profile(ScriptedBrain(["  "]), CTX, "profile")


def test_a_structured_answer_cut_off_is_asked_again_with_more_room() -> None:
    script = [{"tool_use": {"name": "submit_kernel", "input": {"code": "def comp"}}, "stop_reason": "max_tokens"},
              {"tool_use": {"name": "submit_kernel", "input": {"code": GOOD}}}]
    with fake_anthropic(script) as fake:
        approved = parse_plan("\n".join(f"## {k}\n{v}" for k, v in SECTIONS.items()))
        assert implement(_brain(fake.base_url), CTX, approved) == GOOD
    assert [r["body"]["max_tokens"] for r in fake.requests] == [8192, 16384]
