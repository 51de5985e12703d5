"""End to end, as a team uses it: `kernelbot serve` (HTTP, an embedded runner, the offline brain) against the
fake Slack. /kernel new -> a plan in a thread -> redirects through the modal and a reply to the bot -> Approve ->
kernel, progress, result card with its chart inside -> Hand off to Auto -> Auto's progress and final summary; an
unauthorised click, a stale button, and a cancel."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, col, select

from bot.slack.server import Server
from storage import sessions
from storage.models import Decision, KernelSession
from tests.fakes.slack_api import BOT_USER, FakeSlack, Message
from tests.support.bot import whole_server
from tests.support.reading import buttons, text_of, wait_for
from tests.support.slack_http import click, command, event, submit_view


class Team:
    """The served app and what people see of it."""

    def __init__(self, url: str, slack: FakeSlack, server: Server):
        self.url, self.slack, self.server = url, slack, server

    def session(self, session_id: str) -> KernelSession:
        with Session(self.server.engine) as s:
            return sessions.get_session(s, session_id=session_id)

    def thread(self, session_id: str) -> list[Message]:
        record = self.session(session_id)
        return self.slack.thread("C1", record.slack_thread_ts) if record.slack_thread_ts else []

    def card(self, session_id: str, first_button: str, after: int = 0) -> Message:
        """The newest message of the thread whose buttons start with this one (posted after `after` messages)."""
        def find() -> Message | None:
            found = [m for m in self.thread(session_id)[after:] if list(buttons(m))[:1] == [first_button]]
            return found[-1] if found else None
        return wait_for(f"a card with {first_button}", find, timeout=120)

    def root(self, session_id: str) -> Message:
        return self.thread(session_id)[0]


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Team]:
    with whole_server(tmp_path) as (url, slack, server):
        yield Team(url, slack, server)


def _session_id(reply: dict[str, Any]) -> str:
    match = re.search(r"`([0-9a-f]{12})`", reply["text"])
    assert match, reply
    return match.group(1)


@pytest.mark.slow
def test_a_hitl_session_from_slash_command_to_auto_summary(team: Team) -> None:
    status, reply = command(team.url, "new softmax --brain offline --budget 3", fake=team.slack)
    assert status == 200 and "Started HITL session" in reply["text"]
    sid = _session_id(reply)

    plan = team.card(sid, "approve")
    first_plan = buttons(plan)  # (the fake edits its messages in place)
    root = team.root(sid)
    assert root.thread_ts is None and "*HITL session*" in text_of(root) and "started by <@U1>" in text_of(root)
    wait_for("the input shapes on the root", lambda: "float32[" in text_of(team.slack.find("C1", root.ts)), 120)

    # Someone who may not steer clicks Approve: told why, ephemerally; nothing changes.
    click(team.url, action_id="approve", value=buttons(plan)["approve"], user="U9")
    told = wait_for("an ephemeral answer", lambda: [e for e in team.slack.ephemeral if e.get("user") == "U9"])
    assert "may steer this session" in told[0]["text"]
    assert team.session(sid).status == "awaiting"

    # Redirect through the modal: an empty one is refused inline, a real one re-plans.
    click(team.url, action_id="redirect", value=buttons(plan)["redirect"])
    view = wait_for("the redirect modal", lambda: list(team.slack.views.values()))[-1]
    status, body = submit_view(team.url, view, {"instructions": {"text": {"type": "plain_text_input", "value": " "}}})
    assert body["response_action"] == "errors" and "instructions" in body["errors"]
    status, body = submit_view(team.url, view, {"instructions": {"text": {"type": "plain_text_input",
                                                                          "value": "rows 64"}}})
    assert status == 200 and not body
    before = len(team.thread(sid))
    replanned = team.card(sid, "approve", after=before)
    answered = wait_for("the answered plan", lambda: "Redirected by <@U1>" in text_of(team.slack.find("C1", plan.ts))
                        and team.slack.find("C1", plan.ts))
    assert not buttons(answered) and "rows 64" in text_of(answered)
    assert "rows 64" in text_of(replanned)

    # Talk in the thread is left alone; a reply that mentions the bot redirects (Slack retries the delivery:
    # handled once), recorded without the mention.
    event(team.url, {"type": "message", "channel": "C1", "user": "U1", "text": "rows 32 might be better",
                     "ts": f"{time.time():.6f}", "thread_ts": root.ts})
    reply_event = {"type": "message", "channel": "C1", "user": "U1", "text": f"<@{BOT_USER}> rows 32",
                   "ts": f"{time.time():.6f}", "thread_ts": root.ts}
    event(team.url, reply_event, event_id="EvReply1")
    event(team.url, reply_event, event_id="EvReply1")
    noted = wait_for("the bot saying it took the reply", lambda: [
        m for m in team.thread(sid) if "Taking <@U1>'s reply as a redirect" in text_of(m)])
    assert len(noted) == 1
    plan3 = team.card(sid, "approve", after=len(team.thread(sid)) - 1)
    assert "rows 32" in text_of(plan3)

    # A stale button (the first plan's) changes nothing.
    click(team.url, action_id="approve", value=first_plan["approve"])
    wait_for("the stale click's answer", lambda: [e for e in team.slack.ephemeral if e.get("user") == "U1"
                                                  and "moved on" in e["text"]])

    # Approve: one progress message edited through the stages, the kernel and its profile trace in one message,
    # the result card with the chart inside it.
    click(team.url, action_id="approve", value=buttons(plan3)["approve"], user="U1")
    result = team.card(sid, "iterate")
    thread = team.thread(sid)
    names = [[team.slack.files[f]["name"] for f in m.files] for m in thread if m.files]
    assert len(names) == 1 and len(names[0]) == 2 and names[0][0].startswith("candidate_")
    assert names[0][0].endswith(".py") and names[0][1] == names[0][0].replace(".py", ".trace.json")
    chart = next(b["slack_file"]["id"] for b in result.blocks if b["type"] == "image")
    assert team.slack.files[chart]["content"][:8] == b"\x89PNG\r\n\x1a\n"
    assert not any(chart in m.files for m in thread)  # shown in the card, posted nowhere
    progress = [m for m in thread if (m.metadata or {}).get("event_payload", {}).get("key", "").startswith(
        "progress:")]
    assert len(progress) == 1
    # Its last edit comes at the end of the notifier's batch, just after the result card's post.
    done = wait_for("the progress message finished", lambda: "evaluated: ok" in text_of(
        team.slack.find("C1", progress[0].ts)) and team.slack.find("C1", progress[0].ts))
    assert done.edits >= 2
    card = text_of(result)
    assert "Result: ok" in card and " estimated" in card and "of what the chip allows" in card
    assert "bound" in card and "correctness: passed" in card
    wait_for("Approved by <@U1>", lambda: "Approved by <@U1>" in text_of(team.slack.find("C1", plan3.ts)))

    # Iterate: a new plan, and once approved the next kernel with its diff against the first and its trace.
    click(team.url, action_id="iterate", value=buttons(result)["iterate"])
    plan4 = team.card(sid, "approve", after=len(team.thread(sid)))
    click(team.url, action_id="approve", value=buttons(plan4)["approve"])
    result = team.card(sid, "iterate", after=len(team.thread(sid)))
    diffs = [f for m in team.thread(sid) for f in m.files if team.slack.files[f]["name"].endswith(".diff")]
    assert len(diffs) == 1 and b"+++ kernel_v2.py" in team.slack.files[diffs[0]]["content"]
    (second,) = [m for m in team.thread(sid) if diffs[0] in m.files]
    assert len(second.files) == 3  # the kernel, its diff and its trace in one message
    assert len([m for m in team.thread(sid) if "progress:" in str(m.metadata)]) == 2  # one per cycle

    # Hand off to Auto: one progress message edited per iteration, then the summary as a new reply.
    click(team.url, action_id="handoff", value=buttons(result)["handoff"])
    summary = wait_for("Auto's summary", lambda: next(
        (m for m in team.thread(sid) if "Auto finished" in text_of(m) and buttons(m)), None), timeout=180)
    assert set(buttons(summary)) <= {"adopt", "search", "handback"} and "handback" in buttons(summary)
    auto = [m for m in team.thread(sid) if (m.metadata or {}).get("event_payload", {}).get("key") == "auto"]
    assert len(auto) == 1
    assert "stopped: iterations" in text_of(summary)
    # Edits come at the end of the notifier's batch, just after the summary's post. A batch sends only the last
    # edit of a message, so how many edits it took depends on how the iterations fell into batches: at least one.
    finished = wait_for("Auto's progress message finished", lambda: "finished" in text_of(
        team.slack.find("C1", auto[0].ts)) and team.slack.find("C1", auto[0].ts))
    assert finished.edits >= 1 and finished.text.startswith("Auto iteration")
    wait_for("the root saying so", lambda: "Auto finished" in text_of(team.slack.find("C1", root.ts)))
    wait_for("the answered result", lambda: "Handed off to Auto by <@U1>" in text_of(team.slack.find("C1", result.ts)))
    with Session(team.server.engine) as s:
        decisions = s.exec(select(Decision).where(Decision.session_id == sid).order_by(col(Decision.id))).all()
        assert [d.action for d in decisions] == ["redirect", "redirect", "approve", "iterate", "approve", "handoff"]
    keys = [(m.metadata or {}).get("event_payload", {}).get("key") for m in team.thread(sid) if m.metadata]
    assert len(keys) == len(set(keys))  # nothing posted twice


@pytest.mark.slow
def test_cancel_from_the_plan_card(team: Team) -> None:
    sid = _session_id(command(team.url, "new layer_norm --brain offline", fake=team.slack)[1])
    plan = team.card(sid, "approve")
    click(team.url, action_id="cancel", value=buttons(plan)["cancel"])
    wait_for("the cancelled root", lambda: "cancelled by <@U1>" in text_of(team.slack.find("C1", team.root(sid).ts)))
    assert team.session(sid).status == "cancelled"
    wait_for("Cancelled by <@U1>", lambda: "Cancelled by <@U1>" in text_of(team.slack.find("C1", plan.ts)))
