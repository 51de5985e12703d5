"""Modals, as pure functions: the redirect form a Redirect… button opens."""

from __future__ import annotations

import json
from typing import Any

REDIRECT_CALLBACK = "redirect"
REDIRECT_BLOCK = "instructions"


def redirect_modal(*, session_id: str, step: int | None, channel: str) -> dict[str, Any]:
    return {
        "type": "modal", "callback_id": REDIRECT_CALLBACK,
        "private_metadata": json.dumps({"session": session_id, "step": step, "channel": channel}),
        "title": {"type": "plain_text", "text": "Redirect the agent"},
        "submit": {"type": "plain_text", "text": "Redirect"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": f"Session `{session_id}`: say what to do "
                                         "instead; the planner reads it for its next plan."}},
            {"type": "input", "block_id": REDIRECT_BLOCK, "label": {"type": "plain_text", "text": "Instructions"},
             "element": {"type": "plain_text_input", "action_id": "text", "multiline": True, "max_length": 3000,
                         "placeholder": {"type": "plain_text", "text": "e.g. block 256x512, vmem 96"}}},
        ],
    }


def redirect_submission(view: dict[str, Any]) -> tuple[str, int | None, str, str]:
    """(session, step, channel, text) from a submitted redirect modal."""
    meta = json.loads(view.get("private_metadata") or "{}")
    value = (view.get("state", {}).get("values", {}).get(REDIRECT_BLOCK, {}).get("text", {}).get("value") or "")
    return str(meta.get("session", "")), meta.get("step"), str(meta.get("channel", "")), value.strip()
