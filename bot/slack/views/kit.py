"""The Block Kit pieces every view is built from: text objects, sections, context, headers, buttons, inputs,
modals, links, and the limits Slack sets on a message. Pure; every payload in `bot.slack.views` is made of these."""

from __future__ import annotations

import re
import time
from typing import Any

Block = dict[str, Any]
Payload = dict[str, Any]

SECTION_LIMIT = 3000
MAX_BLOCKS = 50
MESSAGE_TEXT_BUDGET = 10_000  # Slack refuses a message whose blocks hold about 12k characters (msg_blocks_too_long)
ACTION = "value"  # the action id of every input element: the block id tells them apart


def text(value: str) -> Block:
    return {"type": "plain_text", "text": value}


def header(value: str) -> Block:
    return {"type": "header", "text": text(value[:150])}


def section(value: str) -> Block:
    """One section, its text cut to Slack's limit (for text known to be short)."""
    return {"type": "section", "text": {"type": "mrkdwn", "text": value[:2900]}}


def sections(value: str, limit: int = SECTION_LIMIT) -> list[Block]:
    """As many sections as the text needs, cut at line ends (for text of any length)."""
    return [{"type": "section", "text": {"type": "mrkdwn", "text": piece}} for piece in split_text(value, limit)]


def context(value: str) -> Block:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": value[:2900]}]}


def fields(values: list[str], heading: str = "") -> Block:
    """A section of short mrkdwn fields, shown two a row (Slack takes at most 10, each within 2,000 characters)."""
    block: Block = {"type": "section", "fields": [{"type": "mrkdwn", "text": v[:2000]} for v in values[:10]]}
    if heading:
        block["text"] = {"type": "mrkdwn", "text": heading[:2900]}
    return block


def confirm(*, title: str, question: str, yes: str, no: str, danger: bool = False) -> Block:
    """The dialog Slack shows before it sends a button's click (within its limits: title 100 characters, question
    300, answers 30)."""
    dialog: Block = {"title": text(title[:100]), "text": {"type": "mrkdwn", "text": question[:300]},
                     "confirm": text(yes[:30]), "deny": text(no[:30])}
    if danger:
        dialog["style"] = "danger"
    return dialog


def button(label: str, action: str, value: str, style: str | None = None, *, ask: Block | None = None) -> Block:
    """A button; with `ask` (a `confirm` dialog) Slack asks before it sends the click."""
    block: Block = {"type": "button", "text": text(label), "action_id": action, "value": value}
    if style:
        block["style"] = style
    if ask:
        block["confirm"] = ask
    return block


def actions(block_id: str, elements: list[Block]) -> Block:
    return {"type": "actions", "block_id": block_id, "elements": elements}


def option(value: str, label: str) -> Block:
    return {"text": text(label), "value": value}


def text_input(block_id: str, label: str, *, value: str | None, optional: bool = False, hint: str | None = None,
               multiline: bool = False, max_length: int | None = None, placeholder: str | None = None,
               action_id: str = ACTION) -> Block:
    """A plain text input block, keeping what was typed (`value`) when a form is shown again."""
    element: Block = {"type": "plain_text_input", "action_id": action_id, "multiline": multiline}
    if max_length:
        element["max_length"] = max_length
    if value:
        element["initial_value"] = value[:max_length] if max_length else value
    if placeholder:
        element["placeholder"] = text(placeholder)
    block: Block = {"type": "input", "block_id": block_id, "label": text(label), "element": element,
                    "optional": optional}
    if hint:
        block["hint"] = text(hint)
    return block


def modal(*, callback_id: str, title: str, blocks: list[Block], submit: str | None = None, close: str = "Cancel",
          private_metadata: str = "") -> Payload:
    view: Payload = {"type": "modal", "callback_id": callback_id, "title": text(title[:24]), "close": text(close),
                     "private_metadata": private_metadata, "blocks": blocks[:100]}
    if submit:
        view["submit"] = text(submit)
    return view


def split_text(value: str, limit: int = SECTION_LIMIT) -> list[str]:
    """Pieces of at most `limit` characters, cut at line ends where possible."""
    pieces: list[str] = []
    current = ""
    for line in value.splitlines(keepends=True):
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


def mrkdwn(markdown: str) -> str:
    """Markdown as Slack shows it: headings and **bold** become *bold* (Slack prints `##` as it is)."""
    value = re.sub(r"^#{1,6}\s+(.+?)\s*#*$", r"*\1*", markdown, flags=re.MULTILINE)
    return re.sub(r"\*\*(\S(?:.*?\S)?)\*\*", r"*\1*", value)


def text_size(block: Block) -> int:
    if block["type"] in ("section", "header"):
        return len((block.get("text") or {}).get("text", "")) + sum(len(f["text"]) for f in block.get("fields", []))
    return sum(len(e.get("text", "")) for e in block.get("elements", []) if isinstance(e.get("text"), str))


def too_long(value: str) -> bool:
    """Text that a message cannot carry whole: the full text goes in a file beside it."""
    return len(value) > MESSAGE_TEXT_BUDGET - 1000


def capped(blocks: list[Block]) -> list[Block]:
    """Within Slack's limits on blocks and on text, the actions (if any) kept last so the buttons survive a long
    text; what is cut is said."""
    kept_actions = [b for b in blocks if b["type"] == "actions"]
    body: list[Block] = []
    budget = MESSAGE_TEXT_BUDGET - sum(text_size(b) for b in kept_actions) - 200
    for block in (b for b in blocks if b["type"] != "actions"):
        if len(body) >= MAX_BLOCKS - 1 - len(kept_actions) or text_size(block) > budget:
            body.append(context("_(truncated here: the full text is in the attached file)_"))
            break
        body.append(block)
        budget -= text_size(block)
    return [*body, *kept_actions]


def unfenced(code: str) -> str:
    """The code without a surrounding Markdown fence (```python ... ```), which people paste out of habit."""
    lines = code.replace("\r\n", "\n").strip("\n").splitlines()
    if len(lines) >= 2 and lines[0].strip().startswith("```") and lines[-1].strip() == "```":
        lines = lines[1:-1]
    code = "\n".join(line.rstrip() for line in lines).strip("\n")
    return code + "\n" if code.strip() else ""


MODE_NAMES = {"hitl": "HITL", "auto": "Auto", "search": "Search"}  # a session's mode as people type it


def mode_name(mode: str) -> str:
    return MODE_NAMES.get(mode, mode)


def thread_url(channel: str | None, ts: str | None) -> str:
    """The URL of a thread that Slack resolves in any workspace the reader is in ("" without a thread)."""
    if not channel or not ts:
        return ""
    return f"https://slack.com/archives/{channel}/p{ts.replace('.', '')}"


def thread_link(channel: str | None, ts: str | None) -> str:
    """A mrkdwn link to a thread ("" without a thread)."""
    url = thread_url(channel, ts)
    return f"<{url}|thread>" if url else ""


def slack_date(t: float, pattern: str = "{date_short_pretty} {time}") -> str:
    """A time Slack shows in each reader's own time zone (`<!date^...>`), in UTC where a client cannot."""
    fallback = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))
    return f"<!date^{int(t)}^{pattern}|{fallback}>"
