"""The App Home tab: recent sessions with their state and links, and what waits for this person. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from bot.slack.views.kit import MAX_BLOCKS, Payload, context, header, section, thread_link

WAITING = {"await_approval": "a plan to approve", "await_decision": "a result to decide on"}


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


def _line(item: HomeSession) -> str:
    link = thread_link(item.channel, item.thread_ts)
    best = f", best {item.best}" if item.best else ""
    return (f"`{item.id}` {item.mode} on *{item.task}* ({item.target}): {item.status}{best}"
            + (f" - {link}" if link else ""))


def build_home(*, user: str, recent: list[HomeSession], pending: list[HomeSession]) -> Payload:
    blocks = [header("kernelbot"),
              section("Agents that write and tune TPU kernels in JAX Pallas. `/kernel help` in any channel lists the "
                      "commands."),
              header("Waiting for you")]
    if pending:
        blocks += [section(f"{_line(p)}\nwaits for {WAITING.get(p.waiting_for or '', 'you')}") for p in pending[:15]]
    else:
        blocks.append(context("Nothing waits for you."))
    blocks.append(header("Recent sessions"))
    if recent:
        blocks += [section(_line(r)) for r in recent]
    else:
        blocks.append(context("No sessions yet: `/kernel new TASK` starts one."))
    return {"type": "home", "blocks": blocks[:MAX_BLOCKS]}
