"""Gathering what a session event refers to (its steps, kernels, evaluation, profile chart and trace) into the plain
`EventView` the thread renderer needs. Database reads only; the rendering is `bot.slack.outbound.thread_ops`."""

from __future__ import annotations

import difflib
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sqlmodel import Session

from agents.auto_decide import AutoConfig, StepRecord, progress
from agents.search import outcome as search_outcome
from bot.slack.outbound.thread_ops import Card, EventView, Progress, SessionView
from bot.speedup import speedup_text
from storage import outbox, sessions
from storage.models import Candidate, Evaluation, KernelSession, SessionEvent, Step
from tpu_runner.timing import render_profile_chart, trace_json


def evaluation_outcome(evaluate_outputs: dict[str, Any], result: dict[str, Any] | None) -> dict[str, Any]:
    """One evaluation as the result card shows it: the step's headline and the evaluator's full answer."""
    result = result or {}
    perf = result.get("performance") or {}
    corr = result.get("correctness") or {}
    cases = corr.get("cases") or []
    passed = sum(c.get("status") == "passed" for c in cases)
    correctness = ""
    if corr.get("status"):
        correctness = f"{corr['status']} ({passed}/{len(cases)} cases"
        correctness += f", max abs err {corr['max_abs_err']:.3g})" if corr.get("max_abs_err") is not None else ")"
    profile = result.get("profile") or {}
    candidate = profile.get("candidate") or {}
    summary = str(profile.get("summary") or evaluate_outputs.get("profile_summary") or "")
    bottleneck = ""
    if candidate.get("bound"):
        bottleneck = f"{candidate['bound']}-bound"
        if candidate.get("compute_seconds") is not None and candidate.get("memory_seconds") is not None:
            bottleneck += (f" (compute {candidate['compute_seconds'] * 1e3:.3g} ms, HBM "
                           f"{candidate['memory_seconds'] * 1e3:.3g} ms)")
    return {
        "verdict": evaluate_outputs.get("verdict") or result.get("verdict"),
        "message": evaluate_outputs.get("message") or result.get("message"),
        "speedup": perf.get("speedup", evaluate_outputs.get("speedup")),
        "method": perf.get("method", evaluate_outputs.get("method")),
        "band": perf.get("band", evaluate_outputs.get("band")),
        "candidate_ms": perf.get("candidate"), "reference_ms": perf.get("reference"),
        "roofline_fraction": perf.get("roofline_fraction"), "bound": perf.get("bound"),
        "correctness": correctness, "bottleneck": bottleneck, "profile_summary": summary,
        "error": evaluate_outputs.get("error") or result.get("error"),
        "candidate_id": evaluate_outputs.get("candidate_id"),
    }


def chart_png(result: dict[str, Any] | None, title: str) -> bytes | None:
    """The profile chart, drawn here from the evaluation's profile: the runner's files may be on another host."""
    profile = (result or {}).get("profile")
    if not profile:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = render_profile_chart(profile, Path(tmp) / "profile.png", title=title)
        return path.read_bytes()


def profile_trace(result: dict[str, Any] | None, *, task: str, target: str) -> bytes | None:
    """The evaluation's profile as a Chrome trace file, for a person to open in Perfetto's UI."""
    profile = (result or {}).get("profile")
    return trace_json(profile, task=task, target=target) if profile else None


@dataclass
class SessionData:
    """One session's rows, read once per delivery batch."""

    record: KernelSession
    steps: list[Step]
    posted: set[str]
    shapes: str = ""
    evaluations: dict[int, Evaluation] = field(default_factory=dict)
    started_mode: str = ""  # from its session_started event: a hand-over changes the record's mode

    @property
    def records(self) -> list[StepRecord]:
        return [StepRecord(st.kind, dict(st.outputs or {})) for st in self.steps if st.status == "done"]

    def step(self, index: int | None) -> Step | None:
        return next((st for st in self.steps if st.index == index), None)


def load_session(s: Session, session_id: str) -> SessionData:
    record = sessions.get_session(s, session_id=session_id)
    steps = sessions.get_steps(s, session_id=session_id, status=None)
    posted = set(outbox.get_posted(s, scope=session_id))
    described = sessions.get_latest_event(s, session_id=session_id, kind="task_described")
    started = sessions.get_latest_event(s, session_id=session_id, kind="session_started")
    candidate_ids = [int(st.outputs["candidate_id"]) for st in steps
                     if st.kind == "evaluate" and (st.outputs or {}).get("candidate_id") is not None]
    evaluations: dict[int, Evaluation] = {int(e.candidate_id or 0): e
                                          for e in sessions.get_evaluations(s, candidate_ids=candidate_ids)}
    return SessionData(record, steps, posted, shapes=str((described.payload or {}).get("shapes", "")) if described
                       else "", evaluations=evaluations,
                       started_mode=str((started.payload or {}).get("mode") or "") if started else "")


def _session_view(data: SessionData) -> SessionView:
    r = data.record
    budget = r.budget or {}
    return SessionView(id=r.id, mode=r.mode, status=r.status, task=r.task, target=r.target, owner=r.owner,
                       shapes=data.shapes, max_iterations=int(budget.get("iterations") or AutoConfig.max_iterations),
                       max_debug_attempts=AutoConfig.max_debug_attempts,
                       search_budget=int((budget.get("search") or {}).get("budget") or 0),
                       in_parent_thread=r.slack_thread_ts is not None and "root" not in data.posted,
                       started_mode=data.started_mode)


def _code_steps(data: SessionData) -> list[Step]:
    return [st for st in data.steps if st.kind in ("implement", "debug") and (st.outputs or {}).get("code")]


def _kernel_facts(data: SessionData, candidate_id: int | None) -> dict[str, Any]:
    """version, anchor (the cycle's first candidate), code and diff of a candidate of an Auto/HITL session."""
    code_steps = _code_steps(data)
    index = next((i for i, st in enumerate(code_steps) if st.outputs.get("candidate_id") == candidate_id), None)
    if index is None:
        return {}
    anchor = next((st.outputs["candidate_id"] for st in reversed(code_steps[:index + 1]) if st.kind == "implement"),
                  candidate_id)
    code = str(code_steps[index].outputs["code"])
    diff = None
    if index > 0:
        before = str(code_steps[index - 1].outputs["code"])
        diff = "".join(difflib.unified_diff(before.splitlines(keepends=True), code.splitlines(keepends=True),
                                            f"kernel_v{index}.py", f"kernel_v{index + 1}.py")) or None
    return {"version": index + 1, "anchor": anchor, "code": code, "diff": diff}


def _progress(data: SessionData, s: Session) -> Progress:
    if data.record.mode == "search":
        out = search_outcome(s, data.record.id)
        return Progress(evaluations=out.evaluations, duplicates=out.duplicates,
                        best=speedup_text(out.speedup, out.method, out.band) if out.improved else "")
    records = data.records
    p = progress(records)
    best = next((r.outputs for r in records if r.kind == "evaluate"
                 and r.outputs.get("candidate_id") == p.best_candidate_id), None)
    last_error = next((str((r.outputs.get("error") or {}).get("kind", "")) for r in reversed(records)
                       if r.kind == "evaluate"), "")
    return Progress(iteration=p.iterations, evaluations=sum(r.kind == "evaluate" for r in records),
                    best=speedup_text(p.best_speedup, (best or {}).get("method"), (best or {}).get("band")),
                    debug_attempts=p.debug_attempts,
                    last_error=last_error)


def _unevaluated(data: SessionData) -> int | None:
    """The latest kernel, when no evaluation of it was recorded (a session cancelled before it ran)."""
    code_steps = _code_steps(data)
    if not code_steps:
        return None
    last = code_steps[-1]
    if any(st.kind == "evaluate" and st.index > last.index for st in data.steps):
        return None
    return int(last.outputs["candidate_id"])


def _running_cycle(data: SessionData) -> int | None:
    """The candidate whose evaluation is under way (the latest work was a kernel written or fixed), if any."""
    work = [st for st in data.steps if st.kind != "decision" and st.status == "done"]
    if work and work[-1].kind in ("implement", "debug") and (work[-1].outputs or {}).get("candidate_id") is not None:
        return int(work[-1].outputs["candidate_id"])
    return None


def _latest_evaluation(data: SessionData, before_step: int) -> Step | None:
    return next((st for st in reversed(data.steps) if st.kind == "evaluate" and st.index <= before_step), None)


@dataclass(frozen=True)
class _Shown:
    """A card and its files: a result card's chart, Auto's summary's trace of the best kernel (drawn only when
    asked: a card that is only edited refers to the chart uploaded with it)."""

    card: Card | None
    chart: bytes | None = None
    trace: bytes | None = None


def _card(data: SessionData, step_index: int | None, *, summary: bool = False, files: bool = False) -> _Shown:
    """The card for a waiting step (plan to approve, result to decide on) or for Auto's summary, with its files
    (a result's trace comes with its kernel, at its evaluate step)."""
    step = data.step(step_index)
    if step is None or step_index is None:
        return _Shown(None)
    task, target = data.record.task, data.record.target
    if summary:
        records = data.records
        p = progress(records)
        best = next((st for st in data.steps if st.kind == "evaluate"
                     and (st.outputs or {}).get("candidate_id") == p.best_candidate_id), None)
        outcome: dict[str, Any] = {}
        trace = None
        if best is not None:
            e = data.evaluations.get(int(best.outputs["candidate_id"]))
            outcome = evaluation_outcome(dict(best.outputs), e.result if e else None)
            trace = profile_trace(e.result, task=task, target=target) if e and files else None
        outcome.update(improved=p.best_candidate_id is not None, evaluations=sum(r.kind == "evaluate" for r in records))
        return _Shown(Card("summary", step_index, outcome=outcome), trace=trace)
    if step.kind == "plan":
        outputs = step.outputs or {}
        return _Shown(Card("plan", step_index, plan=str(outputs.get("plan", "")), redirect=outputs.get("redirect")))
    evaluated = _latest_evaluation(data, step_index)
    if evaluated is None:
        return _Shown(Card("result", step_index, outcome={"verdict": "none", "message": "nothing was evaluated"}))
    e = data.evaluations.get(int(evaluated.outputs.get("candidate_id") or 0))
    outcome = evaluation_outcome(dict(evaluated.outputs), e.result if e else None)
    if step.kind == "analyse":
        summary_text = str((step.outputs or {}).get("summary", ""))
        outcome["analysis"] = summary_text.rsplit("analysis: ", 1)[-1] if "analysis: " in summary_text else ""
    elif step.kind == "give_up":
        outcome["analysis"] = str((step.outputs or {}).get("reason", ""))
    card = Card("result", step_index, outcome=outcome)
    if not files:  # shown again (answered): it shows the chart uploaded with it, if there was one
        return _Shown(replace(card, chart=card.chart_key in data.posted))
    chart = chart_png(e.result, f"{task} on {target}") if e else None
    return _Shown(replace(card, chart=chart is not None), chart)


def event_view(s: Session, data: SessionData, event: SessionEvent) -> EventView:
    """Everything `bot.slack.outbound.thread_ops.ops_for` needs to show this event."""
    payload = dict(event.payload or {})
    view: dict[str, Any] = {"id": event.id or 0, "kind": event.kind, "payload": payload, "at": event.created_at,
                            "session": _session_view(data)}
    mode = data.record.mode
    if event.kind in ("step", "progress", "job_done", "search_finished") or (event.kind == "decision"
                                                                              and mode == "auto"):
        view["progress"] = _progress(data, s)
    if event.kind in ("step", "progress") and payload.get("candidate_id") is not None and mode != "search":
        facts = _kernel_facts(data, int(payload["candidate_id"]))
        view.update(version=facts.get("version", 0), anchor=facts.get("anchor"))
        if event.kind == "step" and payload.get("kind") == "evaluate" and mode == "hitl":  # its files, at last
            e = data.evaluations.get(int(payload["candidate_id"]))
            view.update(candidate=int(payload["candidate_id"]), code=facts.get("code"), diff=facts.get("diff"),
                        trace=profile_trace(e.result, task=data.record.task, target=data.record.target) if e
                        else None)
    if event.kind == "hitl_finished" and mode == "hitl" and (never := _unevaluated(data)) is not None:
        facts = _kernel_facts(data, never)
        view.update(candidate=never, version=facts.get("version", 0), code=facts.get("code"), diff=facts.get("diff"))
    if event.kind == "hitl_paused" and str(payload.get("stop_reason", "")).startswith("await_"):
        shown = _card(data, payload.get("awaits_step"), files=True)
        view.update(card=shown.card, chart=shown.chart)
    if event.kind == "auto_finished" and data.record.status != "cancelled":
        shown = _card(data, payload.get("awaits_step"), summary=True, files=True)
        view.update(card=shown.card, trace=shown.trace)
        if view["card"] is not None:
            view["card"].outcome["stop_reason"] = payload.get("stop_reason")
        view["progress"] = _progress(data, s)
        best = payload.get("best_candidate_id")
        candidate = s.get(Candidate, int(best)) if best else None
        view["kernel"] = candidate.code if candidate else None
    if event.kind == "decision" and payload.get("action") == "cancel" and mode == "hitl":
        running = _running_cycle(data)  # its progress message loses its Cancel button
        if running is not None:
            facts = _kernel_facts(data, running)
            view.update(version=facts.get("version", 0), anchor=facts.get("anchor"))
    if event.kind == "decision":
        answers = payload.get("answers")
        if f"summary:{answers}" in data.posted and payload.get("action") in ("adopt", "search", "handback", "cancel"):
            view["card"] = _card(data, answers, summary=True).card
        elif f"card:{answers}" in data.posted:
            view["card"] = _card(data, answers).card
    if event.kind == "search_finished":
        out = search_outcome(s, data.record.id)
        view["card"] = Card("summary", 0, outcome={
            "improved": out.improved, "speedup": out.speedup, "method": out.method, "band": out.band,
            "evaluations": out.evaluations,
            "duplicates": out.duplicates, "infeasible": out.infeasible, "path": out.best_strategy_path,
            "reason": payload.get("reason")})
        if out.best_candidate_id:
            candidate = s.get(Candidate, out.best_candidate_id)
            view["kernel"] = candidate.code if candidate else None
    return EventView(**view)
