"""A brain on the official anthropic SDK: tool use, prompt caching of the stable context, retries on overload
and rate limits with waits this session can afford, and usage charged to the session's budget.

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

from agents.brain import BrainReply, BrainRequest, Budget, Tool, Usage

log = logging.getLogger("kernelbot.brain")

# USD per million tokens (input, output) by model line; cache reads cost 0.1x input, cache writes 1.25x.
# The SDK carries no prices; these are the published list prices of each line.
PRICES_PER_MTOK: dict[str, tuple[float, float]] = {"opus": (15.0, 75.0), "sonnet": (3.0, 15.0), "haiku": (1.0, 5.0)}
RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})

SYSTEM_PREAMBLE = (
    "You are one of kernelbot's sub-agents, writing and tuning TPU kernels in JAX Pallas. Answer in the form "
    "your role asks for. When unsure of an API in the installed JAX, call the jax_api tool instead of guessing."
)


class BrainError(RuntimeError):
    """The model could not give an answer (retries exhausted, refused request, endless tool calls)."""


def price_for(model: str) -> tuple[float, float]:
    for line, price in PRICES_PER_MTOK.items():
        if line in model:
            return price
    return PRICES_PER_MTOK["opus"]  # unknown line: count it at the dearest price rather than for free


def usage_of(response: Any, model: str) -> Usage:
    u = response.usage
    read = int(getattr(u, "cache_read_input_tokens", 0) or 0)
    write = int(getattr(u, "cache_creation_input_tokens", 0) or 0)
    price_in, price_out = price_for(model)
    cost = (u.input_tokens * price_in + read * price_in * 0.1 + write * price_in * 1.25
            + u.output_tokens * price_out) / 1e6
    return Usage(input_tokens=u.input_tokens, output_tokens=u.output_tokens, cache_read_tokens=read,
                 cache_write_tokens=write, cost_usd=cost, requests=1)


def choose_model(client: anthropic.Anthropic, configured: str | None, line: str = "opus") -> str:
    """The configured model, else the newest active model of `line` the API lists."""
    if configured:
        return configured
    models = [m for m in client.models.list(limit=100) if getattr(m, "lifecycle", "active") == "active"]
    of_line = [m for m in models if getattr(m, "line", None) == line or line in m.id] or models
    if not of_line:
        raise BrainError("the API lists no active model; set KERNELBOT_MODEL")
    return max(of_line, key=lambda m: m.created_at).id


@dataclass
class AnthropicBrain:
    client: anthropic.Anthropic  # build it with max_retries=0: retries are paced here
    model: str
    budget: Budget
    max_tool_rounds: int = 8
    max_attempts: int = 5
    max_retry_wait: float = 30.0  # the SDK would obey any retry-after; a session caps what it waits
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    name: str = "anthropic"

    def ask(self, request: BrainRequest) -> BrainReply:
        self.budget.check()
        system = [{"type": "text", "text": f"{SYSTEM_PREAMBLE}\nRole: {request.role}."},
                  {"type": "text", "text": request.context, "cache_control": {"type": "ephemeral"}}]
        tools = _tool_params(request.tools)
        by_name = {t.name: t for t in request.tools}
        messages: list[dict[str, Any]] = [{"role": "user", "content": request.prompt}]
        total, calls = Usage(), []
        for _ in range(self.max_tool_rounds + 1):
            response = self._create(system=system, messages=messages, tools=tools, max_tokens=request.max_tokens)
            usage = usage_of(response, self.model)
            total.add(usage)
            self.budget.charge(usage)
            if response.stop_reason != "tool_use":
                text = "".join(block.text for block in response.content if block.type == "text")
                return BrainReply(text=text, usage=total, tool_calls=tuple(calls))
            messages.append({"role": "assistant", "content": response.content})
            results = []
            for block in response.content:
                if block.type != "tool_use":
                    continue
                calls.append(block.name)
                results.append(_run_tool(by_name.get(block.name), block))
            messages.append({"role": "user", "content": results})
        raise BrainError(f"the model was still calling tools after {self.max_tool_rounds} rounds")

    def _create(self, **kwargs: Any) -> Any:
        extra = {"tools": kwargs.pop("tools")} if kwargs.get("tools") else {}
        kwargs.pop("tools", None)
        for attempt in range(1, self.max_attempts + 1):
            try:
                return self.client.messages.create(model=self.model, **kwargs, **extra)
            except (anthropic.APIConnectionError, anthropic.APIStatusError) as exc:
                status = getattr(exc, "status_code", None)
                if isinstance(exc, anthropic.APIStatusError) and status not in RETRYABLE_STATUS:
                    raise BrainError(f"the API refused the request ({status}): {exc.message}") from exc
                if attempt == self.max_attempts:
                    raise BrainError(f"gave up after {attempt} attempts: {exc}") from exc
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
                             f"({self.max_retry_wait:.0f} s)") from exc
        return asked


def _tool_params(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = [{"name": t.name, "description": t.description, "input_schema": t.input_schema}
                                    for t in tools]
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
