"""The Anthropic brain: the real SDK against a local fake of the Messages API."""

from __future__ import annotations

import anthropic
import pytest

from agents.anthropic_brain import AnthropicBrain, BrainError, choose_model, price_for
from agents.brain import AnswerError, BrainRequest, Budget, BudgetExceeded, ScriptedBrain
from agents.tools import describe_jax_object, jax_api_tool
from tests.fakes.anthropic_api import API_KEY, fake_anthropic

MODEL = "claude-opus-5-5"
CONTEXT = "Task: row softmax over f32[8192, 8192]. Target v6e: 918 TFLOP/s bf16, 1640 GB/s HBM. " * 20


def _brain(base_url: str, budget: Budget | None = None, **kwargs: object) -> tuple[AnthropicBrain, list[float]]:
    waits: list[float] = []
    client = anthropic.Anthropic(api_key=API_KEY, base_url=base_url, max_retries=0)
    brain = AnthropicBrain(client=client, model=MODEL, budget=budget or Budget(), sleep=waits.append,
                           **kwargs)  # type: ignore[arg-type]
    return brain, waits


def _request(**kwargs: object) -> BrainRequest:
    return BrainRequest(role="planner", context=CONTEXT, prompt="Plan a kernel.", **kwargs)  # type: ignore[arg-type]


def test_answers_and_caches_the_stable_context() -> None:
    with fake_anthropic([{"text": "plan A"}, {"text": "plan B"}]) as fake:
        brain, _ = _brain(fake.base_url)
        first = brain.ask(_request())
        second = brain.ask(_request())
    assert (first.text, second.text) == ("plan A", "plan B")
    system = fake.requests[0]["body"]["system"]
    assert system[-1]["text"] == CONTEXT and system[-1]["cache_control"] == {"type": "ephemeral"}
    assert first.usage.cache_write_tokens > 0 and first.usage.cache_read_tokens == 0
    assert second.usage.cache_read_tokens == first.usage.cache_write_tokens and second.usage.cache_write_tokens == 0
    assert second.usage.cost_usd < first.usage.cost_usd  # reads cost a tenth of writes
    assert brain.budget.spent.requests == 2


def test_tool_round_trip_with_the_jax_api_tool() -> None:
    script = [{"tool_use": {"name": "jax_api", "input": {"name": "jax.experimental.pallas.BlockSpec"}}},
              {"text": "use BlockSpec(block_shape, index_map)"}]
    with fake_anthropic(script) as fake:
        brain, _ = _brain(fake.base_url)
        reply = brain.ask(_request(tools=(jax_api_tool(),)))
    assert reply.text.startswith("use BlockSpec") and reply.tool_calls == ("jax_api",)
    tools = fake.requests[0]["body"]["tools"]
    assert tools[0]["name"] == "jax_api" and tools[-1]["cache_control"] == {"type": "ephemeral"}
    (result,) = fake.requests[1]["body"]["messages"][-1]["content"]
    assert result["type"] == "tool_result" and result["is_error"] is False and "BlockSpec" in result["content"]


def test_a_failing_tool_call_is_reported_to_the_model() -> None:
    script = [{"tool_use": {"name": "jax_api", "input": {"name": "os.system"}}}, {"text": "ok"}]
    with fake_anthropic(script) as fake:
        brain, _ = _brain(fake.base_url)
        brain.ask(_request(tools=(jax_api_tool(),)))
    (result,) = fake.requests[1]["body"]["messages"][-1]["content"]
    assert result["is_error"] is True and "not a dotted name under jax" in result["content"]


def test_rate_limit_and_overload_are_retried_with_the_waits_asked() -> None:
    with fake_anthropic([{"status": 429, "retry_after": 2}, {"status": 529}, {"text": "done"}]) as fake:
        brain, waits = _brain(fake.base_url)
        assert brain.ask(_request()).text == "done"
    assert len(fake.requests) == 3
    assert waits[0] == 2.0 and 1.0 <= waits[1] <= 1.25  # retry-after obeyed, then back-off (attempt 2: 1 s + jitter)


def test_a_retry_after_longer_than_the_session_allows_stops_cleanly() -> None:
    with fake_anthropic([{"status": 429, "retry_after": 3600}]) as fake:
        brain, waits = _brain(fake.base_url, max_retry_wait=30.0)
        with pytest.raises(BrainError, match="asks to wait 3600 s"):
            brain.ask(_request())
    assert waits == []


def test_a_refused_request_is_not_retried() -> None:
    with fake_anthropic([{"text": "never"}]) as fake:
        client = anthropic.Anthropic(api_key=API_KEY, base_url=fake.base_url, max_retries=0)
        brain = AnthropicBrain(client=client, model="claude-nonexistent", budget=Budget())
        with pytest.raises(BrainError, match="refused the request \\(400\\).*not found"):
            brain.ask(_request())
        assert len(fake.requests) == 1


def test_a_wrong_key_is_an_authentication_failure() -> None:
    with fake_anthropic([{"text": "never"}]) as fake:
        client = anthropic.Anthropic(api_key="sk-wrong", base_url=fake.base_url, max_retries=0)
        with pytest.raises(BrainError, match="401"):
            AnthropicBrain(client=client, model=MODEL, budget=Budget()).ask(_request())


def test_budget_stops_work_and_refuses_further_requests() -> None:
    with fake_anthropic([{"text": "a"}, {"text": "b"}]) as fake:
        brain, _ = _brain(fake.base_url, budget=Budget(max_tokens=50))
        with pytest.raises(BudgetExceeded, match="token budget spent"):
            brain.ask(_request())
        with pytest.raises(BudgetExceeded):
            brain.ask(_request())
        assert len(fake.requests) == 1  # the second ask never reached the API


def test_cost_budget() -> None:
    with fake_anthropic([{"text": "a"}]) as fake:
        brain, _ = _brain(fake.base_url, budget=Budget(max_cost_usd=1e-6))
        with pytest.raises(BudgetExceeded, match="cost budget spent"):
            brain.ask(_request())


def test_endless_tool_calls_are_cut_off() -> None:
    call = {"tool_use": {"name": "jax_api", "input": {"name": "jax.numpy.dot"}}}
    with fake_anthropic([call] * 3) as fake:
        brain, _ = _brain(fake.base_url, max_tool_rounds=2)
        with pytest.raises(AnswerError, match="still calling tools after 2 rounds"):
            brain.ask(_request(tools=(jax_api_tool(),)))


def test_model_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    with fake_anthropic() as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)  # the SDK's own variable
        client = anthropic.Anthropic(api_key=API_KEY, max_retries=0)
        assert choose_model(client, "claude-sonnet-5-5") == "claude-sonnet-5-5"
        assert choose_model(client, None) == "claude-opus-5-5"  # newest active opus; 6-0 is deprecated
        assert choose_model(client, None, line="sonnet") == "claude-sonnet-5-5"


def test_prices() -> None:
    assert price_for("claude-haiku-5-5") < price_for("claude-sonnet-5-5") < price_for("claude-opus-5-5")
    assert price_for("someone-elses-model") >= price_for("claude-opus-5-5")  # unknown: the dearest, never free
    assert price_for("claude-opus-4-1-20250805") == (15.0, 75.0) and price_for("claude-opus-4-5") == (5.0, 25.0)
    assert price_for("claude-opus-5-5", {"opus-5": (2.0, 10.0), "opus": (5.0, 25.0)}) == (2.0, 10.0)


def test_an_answer_cut_off_at_max_tokens_is_continued_once_then_refused() -> None:
    script = [{"text": "```python\ndef computation(x):\n", "stop_reason": "max_tokens"},
              {"text": "  return x\n```"}]
    with fake_anthropic(script) as fake:
        brain, _ = _brain(fake.base_url)
        reply = brain.ask(_request())
    assert reply.text == "```python\ndef computation(x):\n  return x\n```"
    assert len(fake.requests) == 2 and reply.usage.requests == 2
    follow_up = fake.requests[1]["body"]["messages"]
    assert [m["role"] for m in follow_up] == ["user", "assistant", "user"] and "cut off" in follow_up[-1]["content"]
    with fake_anthropic([{"text": "def computation(", "stop_reason": "max_tokens", "repeat": True}]) as fake:
        brain, _ = _brain(fake.base_url)
        with pytest.raises(AnswerError, match="cut off at max_tokens"):
            brain.ask(_request())
    assert len(fake.requests) == 2 and brain.budget.spent.requests == 2  # both were paid for


def test_a_refusal_is_an_unusable_answer_and_pause_turn_is_resumed() -> None:
    with fake_anthropic([{"text": "", "stop_reason": "refusal"}]) as fake:
        brain, _ = _brain(fake.base_url)
        with pytest.raises(AnswerError, match="declined"):
            brain.ask(_request())
    assert brain.budget.spent.requests == 1
    with fake_anthropic([{"text": "thinking...", "stop_reason": "pause_turn"}, {"text": " plan"}]) as fake:
        brain, _ = _brain(fake.base_url)
        assert brain.ask(_request()).text == " plan"
    assert len(fake.requests) == 2 and fake.requests[1]["body"]["messages"][-1]["role"] == "assistant"


def test_overload_that_lasts_ends_in_one_line_with_what_to_do() -> None:
    with fake_anthropic([{"status": 529, "repeat": True}]) as fake:
        brain, waits = _brain(fake.base_url, max_attempts=4)
        with pytest.raises(BrainError) as raised:
            brain.ask(_request())
    assert len(fake.requests) == 4 and len(waits) == 3
    line = raised.value.one_line()
    assert "kept failing (529)" in line and "--brain offline" in line and "\n" not in line


def test_a_large_request_is_counted_first_and_not_sent_when_it_cannot_be_paid() -> None:
    huge = "x" * 250_000
    with fake_anthropic([{"text": "never"}]) as fake:
        brain, _ = _brain(fake.base_url, budget=Budget(max_cost_usd=0.05))
        with pytest.raises(BudgetExceeded, match="would pass \\$0.05"):
            brain.ask(BrainRequest(role="planner", context=huge, prompt="Plan."))
    assert len(fake.counted) == 1 and fake.requests == []


def test_a_wrong_key_says_what_to_check() -> None:
    with fake_anthropic() as fake:
        client = anthropic.Anthropic(api_key="sk-wrong", base_url=fake.base_url, max_retries=0)
        with pytest.raises(BrainError) as raised:
            choose_model(client, None)
    assert "refused the key (401)" in raised.value.one_line() and "ANTHROPIC_API_KEY" in raised.value.one_line()


def test_scripted_brain_plays_its_script() -> None:
    brain = ScriptedBrain(["one", "two"])
    assert [brain.ask(_request()).text for _ in range(2)] == ["one", "two"]
    assert [r.role for r in brain.asked] == ["planner", "planner"]
    with pytest.raises(RuntimeError, match="no reply left"):
        brain.ask(_request())


def test_jax_api_lookup() -> None:
    text = describe_jax_object("jax.experimental.pallas.tpu.CompilerParams")
    assert "vmem_limit_bytes" in text and "dimension_semantics" in text
    assert "members:" in describe_jax_object("jax.experimental.pallas")
    for bad in ("os.system", "jax._src.config", "jax.numpy.not_a_function"):
        with pytest.raises(ValueError):
            describe_jax_object(bad)
