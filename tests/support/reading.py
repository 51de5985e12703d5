"""Reading what the fake Slack holds, the way a person reads a thread: a message's text and buttons, and
waiting for something a listener or the notifier does after its ack."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from tests.fakes.slack_api import Message


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = 30.0, poll: float = 0.05) -> Any:
    """The first truthy value of `predicate()` within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def text_of(message: Message | None) -> str:
    """Everything a message shows, blocks and fallback text."""
    return json.dumps(message.blocks) + message.text if message else ""


def buttons(message: Message) -> dict[str, str]:
    """action_id -> value of the message's buttons, in order."""
    return {e["action_id"]: e["value"] for b in message.blocks if b["type"] == "actions" for e in b["elements"]}


def keys(messages: list[Message]) -> list[str]:
    """The notifier's key of each message (from its metadata; files by their ids)."""
    return [(m.metadata or {}).get("event_payload", {}).get("key", f"file:{m.files}") for m in messages]
