"""The App Home tab: what waits for this person, each with a button that says what waits and opens its thread,
then the recent sessions they may see, in plain words, each with an "Open thread" button. Pure; within Slack's
limits for a Home tab (100 blocks, a button's url of 3,000 characters)."""

from __future__ import annotations

from dataclasses import dataclass

from bot.slack.views.kit import Block, Payload, button, context, header, mode_name, section, thread_url

HOME_BLOCKS = 100  # Slack's limit for a Home tab (a message takes 50)
URL_LIMIT = 3000  # a button's url
PENDING_SHOWN = 20
OPEN_THREAD = "home_open_thread"  # the action ids of the Home's link buttons (each suffixed with the session id)
OPEN_WAITING = "home_open_waiting"

STATUSES = {"active": "running", "awaiting": "waiting for a decision", "done": "finished", "cancelled": "cancelled",
            "failed": "failed"}
# What waits, in the line and on the button that opens it.
WAITING = {"await_approval": ("a plan to approve", "Review the plan"),
           "await_decision": ("a result to decide on", "Decide on the result")}


def mode_words(mode: str) -> str:
    """A session's mode as people say it: "HITL (step by step)", "Auto", "Search"."""
    return mode_name(mode) + (" (step by step)" if mode == "hitl" else "")


def status_words(status: str, *, for_you: bool = False) -> str:
    """A session's status as people say it; a session that waits for this very person is "waiting for you"."""
    if status == "awaiting" and for_you:
        return "waiting for you"
    return STATUSES.get(status, status)


@dataclass(frozen=True)
class HomeSession:
    id: str
    mode: str
    task: str
    target: str
    status: str
    owner: str | None
    channel: str | None
    thread_ts: str | None
    waiting_for: str | None = None  # await_approval | await_decision, when it waits for a person
    best: str = ""


def _line(item: HomeSession, *, for_you: bool) -> str:
    best = f", best {item.best}" if item.best else ""
    return (f"`{item.id}` {mode_words(item.mode)} on *{item.task}* ({item.target}): "
            f"{status_words(item.status, for_you=for_you)}{best}")


def _with_link(text: str, item: HomeSession, *, label: str, action: str) -> Block:
    """A section with a button that opens the session's thread (none while it has no thread)."""
    block = section(text)
    url = thread_url(item.channel, item.thread_ts)
    if url and len(url) <= URL_LIMIT:
        block["accessory"] = {**button(label, f"{action}:{item.id}", item.id), "url": url}
    return block


def _pending(item: HomeSession) -> Block:
    what, label = WAITING.get(item.waiting_for or "", ("your decision", "Open thread"))
    return _with_link(f"{_line(item, for_you=True)}: {what}", item, label=label, action=OPEN_WAITING)


def build_home(*, user: str, recent: list[HomeSession], pending: list[HomeSession]) -> Payload:
    waiting_ids = {p.id for p in pending}
    blocks = [header("kernelbot"),
              section("Agents that write and tune TPU kernels in JAX Pallas. `/kernel help` in any channel lists the "
                      "commands. You see the sessions of public channels and of the private ones you are in."),
              header("Waiting for you")]
    if pending:
        blocks += [_pending(p) for p in pending[:PENDING_SHOWN]]
        if len(pending) > PENDING_SHOWN:
            blocks.append(context(f"…and {len(pending) - PENDING_SHOWN} more: `/kernel status` in their channels "
                                  "lists them."))
    else:
        blocks.append(context("Nothing waits for you."))
    blocks.append(header("Recent sessions"))
    if recent:
        blocks += [_with_link(_line(r, for_you=r.id in waiting_ids), r, label="Open thread", action=OPEN_THREAD)
                   for r in recent]
    else:
        blocks.append(context("No sessions yet: `/kernel new TASK` starts one."))
    return {"type": "home", "blocks": blocks[:HOME_BLOCKS]}
