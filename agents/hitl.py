"""Human-in-the-loop: the Auto steps with a person at two gates - approving (or redirecting) each plan, and
deciding after each result (iterate, redirect with text, hand off to Auto, finish). Agents never wait: the
machine advances until it needs a person and stops there; a recorded decision lets it go on. A session can be
handed to Auto at any step and back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlmodel import Session

from agents.auto import AutoLoop
from agents.auto_decide import StepRecord, work_steps
from storage import sessions
from storage.errors import KernelbotError
from storage.models import Decision, now

ALLOWED = {
    "await_approval": ("approve", "redirect", "handoff", "cancel"),
    "await_decision": ("iterate", "redirect", "handoff", "finish", "cancel"),
}


HANDOVERS = ("handoff", "handback")


class DecisionRejected(KernelbotError, ValueError):
    """A decision that does not fit what the session is waiting for; the message lists what does."""
    next_step = ("answer the session's latest question with a decision it allows now (the message lists them); a "
                 "finished or cancelled session takes none")


def waiting_for(steps: Sequence[StepRecord]) -> str | None:
    """What a person must answer next (`await_approval` / `await_decision`), or None when agents have work."""
    steps = list(steps)
    while steps and steps[-1].kind == "decision" and steps[-1].outputs.get("action") in HANDOVERS:
        steps.pop()  # a change of hands leaves the work where it was
    if steps and steps[-1].kind == "decision":
        return None
    work = work_steps(steps)
    if not work:
        return None
    if work[-1].kind == "plan":
        return "await_approval"
    if work[-1].kind in ("analyse", "give_up"):
        return "await_decision"
    return None


def hitl_next_action(steps: Sequence[StepRecord], max_debug_attempts: int) -> str:
    awaited = waiting_for(steps)
    if awaited:
        return awaited
    last = steps[-1] if steps else None
    if last is None:
        return "plan"
    if last.kind == "decision":
        action = last.outputs["action"]
        if action == "approve":
            return "implement"
        if action in ("redirect", "iterate"):
            return "plan"
        if action in ("finish", "cancel"):
            return f"stop:{action}"
        if action in HANDOVERS:  # a change of hands: go on from where the work was left
            prior = [*steps[:-1]]
            return hitl_next_action(prior, max_debug_attempts) if prior else "plan"
        raise ValueError(f"decision {action!r} does not advance a HITL session")
    if last.kind in ("implement", "debug"):
        return "evaluate"
    if last.kind == "evaluate":
        if last.outputs.get("verdict") in ("ok", "unverified"):
            return "analyse"
        debug = 0
        for step in reversed(steps):
            if step.kind == "plan":
                break
            debug += step.kind == "debug"
        return "debug" if debug < max_debug_attempts else "give_up"
    raise ValueError(f"unknown step kind {last.kind!r}")


@dataclass
class HitlMachine(AutoLoop):
    mode: str = "hitl"

    def decide(self, steps: list[StepRecord]) -> str:
        return hitl_next_action(steps, self.config.max_debug_attempts)


def answered_step(s: Session, *, session_id: str, step: int | None) -> int | None:
    """The step a decision answers now: the latest the agents did. With `step` (a click on a message shown for
    that step) it is refused when the session has moved on or someone already answered that step."""
    answers = sessions.last_step_index(s, session_id=session_id)
    if step is None:
        return answers
    if step != answers:
        raise DecisionRejected(f"that message was for step {step} of session {session_id}, which has moved on "
                               f"(now at step {answers}); answer the latest message in the thread")
    earlier = sessions.decision_answering(s, session_id=session_id, step_index=step)
    # A change of hands answers nothing: the work waits where it was, for the other side's card.
    if earlier is not None and (earlier.outputs or {}).get("action") not in HANDOVERS:
        out = earlier.outputs or {}
        raise DecisionRejected(f"that message was already answered ({out.get('action')} by <@{out.get('actor')}>)")
    return answers


AFTER_AUTO = ("adopt", "search")  # what a person may do with a finished Auto session's best kernel


def record_decision(engine: Engine, *, session_id: str, actor: str, action: str, text: str | None = None,
                    step: int | None = None, via: str | None = None) -> str:
    """`record_decision_in` in a transaction of its own, for a loop that runs in this process (the terminal)."""
    with Session(engine) as s, s.begin():
        return record_decision_in(s, session_id=session_id, actor=actor, action=action, text=text, step=step,
                                  via=via)


def record_decision_in(s: Session, *, session_id: str, actor: str, action: str, text: str | None = None,
                       step: int | None = None, via: str | None = None) -> str:
    """Record a person's decision as a step (and a Decision row) in the caller's transaction, so what the
    decision sets going is queued in the same one; returns the session's mode afterwards.

    `handoff` hands a HITL session to Auto; `handback` (allowed any time Auto has the session) hands it back;
    `adopt` and `search` answer a finished Auto session. With `step`, the decision answers that step only: a
    click on a message whose step was already answered (or overtaken) is rejected, saying so. `via` says how it
    came (button, modal, thread, terminal), for what people see.
    """
    record = sessions.get_session(s, session_id=session_id)
    if record.status in ("cancelled", "failed"):
        raise DecisionRejected(f"session {session_id} is {record.status}; nothing more can be decided")
    steps = [StepRecord(st.kind, dict(st.outputs or {})) for st in sessions.get_steps(s, session_id=session_id)]
    answers = answered_step(s, session_id=session_id, step=step)
    if record.mode == "auto":
        finished = record.status == "done"
        allowed = ("handback", *AFTER_AUTO) if finished else ("handback",)
        if action not in allowed:
            raise DecisionRejected(f"session {session_id} is {'finished' if finished else 'running'} in Auto; "
                                   f"decisions allowed now: {', '.join(allowed)}")
        if action == "handback":
            record.mode = "hitl"
    else:
        awaited = waiting_for(steps)
        allowed = ALLOWED.get(awaited or "", ())
        if action not in allowed:
            state = "busy" if awaited is None else awaited.replace("await_", "awaiting ")
            choices = ", ".join(allowed) or "none (the agents are working)"
            raise DecisionRejected(f"session {session_id} is {state}; decisions allowed now: {choices}")
        if action == "redirect" and not (text or "").strip():
            raise DecisionRejected("a redirect needs text saying what to do instead")
        if action == "handoff":
            record.mode = "auto"
    record.updated_at = now()
    s.add(record)
    outputs = {"action": action, "text": text, "actor": actor, "answers": answers, "via": via}
    decision_step = sessions.add_step(s, session_id=session_id, kind="decision", outputs=outputs)
    s.add(Decision(session_id=session_id, step_id=decision_step.id, actor=actor, action=action, text=text))
    sessions.add_event(s, session_id=session_id, kind="decision", payload=outputs)
    return record.mode
