"""Block Kit rendering for session threads: within Slack's limits, buttons bound to their step."""

from __future__ import annotations

import json

import pytest

from bot.slack.outbound.event_data import evaluation_outcome
from bot.slack.outbound.thread_ops import Card, EventView, SessionView, ops_for
from bot.slack.views.home import HomeSession, build_home
from bot.slack.views.kit import MAX_BLOCKS, SECTION_LIMIT, split_text
from bot.slack.views.session import (
    answered,
    auto_progress,
    auto_summary,
    parameter_fields,
    plan_message,
    progress_message,
    progress_text,
    result_card,
    search_progress,
    search_summary,
    session_root,
)
from bot.speedup import evaluation_speedup
from storage.models import Evaluation

# An estimate whose likely range includes 1 (no clear gain), and one whose whole range is a gain.
UNCLEAR = {"speedup": 1.04, "method": "estimated", "band": [0.9, 1.2]}
CLEAR = {"speedup": 2.0, "method": "estimated", "band": [1.6, 2.5]}


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
    stamp = next(b for b in payload["blocks"] if b["type"] == "context")["elements"][0]["text"]
    # Slack's date format: each reader sees their own time zone; UTC where a client cannot format it.
    assert stamp == "Approved by <@U1>, <!date^1796000000^{date_short_pretty} at {time}|2026-11-30 00:53 UTC>"


def test_result_card_root_and_progress() -> None:
    card = result_card(session_id="s1", step=5, outcome={"verdict": "ok", "message": "ok: x1.5", "speedup": 1.5,
                                                          "method": "estimated"})
    assert "*Result: ok*  x1.50 estimated" in _texts(card)[0]
    assert [e["action_id"] for e in card["blocks"][-1]["elements"]] == ["iterate", "redirect", "handoff", "finish"]
    root = session_root(session_id="s1", task="softmax", target="v6e", mode="hitl", owner="U1", status="planning")
    assert "status: planning" in json.dumps(root) and "<@U1>" in json.dumps(root)
    assert progress_text("correctness") == "implemented → compiling → *testing* → profiling"


_CARDS = {
    "result card": lambda o: result_card(session_id="s1", step=5, outcome={"verdict": "ok", **o}),
    "auto summary": lambda o: auto_summary(session_id="s1", step=7, outcome={
        "verdict": "ok", "improved": True, "evaluations": 3, "stop_reason": "plateau", **o}),
    "search summary": lambda o: search_summary(outcome={"improved": True, "evaluations": 6, "duplicates": 1, **o}),
}


@pytest.mark.parametrize("card", sorted(_CARDS))
def test_an_estimates_likely_range_is_on_the_card_and_a_range_holding_1_is_no_clear_gain(card: str) -> None:
    unclear = _CARDS[card](UNCLEAR)
    text = _texts(unclear)[0]
    assert "x1.04 estimated, likely x0.90-x1.20: no clear gain" in text
    assert "no clear gain" in unclear["text"]  # the notification says so too
    clear = _texts(_CARDS[card](CLEAR))[0]
    assert "x2.00 estimated, likely x1.60-x2.50" in clear and "no clear gain" not in clear
    measured = _texts(_CARDS[card]({"speedup": 2.1, "method": "measured", "band": None}))[0]
    assert "x2.10 measured" in measured and "likely" not in measured


def test_the_cards_outcome_carries_the_band_of_the_stored_result_or_of_the_step() -> None:
    result = {"verdict": "ok", "performance": {"speedup": 1.04, "method": "estimated", "band": [0.9, 1.2],
                                               "candidate": 1.0, "reference": 1.04}}
    assert evaluation_outcome({"verdict": "ok"}, result)["band"] == [0.9, 1.2]
    assert evaluation_outcome({"verdict": "ok", **CLEAR}, None)["band"] == [1.6, 2.5]  # no stored result
    old = {"verdict": "ok", "performance": {"speedup": 1.5, "method": "estimated"}}  # stored before bands
    assert evaluation_outcome({"verdict": "ok"}, old)["band"] is None


def _finished(kind: str, payload: dict, card: Card | None = None) -> EventView:
    session = SessionView(id="s1", mode="search" if kind == "search_finished" else "auto", status="done",
                          task="softmax", target="v6e", owner="U1")
    return EventView(id=1, kind=kind, payload=payload, at=0.0, session=session, card=card)


def _root_status(ops: list) -> str:
    return json.dumps(next(op for op in ops if getattr(op, "key", "") == "root").payload)


def test_the_roots_last_status_gives_the_best_kernels_range() -> None:
    unclear = {"evaluations": 6, "best_speedup": 1.04, "best_method": "estimated", "best_band": [0.9, 1.2]}
    ops = ops_for(_finished("search_finished", unclear, Card("summary", 0, outcome={"improved": True, **UNCLEAR})))
    assert "search finished after 6 evaluation(s): best x1.04 estimated, likely x0.90-x1.20: no clear gain" \
        in _root_status(ops)
    clear = {"evaluations": 2, "best_speedup": 2.0, "best_method": "estimated", "best_band": [1.6, 2.5],
             "best_candidate_id": None}
    status = _root_status(ops_for(_finished("hitl_finished", clear)))
    assert "best x2.00 estimated, likely x1.60-x2.50" in status and "no clear gain" not in status
    old = _root_status(ops_for(_finished("hitl_finished", {"best_speedup": 2.0})))  # an event from before bands
    assert "finished: best x2.00" in old


def test_the_app_home_shows_the_best_kernels_range() -> None:
    def shown(result: dict | None) -> str:
        e = Evaluation(task="softmax", target="v6e", verdict="ok", stage="done", speedup=1.04, method="estimated",
                       result=result)
        home = build_home(user="U1", recent=[HomeSession("s1", "auto", "softmax", "v6e", "done", "U1", None, None,
                                                         best=evaluation_speedup(e))], pending=[])
        return json.dumps(home)

    assert "best x1.04 estimated, likely x0.90-x1.20: no clear gain" in shown({"performance": {"band": [0.9, 1.2]}})
    clear = shown({"performance": {"band": [1.01, 1.1]}})
    assert "likely x1.01-x1.10" in clear and "no clear gain" not in clear
    assert "best x1.04 estimated" in shown(None) and "likely" not in shown(None)  # a row from before bands


def _cancel(payload: dict) -> dict | None:
    return next((e for b in payload["blocks"] if b["type"] == "actions" for e in b["elements"]
                 if e["action_id"] == "cancel"), None)


def test_every_running_sessions_message_has_a_cancel_button_that_asks_first_and_finished_ones_have_none() -> None:
    running = {
        "plan card": plan_message(session_id="s1", step=3, plan="## Analysis\nx"),
        "cycle": progress_message(title="Kernel v1", stage="compile", session_id="s1"),
        "auto": auto_progress(session_id="s1", iteration=1, max_iterations=3, doing="planning", evaluations=0,
                              best=""),
        "search": search_progress(evaluations=1, budget=4, best="", session_id="s1"),
    }
    for name, payload in running.items():
        cancel = _cancel(payload)
        assert cancel is not None, name
        assert cancel["style"] == "danger" and json.loads(cancel["value"])["session"] == "s1"
        ask = cancel["confirm"]
        assert ask["text"]["text"] == "Cancel session `s1`? The work so far is kept; the runner stops.", name
        assert ask["style"] == "danger" and ask["confirm"]["text"] and ask["deny"]["text"]
        assert len(ask["title"]["text"]) <= 100 and len(ask["confirm"]["text"]) <= 30
    finished = {
        "cycle evaluated": progress_message(title="Kernel v1", stage="compile", done="evaluated: ok",
                                            session_id="s1"),
        "cycle of a cancelled session": progress_message(title="Kernel v1", stage="compile", session_id="s1",
                                                         running=False),
        "auto": auto_progress(session_id="s1", iteration=3, max_iterations=3, doing="finished", evaluations=3,
                              best="", running=False),
        "search": search_progress(evaluations=4, budget=4, best="", session_id="s1", running=False),
    }
    assert [name for name, payload in finished.items() if _cancel(payload)] == []
    assert not any(b["type"] == "actions" for p in finished.values() for b in p["blocks"])


def _plan(params: dict) -> str:
    return ("## Analysis\nmemory-bound\n\n## Tiling and memory\n32 rows per block.\n"
            f"Parameters: {json.dumps(params, sort_keys=True)}\n\n## Pipelining\noverlapped")


def test_a_plans_parameters_are_fields_in_words_and_not_a_json_line_in_its_text() -> None:
    payload = plan_message(session_id="s1", step=2, plan=_plan({"BLOCK_ROWS": 32, "VMEM_LIMIT_BYTES": 64 * 2**20}))
    shown = json.dumps(payload)
    assert "67108864" not in shown and "Parameters:" not in shown and "VMEM_LIMIT_BYTES" not in shown
    head = payload["blocks"][0]
    assert head["text"]["text"] == "*Plan*"
    assert [f["text"] for f in head["fields"]] == [
        "*Block*\n32 rows x all columns", "*VMEM limit*\n64 MiB", "*Buffering*\ndouble-buffered (Pallas' default)",
        "*Grid*\nrow and column blocks, all in parallel"]
    text = _texts(payload)[1]
    assert "*Tiling and memory*\n32 rows per block.\n\n*Pipelining*" in text  # the plan reads on without the line
    plain = plan_message(session_id="s1", step=2, plan="## Analysis\nno parameters line")  # an LLM's plan
    assert "fields" not in plain["blocks"][0] and "no parameters line" in _texts(plain)[0]


def test_a_matmuls_parameters_read_as_words() -> None:
    assert parameter_fields({"ACC_DTYPE": "bfloat16", "BLOCK_K": 512, "BLOCK_M": 256, "BLOCK_N": 1024,
                             "BUFFERS": 1, "FUSE_EPILOGUE": False, "VMEM_LIMIT_BYTES": 100 * 2**20,
                             "UNROLL": True}) == [
        "*Block (M x N x K)*\n256 x 1024 x 512", "*VMEM limit*\n100 MiB", "*Buffering*\nsingle-buffered",
        "*Epilogue*\nrun by XLA after the kernel", "*Accumulator*\nbfloat16",
        "*Grid*\nM and N blocks in parallel; K blocks last, in order (the accumulator's)", "*UNROLL*\ntrue"]
    assert parameter_fields({"BLOCK_Q": 128, "BLOCK_KV": 256, "BUFFERS": 2})[:2] == [
        "*Block (query x key)*\n128 x 256", "*Buffering*\ndouble-buffered"]


def test_the_root_keeps_the_mode_it_started_in_and_names_the_current_one() -> None:
    handed = session_root(session_id="s1", task="softmax", target="v6e", mode="auto", owner="U1", status="x",
                          started_mode="hitl")
    first = handed["blocks"][0]["text"]["text"]
    assert first.startswith("*HITL session* `s1`") and first.endswith("(now in Auto)")
    assert handed["text"].startswith("HITL session s1") and "now in Auto" in handed["text"]
    same = session_root(session_id="s1", task="softmax", target="v6e", mode="search", owner="U1", status="x",
                        started_mode="search")
    assert same["blocks"][0]["text"]["text"].startswith("*Search session*") and "now in" not in json.dumps(same)


def _event(kind: str, payload: dict, *, mode: str = "hitl", status: str = "awaiting", **view: object) -> EventView:
    session = SessionView(id="s1", mode=mode, status=status, task="softmax", target="v6e", owner="U1",
                          search_budget=4)
    return EventView(id=1, kind=kind, payload=payload, at=0.0, session=session, **view)  # type: ignore[arg-type]


def _shown(ops: list, key: str) -> dict:
    return next(op.payload for op in ops if getattr(op, "key", "") == key)


def test_running_messages_lose_their_cancel_button_when_the_session_ends() -> None:
    step = {"kind": "implement", "candidate_id": 7}
    assert _cancel(_shown(ops_for(_event("step", step, anchor=7, version=1)), "progress:7"))
    assert not _cancel(_shown(ops_for(_event("step", step, status="cancelled", anchor=7, version=1)), "progress:7"))
    cancel = {"action": "cancel", "actor": "U1", "answers": 4}
    cycle = _shown(ops_for(_event("decision", cancel, status="cancelled", anchor=7, version=1)), "progress:7")
    assert not _cancel(cycle) and "cancelled by <@U1>" in _texts(cycle)[0]
    assert not [op for op in ops_for(_event("decision", cancel, status="cancelled")) if "progress" in op.key]
    auto = _shown(ops_for(_event("decision", cancel, mode="auto", status="cancelled")), "auto")
    assert not any(b["type"] == "actions" for b in auto["blocks"]) and "cancelled by <@U1>" in _texts(auto)[0]
    assert _cancel(_shown(ops_for(_event("session_started", {}, mode="search", status="active")), "progress:search"))
    finished = ops_for(_event("search_finished", {"evaluations": 2}, mode="search", status="cancelled",
                              card=Card("summary", 0, outcome={"improved": False})))
    assert not any(b["type"] == "actions" for b in _shown(finished, "progress:search")["blocks"])


def test_a_search_summary_says_the_moves_beyond_the_chips_vmem_apart_from_its_evaluations() -> None:
    with_refused = _texts(search_summary(outcome={"improved": False, "evaluations": 2, "duplicates": 0,
                                                  "infeasible": 1, "reason": "budget spent"}))[0]
    assert "2 evaluation(s), 0 duplicate(s) skipped, 1 move(s) beyond the chip's VMEM not counted; budget spent" \
        in with_refused
    assert "VMEM" not in _texts(search_summary(outcome={"improved": False, "evaluations": 2, "duplicates": 0}))[0]
