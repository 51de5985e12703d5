"""Block Kit for session threads: pure functions from session data to Slack message payloads.

Every payload respects Slack's limits (at most 50 blocks, section text at most 3,000 characters); text longer
than a message should carry goes in a file instead (the notifier's job). Buttons carry their session and step,
so a click answers exactly the step it was shown for.
"""

from __future__ import annotations

import json
from typing import Any

from agents.plan_parameters import plan_parameters, without_parameters
from bot.slack.views.kit import (
    Block,
    Payload,
    actions,
    button,
    capped,
    confirm,
    context,
    fields,
    mode_name,
    mrkdwn,
    sections,
    slack_date,
)
from bot.speedup import outcome_speedup

STAGES = ("implemented", "compiling", "testing", "profiling")
_STAGE_OF = {"static": "compiling", "lower": "compiling", "compile": "compiling", "reference": "compiling",
             "correctness": "testing", "performance": "profiling", "profile": "profiling"}
DECISION_LABELS = {
    "approve": "Approved", "redirect": "Redirected", "handoff": "Handed off to Auto", "cancel": "Cancelled",
    "iterate": "Iterated", "finish": "Finished", "adopt": "Adopted", "search": "Search started",
    "handback": "Returned to HITL",
}

CANCEL = ("Cancel", "cancel", "danger")


def cancel_confirm(session_id: str) -> Block:
    """What Slack asks before it sends a click on Cancel: the session stops for good."""
    return confirm(title="Cancel this session?", yes="Cancel session", no="Keep it running", danger=True,
                   question=f"Cancel session `{session_id}`? The work so far is kept; the runner stops.")


def _session_actions(block_id: str, session_id: str, step: int | None,
                     buttons: list[tuple[str, str, str | None]]) -> Block:
    """Buttons that carry their session and step, so a click answers exactly the step it was shown for; Cancel
    asks first."""
    value = json.dumps({"session": session_id, "step": step})
    return actions(block_id, [button(label, action, value, style,
                                     ask=cancel_confirm(session_id) if action == "cancel" else None)
                              for label, action, style in buttons])


def button_value(raw: str) -> tuple[str, int | None]:
    """(session id, step) from a button's value; ValueError when it is not one of ours."""
    try:
        data = json.loads(raw)
        step = data.get("step")
        return str(data["session"]), int(step) if step is not None else None
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a kernelbot button value: {raw!r}") from exc


# -- the thread's root ----------------------------------------------------------------------------------------
def session_root(*, session_id: str, task: str, target: str, mode: str, owner: str | None, status: str,
                 shapes: str = "", started_mode: str = "") -> Payload:
    """The thread's first message, titled with the mode the session started in and naming the one it is in now
    when a hand-over changed it; its status line is edited in place as the session moves."""
    who = f"<@{owner}>" if owner else "someone"
    started = started_mode or mode
    title = f"{mode_name(started)} session"
    now = f" (now in {mode_name(mode)})" if mode != started else ""
    text = f"*{title}* `{session_id}` on *{task}* ({target}), started by {who}{now}"
    blocks = sections(text)
    if shapes:
        blocks.append(context(f"inputs: {shapes}"[:2000]))
    blocks.append(context(f"status: {status}"))
    return {"text": f"{title} {session_id} on {task}{now}: {status}", "blocks": blocks}


# -- HITL cards -----------------------------------------------------------------------------------------------
_AXES = {"BLOCK_M": "M", "BLOCK_N": "N", "BLOCK_K": "K", "BLOCK_ROWS": "rows", "BLOCK_COLS": "columns",
         "BLOCK_Q": "query", "BLOCK_KV": "key"}
# The grid each family of the offline brain's kernels walks, known by its block parameters.
_GRIDS = (("BLOCK_KV", "batch, head and query blocks in parallel; key blocks last, in order"),
          ("BLOCK_K", "M and N blocks in parallel; K blocks last, in order (the accumulator's)"),
          ("BLOCK_ROWS", "row and column blocks, all in parallel"))
_BUFFERING = {1: "single-buffered", 2: "double-buffered"}
_MiB = 2**20


def parameter_fields(params: dict[str, Any]) -> list[str]:
    """A plan's parameters in words, one Block Kit field each: the block sizes together, the VMEM limit in MiB,
    the buffering, the epilogue, the accumulator, the grid; any other parameter as it is."""
    shown: list[str] = []
    axes = [k for k in _AXES if k in params]
    if axes == ["BLOCK_ROWS"]:
        shown.append(f"*Block*\n{params['BLOCK_ROWS']} rows x all columns")
    elif axes:
        shown.append(f"*Block ({' x '.join(_AXES[k] for k in axes)})*\n{' x '.join(str(params[k]) for k in axes)}")
    if isinstance(params.get("VMEM_LIMIT_BYTES"), int):
        shown.append(f"*VMEM limit*\n{params['VMEM_LIMIT_BYTES'] / _MiB:g} MiB")
    if "BUFFERS" in params:
        buffers = params["BUFFERS"]
        shown.append(f"*Buffering*\n{_BUFFERING.get(buffers, f'{buffers} buffers')}")
    elif axes:
        shown.append("*Buffering*\ndouble-buffered (Pallas' default)")
    if "FUSE_EPILOGUE" in params:
        shown.append("*Epilogue*\n" + ("fused into the kernel" if params["FUSE_EPILOGUE"]
                                        else "run by XLA after the kernel"))
    if "ACC_DTYPE" in params:
        shown.append(f"*Accumulator*\n{params['ACC_DTYPE']}")
    grid = next((words for key, words in _GRIDS if key in params), None)
    if grid:
        shown.append(f"*Grid*\n{grid}")
    known = {*_AXES, "VMEM_LIMIT_BYTES", "BUFFERS", "FUSE_EPILOGUE", "ACC_DTYPE"}
    shown += [f"*{key}*\n{json.dumps(value)}" for key, value in params.items() if key not in known]
    return shown[:10]


def plan_message(*, session_id: str, step: int, plan: str, redirect: str | None = None) -> Payload:
    """The plan to approve: its parameters as fields (the plan's `Parameters:` line is left out of its text, which
    says the same), the plan itself, and the four buttons."""
    heading = "*Plan*" + (f" (redirected: “{redirect.strip()[:300]}”)" if redirect else "")
    params = plan_parameters(plan)
    if params:
        blocks = [fields(parameter_fields(params), heading=heading), *sections(mrkdwn(without_parameters(plan)))]
    else:
        blocks = sections(f"{heading}\n{mrkdwn(plan)}")
    blocks.append(_session_actions(f"plan-{session_id}-{step}", session_id, step, [
        ("Approve", "approve", "primary"), ("Redirect…", "redirect", None), ("Hand off to Auto", "handoff", None),
        CANCEL]))
    return {"text": f"Plan for session {session_id}: approve, redirect, hand off or cancel", "blocks": capped(blocks)}


def result_lines(outcome: dict[str, Any]) -> list[str]:
    """The result in a few lines: verdict, correctness, time against the reference (measured or estimated),
    speedup, fraction of roofline, bottleneck; for a failure, the stage and the error."""
    verdict = outcome.get("verdict") or "unknown"
    speedup = outcome_speedup(outcome)
    lines = [f"*Result: {verdict}*" + (f"  {speedup}" if speedup else "")]
    correctness = outcome.get("correctness")
    if correctness:
        lines.append(f"correctness: {correctness}")
    if outcome.get("candidate_ms") is not None and outcome.get("reference_ms") is not None:
        lines.append(f"time: {outcome['candidate_ms']:.4g} ms vs reference {outcome['reference_ms']:.4g} ms "
                     f"({outcome.get('method') or 'estimated'})")
    if outcome.get("roofline_fraction") is not None:
        lines.append(f"roofline: {outcome['roofline_fraction']:.0%} of what the chip allows"
                     + (f", {outcome['bound']}-bound" if outcome.get("bound") else ""))
    if outcome.get("bottleneck"):
        lines.append(f"bottleneck: {outcome['bottleneck']}")
    error = outcome.get("error")
    if error:
        where = f" at line {error['line']}" if error.get("line") else ""
        lines.append(f"error: `{error.get('kind')}`{where} in {error.get('stage') or 'evaluation'}: "
                     f"{str(error.get('detail', '')).strip()[:1200]}")
    elif verdict not in ("ok",) and outcome.get("message"):
        lines.append(str(outcome["message"])[:1200])
    if outcome.get("analysis"):
        lines.append(f"analysis: {str(outcome['analysis'])[:1500]}")
    return lines


def chart_image(file_id: str, alt: str) -> Block:
    """A picture Slack holds (an uploaded file, shared or not), shown inside a message."""
    return {"type": "image", "slack_file": {"id": file_id}, "alt_text": alt[:2000]}


def result_card(*, session_id: str, step: int, outcome: dict[str, Any], chart: str | None = None) -> Payload:
    """The result to decide on: its lines, the profile chart (`chart`: the id of its uploaded picture), the
    profile summary and the four buttons."""
    blocks = sections("\n".join(result_lines(outcome)))
    if chart:
        blocks.append(chart_image(chart, f"profile chart: {outcome.get('verdict') or 'result'} "
                                         f"{outcome_speedup(outcome)}".rstrip()))
    if outcome.get("profile_summary"):
        blocks += sections(f"```{outcome['profile_summary'][:2500]}```")
    blocks.append(_session_actions(f"result-{session_id}-{step}", session_id, step, [
        ("Iterate", "iterate", "primary"), ("Redirect…", "redirect", None), ("Hand off to Auto", "handoff", None),
        ("Finish", "finish", None)]))
    verdict = outcome.get("verdict") or "unknown"
    return {"text": f"Result for session {session_id}: {verdict} {outcome_speedup(outcome)}".rstrip(),
            "blocks": capped(blocks)}


def progress_text(stage: str) -> str:
    """implemented → compiling → testing → profiling, with the current stage in bold."""
    current = _STAGE_OF.get(stage, stage)
    return " → ".join(f"*{s}*" if s == current else s for s in STAGES)


def progress_message(*, title: str, stage: str, note: str = "", done: str = "", session_id: str = "",
                     running: bool = True) -> Payload:
    """One message per implement-evaluate cycle, edited from the kernel implemented through the runner's stages to
    its evaluation (`done`); while the cycle runs it has a Cancel button for the session."""
    line = done or progress_text(stage)
    text = f"{title}: {line}" + (f"\n{note}" if note else "")
    blocks = sections(text)
    if session_id and running and not done:
        blocks.append(_session_actions(f"cycle-{session_id}", session_id, None, [CANCEL]))
    return {"text": f"{title}: {done or _STAGE_OF.get(stage, stage)}", "blocks": blocks}


# -- Auto -----------------------------------------------------------------------------------------------------
def auto_progress(*, session_id: str, iteration: int, max_iterations: int, doing: str, evaluations: int,
                  best: str, running: bool = True) -> Payload:
    """The one message an Auto run edits as it goes, with buttons to take the session back or cancel it while it
    runs."""
    text = (f"*Auto* iteration {iteration}/{max_iterations}: {doing}\n"
            f"{evaluations} evaluation(s) so far, best {best or 'none yet'}")
    blocks = sections(text)
    if running:
        blocks.append(_session_actions(f"auto-{session_id}", session_id, None,
                                       [("Return to HITL", "handback", None), CANCEL]))
    return {"text": f"Auto iteration {iteration}/{max_iterations}: {doing}", "blocks": blocks}


def auto_summary(*, session_id: str, step: int, outcome: dict[str, Any]) -> Payload:
    """Auto's final word: the best kernel (attached beside it) and what to do with it."""
    if outcome.get("improved"):
        head = (f"*Auto finished* after {outcome.get('evaluations', 0)} evaluation(s) (stopped: "
                f"{outcome.get('stop_reason')}): best kernel {outcome_speedup(outcome)}")
        buttons = [("Adopt this kernel", "adopt", "primary"), ("Continue with a search", "search", None),
                   ("Return to HITL", "handback", None)]
    else:
        head = (f"*Auto finished* without a kernel faster than the reference after {outcome.get('evaluations', 0)} "
                f"evaluation(s) (stopped: {outcome.get('stop_reason')})")
        buttons = [("Return to HITL", "handback", "primary")]
    lines = [head, *result_lines(outcome)[1:]] if outcome.get("verdict") else [head]
    blocks = sections("\n".join(lines))
    blocks.append(_session_actions(f"summary-{session_id}-{step}", session_id, step, buttons))
    return {"text": f"Auto finished for session {session_id}: {outcome_speedup(outcome) or 'no improvement'}",
            "blocks": capped(blocks)}


# -- Search ---------------------------------------------------------------------------------------------------
def search_progress(*, evaluations: int, budget: int, best: str, duplicates: int = 0, session_id: str = "",
                    running: bool = True) -> Payload:
    """The search's one progress message, edited as evaluations come in; a Cancel button while it runs."""
    dup = f", {duplicates} duplicate(s) skipped" if duplicates else ""
    text = f"*Search*: {evaluations}/{budget} evaluations{dup}, best {best or 'none yet'}"
    blocks = sections(text)
    if session_id and running:
        blocks.append(_session_actions(f"search-{session_id}", session_id, None, [CANCEL]))
    return {"text": f"Search: {evaluations}/{budget} evaluations, best {best or 'none yet'}", "blocks": blocks}


def search_summary(*, outcome: dict[str, Any]) -> Payload:
    if outcome.get("improved"):
        head = f"*Search finished*: best kernel {outcome_speedup(outcome)}"
    else:
        head = "*Search finished* without a kernel faster than the reference"
    beyond = f", {outcome['infeasible']} move(s) beyond the chip's VMEM not counted" if outcome.get("infeasible") \
        else ""
    lines = [head, f"{outcome.get('evaluations', 0)} evaluation(s), {outcome.get('duplicates', 0)} duplicate(s) "
                   f"skipped{beyond}; {outcome.get('reason') or ''}".rstrip("; ")]
    if outcome.get("path"):
        lines.append("strategies that led there: " + " → ".join(outcome["path"]))
    return {"text": f"Search finished: {outcome_speedup(outcome) or 'no improvement'}",
            "blocks": sections("\n".join(lines))}


# -- small things ---------------------------------------------------------------------------------------------
def notice(text: str) -> Payload:
    return {"text": text[:3000], "blocks": sections(text)}


_UNDELIVERED = {  # Slack's refusal -> what happened, and what brings the thread back
    "not_in_channel": ("I am no longer a member of {channel}", "invite me back (`/invite @kernelbot` there)"),
    "channel_not_found": ("I cannot see {channel} any more (a private channel I am not in, or a deleted one)",
                          "invite me to it (`/invite @kernelbot` there)"),
    "is_archived": ("{channel} was archived", "unarchive it"),
}


def undelivered_notice(*, session_id: str, task: str, target: str, channel: str, error: str) -> Payload:
    """A direct message to a session's owner: Slack refuses the session's posts in its channel for good."""
    what, fix = _UNDELIVERED.get(error, ("Slack refuses my posts in {channel}", "check the channel's settings"))
    where = f"<#{channel}>"
    text = (f"{what.format(channel=where)}, so I cannot post the updates of your session `{session_id}` "
            f"(*{task}* on {target}) there: Slack says `{error}`. The session goes on.\n"
            f"• To have its thread updated again, {fix}: the next updates then appear there.\n"
            f"• To see the session now: `/kernel show {session_id}`.")
    return {"text": f"Session {session_id} cannot post in its channel ({error}): /kernel show {session_id}",
            "blocks": sections(text)}


def answered(message: Payload, *, decision: str, user: str, at: float, text: str | None = None) -> Payload:
    """The message as it shows once answered: its buttons replaced by who decided what, and when (in each
    reader's own time zone: Slack's date format, with the time in UTC where a client cannot show it)."""
    stamp = slack_date(at, "{date_short_pretty} at {time}")
    label = DECISION_LABELS.get(decision, decision.capitalize())
    said = f": “{text.strip()[:500]}”" if text and text.strip() else ""
    kept = [b for b in message.get("blocks", []) if b.get("type") != "actions"]
    kept.append(context(f"{label} by <@{user}>, {stamp}{said}"))
    return {"text": message.get("text", ""), "blocks": kept}
