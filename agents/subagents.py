"""The shared sub-agent pool: planner, implementer, self-debugger and profiler-analyst.

Each is a small function over a Brain: it builds the request from typed inputs, asks, and parses the answer
into a typed value, refusing answers that lack what the role must produce (with a message that says what
was missing). The tester is the evaluator itself; the autotuner is the search over a
kernel's TUNABLE space (agents.search, strategy `tune`); neither is here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from agents.brain import AnswerError, AnswerForm, Brain, BrainReply, BrainRequest, Tool
from tpu_runner.reports import EvalError

PLAN_SECTIONS = ("analysis", "strategy", "tiling and memory", "pipelining", "expected impact", "risks")
_CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


T = TypeVar("T")


class AgentAnswerError(AnswerError):
    """A brain's answer lacks what its role must produce."""


@dataclass(frozen=True)
class TaskContext:
    """What every sub-agent is told about the task: stable across a session, so brains can cache it."""

    task_id: str
    reference_source: str
    signature: str  # e.g. "computation(x: f32[8192,8192])"
    target: str
    hardware: str  # peak FLOP/s, HBM bandwidth, VMEM of the target
    rules: str = ("A candidate is a Python module defining `computation` with the reference's signature, "
                  "implemented with jax.experimental.pallas.pallas_call. Block shapes: last two dims divisible by "
                  "(8, 128) or equal to the array dims. Accumulate bf16 in f32. No file, network, process, "
                  "timer, callback or global-state tricks; no broad except.")

    def render(self) -> str:
        return (f"# Task {self.task_id} on {self.target}\n{self.hardware}\n\n## Rules\n{self.rules}\n\n"
                f"## Signature\n{self.signature}\n\n## Reference (reference.py)\n```python\n"
                f"{self.reference_source}\n```\n")


@dataclass(frozen=True)
class Plan:
    sections: dict[str, str]  # every name in PLAN_SECTIONS

    def render(self) -> str:
        return "\n\n".join(f"## {name.capitalize()}\n{self.sections[name]}" for name in PLAN_SECTIONS)


def parse_plan(text: str) -> Plan:
    """`## Analysis` ... `## Risks` headings (any case), each with some text."""
    found: dict[str, str] = {}
    parts = re.split(r"^#{1,3}\s*(.+?)\s*$", text, flags=re.MULTILINE)
    for heading, body in zip(parts[1::2], parts[2::2], strict=True):
        name = heading.strip().lower().rstrip(":")
        if name in PLAN_SECTIONS and body.strip():
            found[name] = body.strip()
    missing = [s for s in PLAN_SECTIONS if s not in found]
    if missing:
        raise AgentAnswerError(f"the plan lacks the sections {missing}; each of {list(PLAN_SECTIONS)} must be a "
                               "'## Heading' followed by text")
    return Plan(found)


def code_blocks(text: str) -> list[str]:
    """Every fenced Python block of a text, in order."""
    return _CODE_BLOCK.findall(text)


def extract_code(text: str) -> str:
    """The last fenced Python block of an answer (the final version when a brain shows drafts first)."""
    blocks = code_blocks(text)
    if not blocks:
        raise AgentAnswerError("the answer has no ```python code block with the candidate module")
    return _entry_point_checked(blocks[-1].strip() + "\n")


def _entry_point_checked(code: str) -> str:
    if "def computation" not in code:
        raise AgentAnswerError("the code does not define `computation`")
    return code


# The answer forms: a brain that calls tools answers through these (validated, and re-asked once with what was
# wrong); a text-only brain (offline, scripted) answers in text, parsed the same way as before.
PLAN_FORM = AnswerForm(
    name="submit_plan", description="Give the plan, one field per section.",
    schema={"type": "object", "additionalProperties": False, "required": list(PLAN_SECTIONS),
            "properties": {s: {"type": "string", "minLength": 1} for s in PLAN_SECTIONS}})
KERNEL_FORM = AnswerForm(
    name="submit_kernel", description="Give the complete candidate module (Python source, no fences).",
    schema={"type": "object", "additionalProperties": False, "required": ["code"],
            "properties": {"code": {"type": "string", "minLength": 1}}})
ANALYSIS_FORM = AnswerForm(
    name="submit_analysis", description="Say where the time goes and the single most promising next change.",
    schema={"type": "object", "additionalProperties": False, "required": ["where_time_goes", "next_change"],
            "properties": {"where_time_goes": {"type": "string", "minLength": 1},
                           "next_change": {"type": "string", "minLength": 1}}})


def _plan_answer(reply: BrainReply) -> Plan:
    if reply.answer is None:
        return parse_plan(reply.text)
    sections = {name: str(reply.answer.get(name) or "").strip() for name in PLAN_SECTIONS}
    missing = [name for name, text in sections.items() if not text]
    if missing:
        raise AgentAnswerError(f"the plan's fields {missing} are empty; every one of {list(PLAN_SECTIONS)} needs text")
    return Plan(sections)


def _kernel_answer(reply: BrainReply) -> str:
    if reply.answer is None:
        return extract_code(reply.text)
    code = str(reply.answer.get("code") or "")
    blocks = code_blocks(code)  # fences inside the field are forgiven
    return _entry_point_checked((blocks[-1] if blocks else code).strip() + "\n")


def _analysis_answer(reply: BrainReply) -> str:
    if reply.answer is None:
        if not reply.text.strip():
            raise AgentAnswerError("the analysis is empty")
        return reply.text.strip()
    where, change = (str(reply.answer.get(k) or "").strip() for k in ("where_time_goes", "next_change"))
    if not where or not change:
        raise AgentAnswerError("the analysis needs both where the time goes and the next change")
    return f"{where} Next: {change}"


def _ask(brain: Brain, request: BrainRequest, read: Callable[[BrainReply], T]) -> T:
    """Ask, and read the answer; an answer that does not validate is asked again once, with what was wrong."""
    reply = brain.ask(request)
    try:
        return read(reply)
    except AgentAnswerError as exc:
        if request.answer is None or reply.answer is None:  # a text-only brain would answer the same again
            raise
        again = replace(request, prompt=f"{request.prompt}\n\nYour previous answer could not be used: {exc}. "
                                        f"Answer again with {request.answer.name}.")
        return read(brain.ask(again))


def plan(brain: Brain, ctx: TaskContext, *, previous: str | None = None, redirect: str | None = None,
         last_plan: str | None = None, number: int | None = None, tools: Sequence[Tool] = ()) -> Plan:
    """A plan in the fixed sections; revised from the previous candidate's evaluation and profile, or from a
    person's redirect. `number` and `last_plan` come from the session's record, so a brain started afresh for
    each runner job knows where the session stands."""
    prompt = ("Write a plan for a Pallas TPU kernel for this task, with exactly these sections as '## ' headings: "
              + ", ".join(s.capitalize() for s in PLAN_SECTIONS) + ". In Analysis give shapes, FLOPs, bytes and "
              "whether the task is compute- or memory-bound on the target.")
    if number is not None:
        prompt += f" This will be plan {number} of the session."
    if last_plan and (previous or redirect):
        prompt += f"\n\nThe last plan:\n{last_plan}"
    if previous:
        prompt += f"\n\nThe previous candidate and what the evaluator said:\n{previous}\nRevise the plan to do better."
    if redirect:
        prompt += f"\n\nA teammate redirected the work: {redirect}\nFollow it."
    return _ask(brain, BrainRequest(role="planner", context=ctx.render(), prompt=prompt, tools=tools,
                                    answer=PLAN_FORM), _plan_answer)


def implement(brain: Brain, ctx: TaskContext, approved: Plan, *, tools: Sequence[Tool] = ()) -> str:
    prompt = ("Implement this approved plan as a complete candidate module in one ```python block.\n\n"
              + approved.render())
    return _ask(brain, BrainRequest(role="implementer", context=ctx.render(), prompt=prompt, tools=tools,
                                    max_tokens=8192, answer=KERNEL_FORM), _kernel_answer)


@dataclass(frozen=True)
class Attempt:
    code: str
    error: EvalError


def self_debug(brain: Brain, ctx: TaskContext, code: str, error: EvalError, history: Sequence[Attempt] = (),
               *, tools: Sequence[Tool] = ()) -> str:
    """A fixed candidate, given the evaluator's structured error and the earlier failed attempts."""
    where = f" at line {error.line}" if error.line else ""
    earlier = "".join(f"\n- attempt {i + 1}: {a.error.stage}/{a.error.kind}: {a.error.detail[:300]}"
                      for i, a in enumerate(history))
    prompt = (f"The evaluator rejected this candidate in the {error.stage} stage ({error.kind}{where}):\n"
              f"{error.detail[:3000]}\n\n```python\n{code}```\n"
              + (f"\nEarlier attempts that failed:{earlier}\n" if earlier else "")
              + "\nFix it. Answer with the complete corrected module in one ```python block.")
    return _ask(brain, BrainRequest(role="debugger", context=ctx.render(), prompt=prompt, tools=tools,
                                    max_tokens=8192, answer=KERNEL_FORM), _kernel_answer)


def analyse_profile(brain: Brain, ctx: TaskContext, profile_summary: str) -> str:
    """Where the time goes and what to try next, from the evaluation's profile summary."""
    prompt = ("Here is the evaluator's profile of the current candidate. Say in a few sentences where the time "
              f"goes (compute vs HBM, grid, VMEM) and the single most promising next change.\n\n{profile_summary}")
    return _ask(brain, BrainRequest(role="analyst", context=ctx.render(), prompt=prompt, answer=ANALYSIS_FORM),
                _analysis_answer)


def apply_strategy(brain: Brain, ctx: TaskContext, code: str, *, title: str, advice: str, evaluation: str,
                   tools: Sequence[Tool] = ()) -> str:
    """A search expansion: the parent candidate rewritten along one optimisation strategy."""
    prompt = (f"Here is a candidate and what the evaluator said about it:\n{evaluation}\n\n```python\n{code}```\n\n"
              f"Apply this optimisation strategy to it - {title}: {advice}\n"
              "Change what the strategy needs and keep the rest. If the kernel declares a TUNABLE dict, keep it "
              "accurate. Answer with the complete module in one ```python block.")
    return _ask(brain, BrainRequest(role="implementer", context=ctx.render(), prompt=prompt, tools=tools,
                                    max_tokens=8192, answer=KERNEL_FORM), _kernel_answer)
