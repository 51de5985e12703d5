"""The brain interface the sub-agents use; everything else is independent of which brain answers.

A brain takes a request (a stable context that can be cached, the question, the tools it may call) and
returns text. Usage is counted against a per-session budget; a spent budget ends work cleanly with
`BudgetExceeded`, whose message says what was spent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from storage.errors import KernelbotError


@dataclass(frozen=True)
class Tool:
    """A function a brain may call while answering: a name, what it does, its JSON schema, and the code."""

    name: str
    description: str
    input_schema: dict[str, Any]
    run: Callable[[dict[str, Any]], str]


@dataclass(frozen=True)
class AnswerForm:
    """The structure an answer must have: a brain that calls tools gives it as the input of this tool (a JSON
    schema it validates against); one that only writes text gives the text, parsed by the role."""

    name: str  # e.g. submit_plan
    description: str
    schema: dict[str, Any]


@dataclass(frozen=True)
class BrainRequest:
    role: str  # planner | implementer | debugger | analyst (agents.subagents) | porter (agents.porter)
    context: str  # long and stable across a session (task, reference, hardware facts, Pallas rules): cached
    prompt: str  # this turn's question
    tools: Sequence[Tool] = ()
    max_tokens: int = 4096
    answer: AnswerForm | None = None  # ask for the answer in this form


@dataclass
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    requests: int = 0

    def add(self, other: Usage) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cache_read_tokens += other.cache_read_tokens
        self.cache_write_tokens += other.cache_write_tokens
        self.cost_usd += other.cost_usd
        self.requests += other.requests


@dataclass(frozen=True)
class BrainReply:
    text: str
    usage: Usage
    tool_calls: tuple[str, ...] = ()  # names of the tools called while answering, in order
    answer: dict[str, Any] | None = None  # the answer in the form asked for, when the brain gave it so


class BudgetExceeded(Exception):
    """The session's token or cost budget is spent; work stops here with what was found so far."""


class BrainError(KernelbotError, RuntimeError):
    """The brain cannot answer at all (no model, a bad key, no quota, no network): one line for a person, with
    what to do next (each raise names its own)."""

    next_step = "see `kernelbot doctor`"

    def __init__(self, message: str, next_step: str = ""):
        super().__init__(message, next_step=next_step)

    def one_line(self) -> str:
        return f"{self}; {self.next_step}" if self.next_step else str(self)


class AnswerError(ValueError):
    """An answer that cannot be used: cut off at max_tokens, refused, or lacking what its role must produce.
    It costs an iteration like any other answer."""


@dataclass
class Budget:
    """Limits for one session; `charge` raises BudgetExceeded once a limit is passed."""

    max_tokens: int | None = None
    max_cost_usd: float | None = None
    max_requests: int | None = None
    spent: Usage = field(default_factory=Usage)

    def charge(self, usage: Usage) -> None:
        self.spent.add(usage)
        tokens = self.spent.input_tokens + self.spent.output_tokens + self.spent.cache_write_tokens
        if self.max_tokens is not None and tokens > self.max_tokens:
            raise BudgetExceeded(f"token budget spent: {tokens:,} of {self.max_tokens:,} tokens")
        if self.max_cost_usd is not None and self.spent.cost_usd > self.max_cost_usd:
            raise BudgetExceeded(f"cost budget spent: ${self.spent.cost_usd:.4f} of ${self.max_cost_usd:.2f}")

    def check(self) -> None:
        """Refuse to start another request once the budget is already spent."""
        self.charge(Usage())
        if self.max_requests is not None and self.spent.requests >= self.max_requests:
            raise BudgetExceeded(f"request budget spent: {self.spent.requests} of {self.max_requests} requests")


class Brain(Protocol):
    name: str

    def ask(self, request: BrainRequest) -> BrainReply: ...


@dataclass
class ScriptedBrain:
    """Answers from a script, in order: for tests and demos of the loops without any model."""

    replies: list[str]
    name: str = "scripted"
    asked: list[BrainRequest] = field(default_factory=list)

    def ask(self, request: BrainRequest) -> BrainReply:
        self.asked.append(request)
        if not self.replies:
            raise RuntimeError(f"the scripted brain has no reply left for a {request.role} request")
        return BrainReply(text=self.replies.pop(0), usage=Usage(requests=1))
