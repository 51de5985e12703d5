"""Block Kit rendering for session threads: within Slack's limits, buttons bound to their step."""

from __future__ import annotations

import json

from bot.blocks import (
    MAX_BLOCKS,
    SECTION_LIMIT,
    answered,
    plan_message,
    progress_text,
    result_card,
    session_root,
    split_text,
)


def _texts(payload: dict) -> list[str]:
    return [b["text"]["text"] for b in payload["blocks"] if b["type"] == "section"]


def test_long_text_is_split_at_line_ends_within_the_section_limit() -> None:
    text = "\n".join(f"line {i} " + "x" * 90 for i in range(200))
    pieces = split_text(text)
    assert all(len(p) <= SECTION_LIMIT for p in pieces) and len(pieces) > 1
    assert "".join(p + "\n" for p in pieces).rstrip("\n") == text
    assert all(len(p) <= SECTION_LIMIT for p in split_text("y" * 10_000))  # one line longer than a section


def test_a_plan_has_the_four_buttons_bound_to_its_step() -> None:
    payload = plan_message(session_id="s1", step=3, plan="## Analysis\nmemory-bound")
    actions = next(b for b in payload["blocks"] if b["type"] == "actions")
    assert [e["action_id"] for e in actions["elements"]] == ["approve", "redirect", "handoff", "cancel"]
    assert all(json.loads(e["value"]) == {"session": "s1", "step": 3} for e in actions["elements"])


def test_a_huge_plan_stays_within_the_block_limit() -> None:
    payload = plan_message(session_id="s1", step=1, plan="\n".join("z" * 2900 for _ in range(80)))
    assert len(payload["blocks"]) <= MAX_BLOCKS
    assert all(len(t) <= SECTION_LIMIT for t in _texts(payload))


def test_an_answered_message_loses_its_buttons_and_says_who_and_when() -> None:
    payload = answered(plan_message(session_id="s1", step=1, plan="p"), decision="approved", user="U1",
                       at=1796000000.0)
    assert not any(b["type"] == "actions" for b in payload["blocks"])
    assert "Approved by <@U1> at" in json.dumps(payload)


def test_result_card_root_and_progress() -> None:
    card = result_card(session_id="s1", step=5, outcome={"verdict": "ok", "message": "ok: x1.5", "speedup": 1.5,
                                                          "method": "estimated"})
    assert "*Result: ok*  x1.50 (estimated)" in _texts(card)[0]
    assert [e["action_id"] for e in card["blocks"][-1]["elements"]] == ["iterate", "redirect", "handoff", "finish"]
    root = session_root(session_id="s1", task="softmax", target="v6e", mode="hitl", owner="U1", status="planning")
    assert "status: planning" in json.dumps(root) and "<@U1>" in json.dumps(root)
    assert progress_text("correctness") == "queued → compiling → *testing* → profiling"
