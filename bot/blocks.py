"""Block Kit for session threads: pure functions from session data to Slack message payloads.

Every payload respects Slack's limits (at most 50 blocks, section text at most 3,000 characters); text longer
than a message should carry goes in a file instead (the notifier's job). Buttons carry their session and step,
so a click answers exactly the step it was shown for.
"""

from __future__ import annotations

import json
import time
from typing import Any

SECTION_LIMIT = 3000
MAX_BLOCKS = 50
STAGES = ("queued", "compiling", "testing", "profiling")
_STAGE_OF = {"static": "compiling", "lower": "compiling", "compile": "compiling", "correctness": "testing",
             "performance": "profiling", "profile": "profiling"}

Block = dict[str, Any]


def split_text(text: str, limit: int = SECTION_LIMIT) -> list[str]:
    """Pieces of at most `limit` characters, cut at line ends where possible."""
    pieces: list[str] = []
    current = ""
    for line in text.splitlines(keepends=True):
        while len(line) > limit:
            if current:
                pieces.append(current)
                current = ""
            pieces.append(line[:limit])
            line = line[limit:]
        if len(current) + len(line) > limit:
            pieces.append(current)
            current = ""
        current += line
    if current or not pieces:
        pieces.append(current)
    return [p.rstrip("\n") or " " for p in pieces]


def _section(text: str) -> list[Block]:
    return [{"type": "section", "text": {"type": "mrkdwn", "text": piece}} for piece in split_text(text)]


def _button(label: str, action: str, session_id: str, step: int | None, style: str | None = None) -> Block:
    button: Block = {"type": "button", "text": {"type": "plain_text", "text": label}, "action_id": action,
                     "value": json.dumps({"session": session_id, "step": step})}
    if style:
        button["style"] = style
    return button


def _capped(blocks: list[Block]) -> list[Block]:
    if len(blocks) <= MAX_BLOCKS:
        return blocks
    return blocks[:MAX_BLOCKS - 1] + [{"type": "context", "elements": [
        {"type": "mrkdwn", "text": "_(truncated here: the full text is in the attached file)_"}]}]


def session_root(*, session_id: str, task: str, target: str, mode: str, owner: str | None, status: str,
                 shapes: str = "") -> dict[str, Any]:
    """The thread's first message; its status line is edited in place as the session moves."""
    who = f"<@{owner}>" if owner else "someone"
    text = f"*{mode.upper()} session* `{session_id}` on *{task}* ({target}), started by {who}"
    blocks = _section(text)
    if shapes:
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"inputs: {shapes}"[:2000]}]})
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"status: {status}"}]})
    return {"text": f"{mode} session {session_id} on {task}: {status}", "blocks": blocks}


def plan_message(*, session_id: str, step: int, plan: str) -> dict[str, Any]:
    blocks = _section(f"*Plan*\n{plan}")
    blocks.append({"type": "actions", "block_id": f"plan-{session_id}-{step}", "elements": [
        _button("Approve", "approve", session_id, step, "primary"),
        _button("Redirect…", "redirect", session_id, step),
        _button("Hand off to Auto", "handoff", session_id, step),
        _button("Cancel", "cancel", session_id, step, "danger"),
    ]})
    return {"text": f"Plan for session {session_id}: approve, redirect, hand off or cancel", "blocks": _capped(blocks)}


def progress_text(stage: str) -> str:
    """queued → compiling → testing → profiling, with the current stage in bold."""
    current = _STAGE_OF.get(stage, stage)
    return " → ".join(f"*{s}*" if s == current else s for s in STAGES)


def result_card(*, session_id: str, step: int, outcome: dict[str, Any]) -> dict[str, Any]:
    verdict = outcome.get("verdict") or "unknown"
    lines = [f"*Result: {verdict}*  {outcome.get('message', '')}"]
    if outcome.get("speedup") is not None:
        lines.append(f"speedup *x{outcome['speedup']:.2f}* ({outcome.get('method') or 'estimated'})")
    if outcome.get("profile_summary"):
        lines.append(f"```{outcome['profile_summary'][:2500]}```")
    blocks = _section("\n".join(lines))
    blocks.append({"type": "actions", "block_id": f"result-{session_id}-{step}", "elements": [
        _button("Iterate", "iterate", session_id, step, "primary"),
        _button("Redirect…", "redirect", session_id, step),
        _button("Hand off to Auto", "handoff", session_id, step),
        _button("Finish", "finish", session_id, step),
    ]})
    return {"text": f"Result for session {session_id}: {verdict}", "blocks": _capped(blocks)}


def answered(message: dict[str, Any], *, decision: str, user: str, at: float) -> dict[str, Any]:
    """The message as it shows once answered: its buttons replaced by who decided what, and when."""
    stamp = time.strftime("%H:%M", time.gmtime(at))
    kept = [b for b in message.get("blocks", []) if b.get("type") != "actions"]
    kept.append({"type": "context", "elements": [
        {"type": "mrkdwn", "text": f"{decision.capitalize()} by <@{user}> at {stamp} UTC"}]})
    return {"text": message.get("text", ""), "blocks": kept}
