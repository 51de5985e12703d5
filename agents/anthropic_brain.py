"""A brain on the official anthropic SDK: tool use, prompt caching of the stable context, retries on overload
and rate limits with waits this session can afford, and usage charged to the session's budget.

Every request is charged, whatever became of its answer; a large request is counted (`count_tokens`) first and
not sent when it could not be paid for. An answer cut off at max_tokens is continued once, a refusal is an
unusable answer (`AnswerError`, which costs the session an iteration), and `pause_turn` is resumed. Failures
that no retry mends (a bad key, no model, no quota, no network) are one-line `BrainError`s naming the next step.

The base URL comes from the SDK's own ANTHROPIC_BASE_URL (tests point it at a local fake of the Messages API).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anthropic

from agents.brain import (
    AnswerError,
    AnswerForm,
    BrainError,
    BrainReply,
    BrainRequest,
    Budget,
    BudgetExceeded,
    Tool,
    Usage,
)

log = logging.getLogger("kernelbot.brain")

# USD per million tokens (input, output), by the longest model-id fragment that matches; cache reads cost 0.1x
# input, cache writes 1.25x. The SDK carries no prices: these are the published list prices (Opus from 4.5 on
# at $5/$25, the Opus 4 and 4.1 and 3 lines at $15/$75), and KERNELBOT_PRICES overrides or adds entries.
PRICES_PER_MTOK: dict[str, tuple[float, float]] = {
    "opus": (5.0, 25.0), "claude-opus-4-0": (15.0, 75.0), "claude-opus-4-1": (15.0, 75.0),
    "claude-opus-4-2": (15.0, 75.0), "claude-3-opus": (15.0, 75.0),
    "sonnet": (3.0, 15.0), "haiku": (1.0, 5.0), "claude-3-5-haiku": (0.8, 4.0), "claude-3-haiku": (0.25, 1.25),
}
RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
COUNT_FIRST_CHARS = 200_000  # requests larger than this are counted before they are sent
MAX_CONTINUATIONS = 1  # an answer cut off at max_tokens is continued this many times, then refused
MAX_TOKENS_CAP = 32_000  # a structured answer cut off is asked again with twice the room, up to this
CONTINUE = ("Your answer was cut off by the length limit. Continue exactly where it stopped, without repeating "
            "anything, and finish it.")

SYSTEM_PREAMBLE = (
    "You are one of kernelbot's sub-agents, writing and tuning TPU kernels in JAX Pallas. Answer in the form "
    "your role asks for. When unsure of an API in the installed JAX, call the jax_api tool instead of guessing."
)


DEAREST = (15.0, 75.0)  # an unknown model is counted at the dearest price rather than for free


def price_for(model: str, prices: dict[str, tuple[float, float]] | None = None) -> tuple[float, float]:
    table = prices or PRICES_PER_MTOK
    matches = [fragment for fragment in table if fragment in model]
    return table[max(matches, key=len)] if matches else DEAREST


def usage_of(response: Any, model: str, prices: dict[str, tuple[float, float]] | None = None) -> Usage:
    u = response.usage
    read = int(getattr(u, "cache_read_input_tokens", 0) or 0)
    write = int(getattr(u, "cache_creation_input_tokens", 0) or 0)
    price_in, price_out = price_for(model, prices)
    cost = (u.input_tokens * price_in + read * price_in * 0.1 + write * price_in * 1.25
            + u.output_tokens * price_out) / 1e6
    return Usage(input_tokens=u.input_tokens, output_tokens=u.output_tokens, cache_read_tokens=read,
                 cache_write_tokens=write, cost_usd=cost, requests=1)


def choose_model(client: anthropic.Anthropic, configured: str | None, line: str = "opus") -> str:
    """The configured model, else the newest active model of `line` the API lists."""
    if configured:
        return configured
    try:
        listed = list(client.models.list(limit=100))
    except (anthropic.APIConnectionError, anthropic.APIStatusError) as exc:
        raise api_failure(exc, "listing the models") from exc
    models = [m for m in listed if getattr(m, "lifecycle", "active") == "active"]
    of_line = [m for m in models if getattr(m, "line", None) == line or line in m.id] or models
    if not of_line:
        raise BrainError("the API lists no active model", "set KERNELBOT_MODEL to a model your key can use")
    return max(of_line, key=lambda m: m.created_at).id


def api_failure(exc: Exception, doing: str) -> BrainError:
    """A one-line error for a failure no retry mends, with what to do about it."""
    status = getattr(exc, "status_code", None)
    message = getattr(exc, "message", str(exc))
    if isinstance(exc, anthropic.APIConnectionError):
        return BrainError(f"cannot reach the Anthropic API while {doing} ({type(exc).__name__})",
                          "check the network, or ANTHROPIC_BASE_URL if you use a proxy")
    if status == 401:
        return BrainError(f"the Anthropic API refused the key (401) while {doing}",
                          "check ANTHROPIC_API_KEY (kernelbot doctor tests it)")
    if status == 403:
        return BrainError(f"the key may not do this (403) while {doing}: {message}",
                          "check the key's workspace and permissions")
    if status == 404:
        return BrainError(f"the API knows no such model or route (404) while {doing}: {message}",
                          "set KERNELBOT_MODEL to a model your key lists (kernelbot doctor shows them)")
    if "credit" in str(message).lower() or "quota" in str(message).lower():
        return BrainError(f"no quota left ({status}) while {doing}: {message}",
                          "add credit or raise the key's limits, or use --brain offline")
    if status == 429:
        return BrainError(f"still rate limited (429) after the retries while {doing}",
                          "wait a few minutes, run fewer sessions at once, or use --brain offline")
    if status in RETRYABLE_STATUS:
        return BrainError(f"the Anthropic API kept failing ({status}) while {doing}: {message}",
                          "try again later, or use --brain offline")
    return BrainError(f"the API refused the request ({status}) while {doing}: {message}",
                      "this is a bug in the request kernelbot sent; report it with the log")


@dataclass
class AnthropicBrain:
    client: anthropic.Anthropic  # build it with max_retries=0: retries are paced here
    model: str
    budget: Budget
    max_tool_rounds: int = 8
    max_attempts: int = 5
    max_retry_wait: float = 30.0  # the SDK would obey any retry-after; a session caps what it waits
    prices: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(PRICES_PER_MTOK))
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    name: str = "anthropic"

    def ask(self, request: BrainRequest) -> BrainReply:
        self.budget.check()
        system = [{"type": "text", "text": f"{SYSTEM_PREAMBLE}\nRole: {request.role}."},
                  {"type": "text", "text": request.context, "cache_control": {"type": "ephemeral"}}]
        form = request.answer
        tools = _tool_params(request.tools, form)
        by_name = {t.name: t for t in request.tools}
        messages: list[dict[str, Any]] = [{"role": "user", "content": request.prompt}]
        max_tokens = request.max_tokens
        if len(request.context) + len(request.prompt) > COUNT_FIRST_CHARS:
            self._afford(system=system, messages=messages, tools=tools, max_tokens=request.max_tokens)
        total, calls, text, continued = Usage(), [], "", 0
        for _ in range(self.max_tool_rounds + 1):
            response = self._create(system=system, messages=messages, tools=tools, max_tokens=max_tokens,
                                    **({"tool_choice": {"type": "any"}} if form else {}))
            usage = usage_of(response, self.model, self.prices)
            total.add(usage)
            self.budget.charge(usage)  # charged before anything is made of the answer
            said = "".join(block.text for block in response.content if block.type == "text")
            if response.stop_reason == "refusal":
                raise AnswerError(f"the model declined to answer the {request.role}'s request (refusal)")
            answered = next((b for b in response.content if b.type == "tool_use" and form and b.name == form.name),
                            None)
            if answered is not None and response.stop_reason != "max_tokens":
                return BrainReply(text=text + said, usage=total, tool_calls=tuple(calls), answer=dict(answered.input))
            if response.stop_reason == "max_tokens" and form is not None:
                # A structured answer cannot be continued: ask again with room for it, once.
                if continued >= MAX_CONTINUATIONS:
                    raise AnswerError(f"the {request.role}'s answer was cut off at max_tokens ({max_tokens}) "
                                      f"{continued + 1} times")
                continued += 1
                max_tokens = min(2 * max_tokens, MAX_TOKENS_CAP)
                continue
            if response.stop_reason == "max_tokens":
                if continued >= MAX_CONTINUATIONS:
                    raise AnswerError(f"the {request.role}'s answer was cut off at max_tokens "
                                      f"({request.max_tokens}) {continued + 1} times")
                continued += 1
                text += said
                # Ask for the rest (not a prefill: newer models refuse those), and join the two parts.
                messages = [*messages, {"role": "assistant", "content": response.content},
                            {"role": "user", "content": CONTINUE}]
                continue
            if response.stop_reason == "pause_turn":  # a long turn paused by the API: hand it back to go on
                messages = [*messages, {"role": "assistant", "content": response.content}]
                continue
            if response.stop_reason != "tool_use":
                return BrainReply(text=text + said, usage=total, tool_calls=tuple(calls))
            messages.append({"role": "assistant", "content": response.content})
            results = []
            for block in response.content:
                if block.type != "tool_use":
                    continue
                calls.append(block.name)
                results.append(_run_tool(by_name.get(block.name), block))
            messages.append({"role": "user", "content": results})
        raise AnswerError(f"the model was still calling tools after {self.max_tool_rounds} rounds")

    def _afford(self, **request: Any) -> None:
        """Count a large request first and refuse to send what the budget could not pay for."""
        if self.budget.max_cost_usd is None:
            return
        tools = request.pop("tools")
        max_tokens = request.pop("max_tokens")
        try:
            counted = self.client.messages.count_tokens(model=self.model, **request,
                                                        **({"tools": tools} if tools else {}))
        except (anthropic.APIConnectionError, anthropic.APIStatusError) as exc:
            log.warning("count_tokens failed (%s); sending the request uncounted", exc)
            return
        price_in, price_out = price_for(self.model, self.prices)
        worst = (counted.input_tokens * price_in + max_tokens * price_out) / 1e6
        if self.budget.spent.cost_usd + worst > self.budget.max_cost_usd:
            raise BudgetExceeded(f"cost budget: the next request ({counted.input_tokens:,} input tokens, up to "
                                 f"${worst:.2f}) would pass ${self.budget.max_cost_usd:.2f} "
                                 f"(${self.budget.spent.cost_usd:.2f} spent)")

    def _create(self, **kwargs: Any) -> Any:
        extra = {"tools": kwargs.pop("tools")} if kwargs.get("tools") else {}
        kwargs.pop("tools", None)
        for attempt in range(1, self.max_attempts + 1):
            try:
                return self.client.messages.create(model=self.model, **kwargs, **extra)
            except (anthropic.APIConnectionError, anthropic.APIStatusError) as exc:
                status = getattr(exc, "status_code", None)
                if isinstance(exc, anthropic.APIStatusError) and status not in RETRYABLE_STATUS:
                    raise api_failure(exc, "asking the model") from exc
                if attempt == self.max_attempts:
                    raise api_failure(exc, f"asking the model ({attempt} attempts)") from exc
                wait = self._wait_for(exc, attempt)
                log.warning("anthropic %s; retrying in %.1f s (attempt %d of %d)", status or "connection error",
                            wait, attempt + 1, self.max_attempts)
                self.sleep(wait)
        raise AssertionError("unreachable")

    def _wait_for(self, exc: Exception, attempt: int) -> float:
        response = getattr(exc, "response", None)
        headers = response.headers if response is not None else {}
        if headers.get("retry-after-ms"):
            asked = float(headers["retry-after-ms"]) / 1000
        elif headers.get("retry-after"):
            asked = float(headers["retry-after"])
        else:
            asked = min(8.0, 0.5 * 2 ** (attempt - 1)) * (1 + random.random() * 0.25)
        if asked > self.max_retry_wait:
            raise BrainError(f"the API asks to wait {asked:.0f} s, more than this session allows "
                             f"({self.max_retry_wait:.0f} s)", "try again later") from exc
        return asked


def _tool_params(tools: Sequence[Tool], form: AnswerForm | None = None) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = [{"name": t.name, "description": t.description, "input_schema": t.input_schema}
                                    for t in tools]
    if form is not None:
        params.append({"name": form.name, "description": form.description, "input_schema": form.schema})
    if params:
        params[-1]["cache_control"] = {"type": "ephemeral"}  # tools are part of the cached prefix
    return params


def _run_tool(tool: Tool | None, block: Any) -> dict[str, Any]:
    if tool is None:
        return {"type": "tool_result", "tool_use_id": block.id, "is_error": True,
                "content": f"no tool named {block.name!r}"}
    try:
        content, is_error = tool.run(dict(block.input or {})), False
    except Exception as exc:  # the model sees the failure and can correct its call
        content, is_error = f"{type(exc).__name__}: {exc}", True
    return {"type": "tool_result", "tool_use_id": block.id, "content": content, "is_error": is_error}
