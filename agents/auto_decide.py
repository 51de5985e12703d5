"""What the Auto loop does next, decided from the steps it has recorded: a pure function, so a session that
crashed between steps resumes exactly where it was."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tpu_runner.timing import clear_improvement

# What the Auto loop does, each recorded as a step of that kind; a person's decision is a step of kind "decision".
ACTIONS = ("plan", "implement", "evaluate", "debug", "analyse", "give_up")


@dataclass(frozen=True)
class AutoConfig:
    max_iterations: int = 5  # plan -> implement -> evaluate (-> debug)* -> analyse, this many times at most
    plateau: int = 2  # stop after this many iterations in a row without a better kernel
    target_speedup: float | None = None  # stop once the best kernel is at least this much faster
    max_debug_attempts: int = 3  # self-debug rounds per iteration before giving up on it
    max_unusable: int = 3  # answers in a row that could not be used (wrong format, cut off, refused) stop it

    def __post_init__(self) -> None:
        if self.max_iterations < 1 or self.plateau < 1 or self.max_debug_attempts < 0 or self.max_unusable < 1:
            raise ValueError(f"{self} has a limit below its minimum (iterations and plateau >= 1, debug >= 0)")


@dataclass(frozen=True)
class StepRecord:
    """A finished step as the decision needs it: its kind and outputs."""

    kind: str  # one of ACTIONS, or decision
    outputs: dict[str, Any]


@dataclass(frozen=True)
class Progress:
    iterations: int  # iterations started (plans made)
    best_speedup: float | None  # of ok candidates faster than the reference
    best_candidate_id: int | None
    since_improvement: int  # finished iterations since the best improved
    debug_attempts: int  # in the current iteration


def progress(steps: Sequence[StepRecord]) -> Progress:
    iterations = since = debug = 0
    best: float | None = None
    best_id: int | None = None
    improved_this_iteration = False
    void = False  # the current iteration never got a plan: it counts against the budget, not the plateau
    redirected = False
    for step in steps:
        if step.kind == "decision":
            redirected = step.outputs.get("action") == "redirect"
            continue
        if step.kind == "plan" and redirected:  # a re-plan on a person's redirect: the same iteration
            redirected = False
            continue
        redirected = False
        if step.kind == "plan" or (step.kind == "give_up" and step.outputs.get("unusable") == "plan"):
            # A plan the brain could not give still used an iteration (and was paid for).
            if iterations and not void:
                since = 0 if improved_this_iteration else since + 1
            iterations += 1
            debug = 0
            improved_this_iteration = False
            void = step.kind == "give_up"
        elif step.kind == "debug":
            debug += 1
        elif step.kind == "evaluate" and step.outputs.get("verdict") == "ok":
            speedup, band, method = (step.outputs.get(k) for k in ("speedup", "band", "method"))
            # Never an improvement unless it beats the reference and the best so far (measured: beyond its spread).
            if speedup is not None and clear_improvement(speedup, band, method, max(1.0, best or 0.0)):
                best, best_id, improved_this_iteration = speedup, step.outputs.get("candidate_id"), True
    if iterations and _iteration_over(steps) and not void:
        since = 0 if improved_this_iteration else since + 1
    return Progress(iterations, best, best_id, since, debug)


def _iteration_over(steps: Sequence[StepRecord]) -> bool:
    work = work_steps(steps)
    return bool(work) and work[-1].kind in ("analyse", "give_up")


def work_steps(steps: Sequence[StepRecord]) -> list[StepRecord]:
    """The steps the agents did, without people's decisions."""
    return [s for s in steps if s.kind != "decision"]


def unusable_in_a_row(steps: Sequence[StepRecord]) -> list[str]:
    """The roles whose unusable answers ended each of the session's last iterations, for the run of iterations
    that ended so (a good plan followed by a kernel cut off at max_tokens ends its iteration unusable too)."""
    iterations: list[list[StepRecord]] = []
    for step in work_steps(steps):
        if step.kind == "plan" or (step.kind == "give_up" and step.outputs.get("unusable") == "plan") \
                or not iterations:
            iterations.append([])
        iterations[-1].append(step)
    roles: list[str] = []
    for iteration in reversed(iterations):
        last = iteration[-1]
        if last.kind != "give_up" or not last.outputs.get("unusable"):
            break
        roles.append(last.outputs["unusable"])
    return roles[::-1]


ROLE_ANSWERS = {"plan": "plans", "implement": "kernels", "debug": "fixes", "analyse": "analyses"}


def unusable_reason(roles: Sequence[str]) -> str:
    """'the model's plans did not follow the format 3 times in a row' (or its kernels, fixes, ...)."""
    named = sorted({ROLE_ANSWERS.get(r, r) for r in roles})
    return (f"unusable answers: the model's {' and '.join(named)} could not be used {len(roles)} times in a row "
            "(they did not follow the format, were cut off, or were refused)")


def next_action(steps: Sequence[StepRecord], config: AutoConfig) -> str:
    """One of ACTIONS, or stop:<reason>."""
    p = progress(steps)
    work = work_steps(steps)  # a person's decisions (a hand-off, say) do not change what Auto does next
    last = work[-1] if work else None
    unusable = unusable_in_a_row(steps)
    if len(unusable) >= config.max_unusable:
        return "stop:" + unusable_reason(unusable)
    if last is None or last.kind in ("analyse", "give_up"):
        if p.best_speedup is not None and config.target_speedup and p.best_speedup >= config.target_speedup:
            return "stop:target"
        if p.iterations >= config.max_iterations:
            return "stop:iterations"
        if p.iterations and p.since_improvement >= config.plateau:
            return "stop:plateau"
        return "plan"
    if last.kind == "plan":
        return "implement"
    if last.kind in ("implement", "debug"):
        return "evaluate"
    if last.kind == "evaluate":
        verdict = last.outputs.get("verdict")
        # An unverified kernel that failed somewhere (at shapes derived from the production ones, which it may not be
        # written for) is still worth a debugging round: the failure may be a real bug.
        if verdict == "ok" or (verdict == "unverified" and not last.outputs.get("error")):
            return "analyse"
        return "debug" if p.debug_attempts < config.max_debug_attempts else "give_up"
    raise ValueError(f"unknown step kind {last.kind!r}")
