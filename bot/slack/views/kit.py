"""The Block Kit pieces every view is built from (text, sections, context, inputs, links). Pure."""

from __future__ import annotations

from typing import Any

ACTION = "value"  # the action id of every input element: the block id tells them apart


def text(value: str) -> dict[str, Any]:
    return {"type": "plain_text", "text": value}


def section(value: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": value[:2900]}}


def context(value: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": value[:2900]}]}


def option(value: str, label: str) -> dict[str, Any]:
    return {"text": text(label), "value": value}


def text_input(block_id: str, label: str, *, value: str | None, optional: bool = False, hint: str | None = None,
               multiline: bool = False, max_length: int | None = None, placeholder: str | None = None
               ) -> dict[str, Any]:
    """A plain text input block, keeping what was typed (`value`) when a form is shown again."""
    element: dict[str, Any] = {"type": "plain_text_input", "action_id": ACTION, "multiline": multiline}
    if max_length:
        element["max_length"] = max_length
    if value:
        element["initial_value"] = value[:max_length] if max_length else value
    if placeholder:
        element["placeholder"] = text(placeholder)
    block: dict[str, Any] = {"type": "input", "block_id": block_id, "label": text(label), "element": element,
                             "optional": optional}
    if hint:
        block["hint"] = text(hint)
    return block


def unfenced(code: str) -> str:
    """The code without a surrounding Markdown fence (```python ... ```), which people paste out of habit."""
    lines = code.replace("\r\n", "\n").strip("\n").splitlines()
    if len(lines) >= 2 and lines[0].strip().startswith("```") and lines[-1].strip() == "```":
        lines = lines[1:-1]
    code = "\n".join(line.rstrip() for line in lines).strip("\n")
    return code + "\n" if code.strip() else ""


def thread_link(channel: str | None, ts: str | None) -> str:
    """A link to a thread that Slack resolves in any workspace the reader is in."""
    if not channel or not ts:
        return ""
    return f"<https://slack.com/archives/{channel}/p{ts.replace('.', '')}|thread>"
