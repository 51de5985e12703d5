"""Modals, as pure functions: the redirect form a Redirect… button opens."""

from __future__ import annotations

import json
from typing import Any

from bot.slack.views.kit import Payload, modal, section, text_input

REDIRECT_CALLBACK = "redirect"
REDIRECT_BLOCK = "instructions"


def redirect_modal(*, session_id: str, step: int | None, channel: str) -> Payload:
    return modal(callback_id=REDIRECT_CALLBACK, title="Redirect the agent", submit="Redirect",
                 private_metadata=json.dumps({"session": session_id, "step": step, "channel": channel}),
                 blocks=[section(f"Session `{session_id}`: say what to do instead; the planner reads it for its next "
                                 "plan."),
                         text_input(REDIRECT_BLOCK, "Instructions", value=None, multiline=True, max_length=3000,
                                    placeholder="e.g. block 256x512, vmem 96", action_id="text")])


def redirect_submission(view: dict[str, Any]) -> tuple[str, int | None, str, str]:
    """(session, step, channel, text) from a submitted redirect modal."""
    meta = json.loads(view.get("private_metadata") or "{}")
    value = (view.get("state", {}).get("values", {}).get(REDIRECT_BLOCK, {}).get("text", {}).get("value") or "")
    return str(meta.get("session", "")), meta.get("step"), str(meta.get("channel", "")), value.strip()
