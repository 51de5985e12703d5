"""The notifier: session events shown in their threads through the real slack_sdk client against the fake Slack,
paced within its limits, every event once and in order per thread through a 429 storm, an outage and a lost
answer; messages edited in place; what Slack refuses for good is skipped without holding the rest back."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slack_sdk import WebClient
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from agents.commands import decide
from bot.slack.outbound.notifier import Notifier
from bot.slack.outbound.sender import ChannelPacer, SlackSender
from storage import sessions
from storage.connect import open_database
from storage.engine import make_engine
from storage.migrate import upgrade
from storage.models import EventDelivery, KernelSession, SessionEvent, SlackMessage
from storage.settings import Settings, load_settings
from tests.fakes.slack_api import BOT_TOKEN, FakeSlack, Message, fake_slack
from tests.storage.conftest import fresh_database_url
from tests.support import hitl_script
from tests.support.reading import keys, text_of


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with fake_slack() as fake:
        yield fake


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings({"KERNELBOT_HOME": str(tmp_path)})


@pytest.fixture
def engine(settings: Settings) -> Engine:
    return open_database(settings)


def notifier(engine: Engine, slack: FakeSlack, pacer: ChannelPacer | None = None) -> Notifier:
    client = WebClient(token=BOT_TOKEN, base_url=slack.base_url, retry_handlers=[], timeout=5)
    return Notifier(engine, SlackSender(client, pacer or ChannelPacer()), poll_seconds=0.05)




def thread_of(engine: Engine, slack: FakeSlack, session_id: str) -> list[Message]:
    with Session(engine) as s:
        record = sessions.get_session(s, session_id=session_id)
    assert record.slack_thread_ts, "the root was never posted"
    return slack.thread(str(record.slack_channel), record.slack_thread_ts)




def test_a_hitl_thread_shows_the_plan_then_the_kernel_the_progress_and_the_result(
        engine: Engine, settings: Settings, slack: FakeSlack, tmp_path: Path) -> None:
    sid = hitl_script.start(engine, channel="C1")
    hitl_script.machine(engine, settings, tmp_path / "k").run(sid)
    n = notifier(engine, slack)
    assert n.drain(30)
    thread = thread_of(engine, slack, sid)
    root, plan = thread[0], thread[1]
    assert root.thread_ts is None and "softmax" in root.text and "started by <@U1>" in text_of(root)
    assert "waiting for approval of the plan" in text_of(root) and root.edits >= 1
    buttons = [e["action_id"] for b in plan.blocks if b["type"] == "actions" for e in b["elements"]]
    assert buttons == ["approve", "redirect", "handoff", "cancel"] and "*Plan*" in text_of(plan)

    decide(engine, session_id=sid, actor="U2", action="approve", via="button")
    hitl_script.machine(engine, settings, tmp_path / "k").run(sid)
    assert n.drain(30)
    thread = thread_of(engine, slack, sid)
    answered = slack.find("C1", plan.ts)
    assert answered is not None and not any(b["type"] == "actions" for b in answered.blocks)
    assert "Approved by <@U2>, <!date^" in text_of(answered)  # in each reader's time zone
    files = [[slack.files[f]["name"] for f in m.files] for m in thread if m.files]
    assert files == [["candidate_1.py", "candidate_1.trace.json"]]  # the kernel and its profile, as evaluated
    kernel = next(f for m in thread for f in m.files if slack.files[f]["name"] == "candidate_1.py")
    assert b"pallas_call" in slack.files[kernel]["content"]
    progress = next(m for m in thread if (m.metadata or {}).get("event_payload", {}).get("key", "").startswith(
        "progress:"))
    assert progress.edits >= 1 and "evaluated: ok: x2.00" in text_of(progress)  # edited through to the verdict
    shown = [json.dumps(args.get("blocks")) for method, args in slack.calls if method in ("chat.postMessage",
                                                                                          "chat.update")]
    assert any("Kernel v1: *implemented*" in b for b in shown)  # the code exists before its file comes
    card = thread[-1]
    assert "Result: ok" in text_of(card) and "x2.00 estimated" in text_of(card)
    assert "passed (4/4 cases" in text_of(card) and "100% of what the chip allows" in text_of(card)
    assert "memory-bound" in text_of(card)
    assert [e["action_id"] for b in card.blocks if b["type"] == "actions" for e in b["elements"]] == [
        "iterate", "redirect", "handoff", "finish"]
    assert "waiting for a decision on the result" in text_of(slack.find("C1", root.ts))
    with Session(engine) as s:  # every event delivered exactly once
        delivered = s.exec(select(EventDelivery)).all()
        assert {d.status for d in delivered} == {"delivered"}
        assert len(delivered) == len(s.exec(select(SessionEvent)).all())
    assert len(set(keys(thread))) == len(thread)


def _sessions_with_notices(engine: Engine, channels: list[str], per_session: int) -> dict[str, list[str]]:
    """Sessions whose events each post a new message (runner failures): the order to find in each thread."""
    expected: dict[str, list[str]] = {}
    with Session(engine) as s, s.begin():
        for i, channel in enumerate(channels):
            record = sessions.create_session(s, mode="auto", task="softmax", target="v6e", owner="U1",
                                             slack_channel=channel)
            sessions.add_event(s, session_id=record.id, kind="session_started",
                               payload={"mode": "auto", "task": "softmax", "target": "v6e", "owner": "U1"})
            expected[record.id] = ["root"]
            for j in range(per_session):
                event = sessions.add_event(s, session_id=record.id, kind="job_failed",
                                           payload={"kind": "auto_session", "reason": f"failure {i}.{j}"})
                expected[record.id].append(f"event:{event.id}")
    return expected


def _check_threads(engine: Engine, slack: FakeSlack, expected: dict[str, list[str]]) -> None:
    for sid, order in expected.items():
        posted = keys(thread_of(engine, slack, sid))
        assert posted == order, f"session {sid}: {posted} != {order}"


def test_a_429_storm_delivers_every_event_once_and_in_order(engine: Engine, slack: FakeSlack) -> None:
    slack.burst, slack.per_second = 2, 20.0
    expected = _sessions_with_notices(engine, ["C1", "C1", "C2"], per_session=6)
    # A notifier that paces far above what the fake allows meets 429s and honours their Retry-After.
    n = notifier(engine, slack, ChannelPacer(per_second=1000.0, burst=1000))
    assert n.drain(60)
    assert slack.rate_limited > 0
    _check_threads(engine, slack, expected)
    assert sum(len(v) for v in expected.values()) == sum(len(m) for m in slack.messages.values())


def test_pacing_keeps_within_the_channel_rate_without_a_single_429(engine: Engine, slack: FakeSlack) -> None:
    slack.burst, slack.per_second = 3, 10.0
    expected = _sessions_with_notices(engine, ["C1"], per_session=8)
    n = notifier(engine, slack, ChannelPacer(per_second=10.0, burst=3))
    assert n.drain(60)
    assert slack.rate_limited == 0
    _check_threads(engine, slack, expected)


def test_an_outage_loses_nothing_and_delivery_resumes_in_order(engine: Engine, slack: FakeSlack) -> None:
    slack.down = True
    expected = _sessions_with_notices(engine, ["C1", "C2"], per_session=3)
    n = notifier(engine, slack, ChannelPacer(per_second=1000.0, burst=1000))
    thread = threading.Thread(target=n.run, daemon=True)
    thread.start()
    time.sleep(1.5)
    with Session(engine) as s:
        assert not s.exec(select(EventDelivery).where(EventDelivery.status != "pending")).all()
        attempts = max(d.attempts for d in s.exec(select(EventDelivery)).all())
    assert attempts >= 2  # it kept trying
    slack.down = False
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not n.idle():
        time.sleep(0.1)
    n.close()
    _check_threads(engine, slack, expected)


def test_a_post_whose_answer_was_lost_is_found_again_and_not_posted_twice(engine: Engine, slack: FakeSlack) -> None:
    lost = {"count": 0}

    def lose_answer(message: Message) -> None:  # the post is stored, then the connection drops
        if lost["count"] < 2:
            lost["count"] += 1
            raise ConnectionAbortedError("answer lost")

    slack.after_post = lose_answer
    expected = _sessions_with_notices(engine, ["C1"], per_session=3)
    n = notifier(engine, slack, ChannelPacer(per_second=1000.0, burst=1000))
    assert n.drain(60)
    assert lost["count"] == 2
    _check_threads(engine, slack, expected)
    with Session(engine) as s:
        rows = s.exec(select(SlackMessage)).all()
        assert len(rows) == len({(r.scope, r.key) for r in rows}) == sum(len(v) for v in expected.values())



def test_a_root_is_recorded_with_its_thread_or_not_at_all(engine: Engine, slack: FakeSlack) -> None:
    """The database refuses to start the session's thread right after Slack stored the root (as a crash there
    would): the root's post is not recorded either, so the retry finds the root by its metadata, starts the
    thread, and the events go into it - not to the channel, as when the root was recorded alone (seen in CI)."""
    expected = _sessions_with_notices(engine, ["C1"], per_session=2)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TRIGGER refuse_thread BEFORE UPDATE OF slack_thread_ts ON sessions "
                             "BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END")
    n = notifier(engine, slack, ChannelPacer(per_second=1000.0, burst=1000))
    thread = threading.Thread(target=n.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not slack.messages.get("C1"):
        time.sleep(0.02)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TRIGGER refuse_thread")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not n.idle():
        time.sleep(0.1)
    n.close()
    _check_threads(engine, slack, expected)
    assert len(slack.messages["C1"]) == len(next(iter(expected.values())))  # the root once, nothing top-level

def test_what_slack_refuses_for_good_is_skipped_and_the_rest_delivered(engine: Engine, slack: FakeSlack) -> None:
    slack.archived = {"C_OLD"}
    expected = _sessions_with_notices(engine, ["C_OLD", "C1"], per_session=2)
    n = notifier(engine, slack)
    assert n.drain(30)
    old, fine = list(expected)
    _check_threads(engine, slack, {fine: expected[fine]})
    with Session(engine) as s:
        events = s.exec(select(SessionEvent.id).where(SessionEvent.session_id == old)).all()
        failed = s.exec(select(EventDelivery).where(col(EventDelivery.event_id).in_(events))).all()
        assert {(d.status, d.last_error) for d in failed} == {("failed", "is_archived")}


def test_long_plans_are_split_within_slacks_limits(engine: Engine, slack: FakeSlack) -> None:
    with Session(engine) as s, s.begin():
        record = sessions.create_session(s, mode="hitl", task="softmax", target="v6e", owner="U1",
                                         slack_channel="C1")
        sessions.add_event(s, session_id=record.id, kind="session_started", payload={})
        plan = "\n".join(f"- point {i}: " + "z" * 200 for i in range(400))  # ~80 kB of plan
        step = sessions.add_step(s, session_id=record.id, kind="plan", outputs={"plan": plan})
        sessions.add_event(s, session_id=record.id, kind="hitl_paused",
                           payload={"stop_reason": "await_approval", "awaits_step": step.index})
        sid = record.id
    assert notifier(engine, slack).drain(30)
    thread = thread_of(engine, slack, sid)
    card = thread[-1]
    assert 1 < len(card.blocks) <= 50 and card.blocks[-1]["type"] == "actions"  # the buttons survive
    assert all(len(b["text"]["text"]) <= 3000 for b in card.blocks if b["type"] == "section")
    assert "full text is in the attached file" in text_of(card)
    full = next(f for m in thread for f in m.files if slack.files[f]["name"] == "plan_step1.md")
    assert slack.files[full]["content"].decode() == plan


@pytest.mark.parametrize("kind", ["postgresql"])
def test_delivery_on_postgresql(kind: str, tmp_path: Path, slack: FakeSlack) -> None:
    for url in fresh_database_url(kind, tmp_path):
        settings = load_settings({"KERNELBOT_HOME": str(tmp_path), "KERNELBOT_DATABASE_URL": url})
        upgrade(make_engine(url))
        engine = open_database(settings)
        expected = _sessions_with_notices(engine, ["C1", "C2"], per_session=3)
        assert notifier(engine, slack, ChannelPacer(per_second=1000.0, burst=1000)).drain(30)
        _check_threads(engine, slack, expected)
        with Session(engine) as s:
            assert all(r.slack_thread_ts for r in s.exec(select(KernelSession)).all())
        engine.dispose()


def test_a_compile_failure_is_fixed_without_asking_and_shown_as_it_happens(
        engine: Engine, settings: Settings, slack: FakeSlack, tmp_path: Path) -> None:
    from agents.auto import StageCallback
    from tpu_runner.reports import EvalError, EvalResult, failure

    calls = {"n": 0}

    def fails_first(path: Path, on_stage: StageCallback | None = None) -> EvalResult:
        calls["n"] += 1
        time.sleep(1.0)  # an evaluation takes a while: long enough for the thread to show each state
        if calls["n"] > 1:
            return hitl_script.replayed(path, on_stage)
        for stage in ("static", "lower", "compile"):
            if on_stage:
                on_stage(stage)
        return failure(task="softmax", target="v6e", host="cpu", stage="compile",
                       error=EvalError("vmem_oom", "scoped VMEM: 40 MiB needed, 32 MiB allowed"))

    sid = hitl_script.start(engine, channel="C1")
    hitl = hitl_script.machine(engine, settings, tmp_path / "k")
    hitl.evaluate = fails_first
    hitl.run(sid)
    decide(engine, session_id=sid, actor="U1", action="approve", via="button")
    slack.burst = 100
    n = notifier(engine, slack, ChannelPacer(per_second=1000.0, burst=1000))
    thread = threading.Thread(target=n.run, daemon=True)
    thread.start()  # delivering while the machine works, as serve does
    hitl.run(sid)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not n.idle():
        time.sleep(0.05)
    n.close()
    edits = [json.dumps(args.get("blocks")) for method, args in slack.calls if method == "chat.update"]
    assert any("fixing vmem_oom error 1/3" in e for e in edits)
    # Each kernel comes with its evaluation: the failed one alone, the fix with its diff and its profile.
    names = [[slack.files[f]["name"] for f in m.files] for m in thread_of(engine, slack, sid) if m.files]
    assert names == [["candidate_1.py"], ["candidate_2.py", "candidate_2.diff", "candidate_2.trace.json"]]
    card = thread_of(engine, slack, sid)[-1]
    assert "Result: ok" in text_of(card)


@pytest.mark.slow
def test_a_search_thread_counts_its_evaluations_and_ends_with_the_best_kernel(
        engine: Engine, settings: Settings, slack: FakeSlack) -> None:
    from agents.local import run_until_settled
    from agents.search import NODE_JOB, start_search
    from agents.search_decide import SearchConfig
    from tests.conftest import TASKS
    from tpu_runner.tasks import load_task

    with Session(engine) as s, s.begin():
        sid = start_search(s, task=load_task(TASKS / "softmax"), target="v6e", config=SearchConfig(budget=2),
                           seed_code=(TASKS / "softmax" / "solutions" / "pallas.py").read_text(), brain=None,
                           owner="U1", slack_channel="C1")
    assert run_until_settled(engine, settings, sid, kinds=(NODE_JOB,), workers=1) == "done"
    assert notifier(engine, slack, ChannelPacer(per_second=1000.0, burst=1000)).drain(30)
    thread = thread_of(engine, slack, sid)
    assert "*Search session*" in text_of(thread[0]) and "search finished" in text_of(thread[0])
    progress = next(m for m in thread if keys([m]) == ["progress:search"])
    assert "2/2 evaluations" in text_of(progress)
    summary = thread[-1]
    assert "Search finished" in text_of(summary) and "2 evaluation(s)" in text_of(summary)
    names = [slack.files[f]["name"] for m in thread for f in m.files]
    assert "best kernel x" in text_of(summary) and " estimated" in text_of(summary)  # the seed alone is x2
    best = next(f for m in thread for f in m.files if slack.files[f]["name"].startswith("best_candidate_"))
    assert b"pallas_call" in slack.files[best]["content"] and len(names) == 1


def test_a_search_threads_summary_and_root_give_the_best_kernels_likely_range(
        engine: Engine, slack: FakeSlack) -> None:
    from agents.search import stop_search
    from tests.support.stored_search import stored_search

    sid = stored_search(engine, owner="U1", slack_channel="C1")  # its best, x1.30, is likely x0.90-x1.80
    with Session(engine) as s, s.begin():
        stop_search(s, sid, "enough")
    assert notifier(engine, slack, ChannelPacer(per_second=1000.0, burst=1000)).drain(30)
    thread = thread_of(engine, slack, sid)
    summary = next(m for m in thread if "Search finished" in text_of(m))
    assert "best kernel x1.30 estimated, likely x0.90-x1.80: no clear gain" in text_of(summary)
    assert "search finished after 2 evaluation(s): best x1.30 estimated, likely x0.90-x1.80: no clear gain" \
        in text_of(thread[0])


PNG = b"\x89PNG\r\n\x1a\n"


def _images(message: Message) -> list[str]:
    return [b["slack_file"]["id"] for b in message.blocks if b["type"] == "image"]


def _two_evaluations(engine: Engine, settings: Settings, workdir: Path, channel: str = "C1") -> str:
    """A HITL session through two implement-evaluate cycles: plan, approve, result; iterate, approve, result."""
    sid = hitl_script.start(engine, channel=channel)
    hitl_script.through_first_result(engine, settings, workdir, sid)
    for action in ("iterate", "approve"):
        decide(engine, session_id=sid, actor="U1", action=action, via="button")
        hitl_script.machine(engine, settings, workdir).run(sid)
    return sid


def test_the_result_card_shows_its_chart_and_the_trace_comes_with_the_kernel(
        engine: Engine, settings: Settings, slack: FakeSlack, tmp_path: Path) -> None:
    slack.burst = 1000  # the pace is tested elsewhere
    sid = hitl_script.start(engine, channel="C1")
    hitl_script.through_first_result(engine, settings, tmp_path / "k", sid)
    assert notifier(engine, slack, ChannelPacer(per_second=1000.0, burst=1000)).drain(30)
    thread = thread_of(engine, slack, sid)
    card = thread[-1]
    assert keys([card]) == ["card:5"] and card.blocks[-1]["type"] == "actions"
    (chart,) = _images(card)
    assert slack.files[chart]["name"] == "profile_step5.png" and slack.files[chart]["content"][:8] == PNG
    assert not any(chart in m.files for m in slack.messages["C1"])  # uploaded for the card, shared nowhere
    image = next(b for b in card.blocks if b["type"] == "image")
    assert "profile chart" in image["alt_text"] and "x2.00 estimated" in image["alt_text"]
    kernel_id, trace_id = thread[-2].files  # the kernel and its trace, right above the card
    assert [slack.files[f]["name"] for f in (kernel_id, trace_id)] == ["candidate_1.py", "candidate_1.trace.json"]
    trace = json.loads(slack.files[trace_id]["content"])
    assert trace["otherData"]["task"] == "softmax" and trace["otherData"]["target"] == "v6e"
    assert {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"} == {1, 2, 3}
    assert not [f for m in thread for f in m.files if slack.files[f]["name"].endswith(".png")]

    decide(engine, session_id=sid, actor="U1", action="finish", via="button")
    assert notifier(engine, slack).drain(30)
    answered = slack.find("C1", card.ts)
    assert answered is not None and "Finished by <@U1>" in text_of(answered)
    assert _images(answered) == [chart]  # the answered card keeps its chart


def test_a_two_evaluation_session_posts_eight_replies_where_it_posted_ten(
        engine: Engine, settings: Settings, slack: FakeSlack, tmp_path: Path) -> None:
    """Per cycle: the plan, one progress message edited through its stages, one message with the evaluated
    kernel, its diff and its profile trace, and the card with the chart inside it (it was: plan, kernel and
    diff, progress, trace, card)."""
    slack.burst = 1000  # the pace is tested elsewhere
    sid = _two_evaluations(engine, settings, tmp_path / "k")
    assert notifier(engine, slack, ChannelPacer(per_second=1000.0, burst=1000)).drain(30)
    thread = thread_of(engine, slack, sid)
    names = [[slack.files[f]["name"] for f in m.files] for m in thread[1:]]
    assert names == [[], [], ["candidate_1.py", "candidate_1.trace.json"], [],
                     [], [], ["candidate_2.py", "candidate_2.diff", "candidate_2.trace.json"], []]
    assert [k for k in keys(thread[1:]) if not k.startswith("file:")] == [
        "card:1", "progress:1", "card:5", "card:7", "progress:2", "card:11"]
    assert len(thread) - 1 == 8
    progress = [slack.find("C1", m.ts) for m in thread if keys([m])[0].startswith("progress:")]
    assert ["Kernel v1: evaluated: ok" in text_of(progress[0]), "Kernel v2: evaluated: ok" in text_of(progress[1])] \
        == [True, True]
    assert all(len(_images(slack.find("C1", m.ts))) == 1 for m in thread if keys([m])[0] in ("card:5", "card:11"))


def test_a_files_message_whose_answer_was_lost_is_found_again_by_a_files_name_and_not_posted_twice(
        engine: Engine, settings: Settings, slack: FakeSlack, tmp_path: Path) -> None:
    slack.burst = 1000  # the pace is tested elsewhere
    lost: list[str] = []

    def lose_the_files_answer(message: Message) -> None:  # the kernel, diff and trace are stored, then the answer lost
        if len(message.files) == 3 and not lost:
            lost.append(message.ts)
            raise ConnectionAbortedError("answer lost")

    slack.after_post = lose_the_files_answer
    sid = _two_evaluations(engine, settings, tmp_path / "k")
    assert notifier(engine, slack, ChannelPacer(per_second=1000.0, burst=1000)).drain(60)
    assert lost
    thread = thread_of(engine, slack, sid)
    assert [[slack.files[f]["name"] for f in m.files] for m in thread if m.files] == [
        ["candidate_1.py", "candidate_1.trace.json"], ["candidate_2.py", "candidate_2.diff", "candidate_2.trace.json"]]
    assert sorted(stored["name"] for stored in slack.files.values() if stored["name"].startswith("candidate_2")) == [
        "candidate_2.diff", "candidate_2.py", "candidate_2.trace.json"]  # uploaded once
    assert len(thread) - 1 == 8


def test_a_kernel_cancelled_before_its_evaluation_still_comes_to_the_thread(
        engine: Engine, settings: Settings, slack: FakeSlack, tmp_path: Path) -> None:
    from agents.commands import cancel_session

    slack.burst = 1000  # the pace is tested elsewhere
    sid = hitl_script.start(engine, channel="C1")
    hitl = hitl_script.machine(engine, settings, tmp_path / "k")
    hitl.run(sid)
    decide(engine, session_id=sid, actor="U1", action="approve", via="button")

    def cancel_once_implemented(action: str, outputs: dict) -> None:
        if action == "implement":
            cancel_session(engine, session_id=sid, actor="U1")

    hitl.on_step = cancel_once_implemented
    hitl.run(sid)  # implements, then stops: cancelled before the evaluation
    assert notifier(engine, slack, ChannelPacer(per_second=1000.0, burst=1000)).drain(30)
    thread = thread_of(engine, slack, sid)
    (files,) = [m for m in thread if m.files]
    assert [slack.files[f]["name"] for f in files.files] == ["candidate_1.py"] and files is thread[-1]
    assert "Kernel v1, not evaluated (cancelled)" in files.text
    assert "cancelled" in text_of(slack.find("C1", thread[0].ts))


def test_a_chart_upload_is_recorded_so_a_retried_card_shows_it_without_uploading_it_again(
        engine: Engine, settings: Settings, slack: FakeSlack, tmp_path: Path) -> None:
    slack.burst = 1000  # the pace is tested elsewhere
    lost: list[str] = []

    def lose_the_cards_answer(message: Message) -> None:  # the card is stored, then the connection drops
        if _images(message) and not lost:
            lost.append(message.ts)
            raise ConnectionAbortedError("answer lost")

    slack.after_post = lose_the_cards_answer
    sid = hitl_script.start(engine, channel="C1")
    hitl_script.through_first_result(engine, settings, tmp_path / "k", sid)
    assert notifier(engine, slack, ChannelPacer(per_second=1000.0, burst=1000)).drain(60)
    assert lost
    charts = [f for f, stored in slack.files.items() if stored["name"] == "profile_step5.png"]
    cards = [m for m in thread_of(engine, slack, sid) if keys([m]) == ["card:5"]]
    assert len(charts) == 1 and len(cards) == 1 and _images(cards[0]) == charts


def test_a_picture_slack_is_still_processing_leaves_the_card_without_it_but_with_its_buttons(
        engine: Engine, settings: Settings, slack: FakeSlack, tmp_path: Path) -> None:
    slack.burst = 1000  # the pace is tested elsewhere
    slack.processing = True
    sid = hitl_script.start(engine, channel="C1")
    hitl_script.through_first_result(engine, settings, tmp_path / "k", sid)
    client = WebClient(token=BOT_TOKEN, base_url=slack.base_url, retry_handlers=[], timeout=5)
    sender = SlackSender(client, ChannelPacer(per_second=1000.0, burst=1000), processing_waits=(0.01, 0.01))
    assert Notifier(engine, sender, poll_seconds=0.05).drain(30)
    card = thread_of(engine, slack, sid)[-1]
    assert keys([card]) == ["card:5"] and not _images(card) and "Result: ok" in text_of(card)
    assert [e["action_id"] for e in card.blocks[-1]["elements"]] == ["iterate", "redirect", "handoff", "finish"]
    assert sum(method == "files.info" for method, _ in slack.calls) == 3  # a look, then one after each wait


def test_slack_refuses_an_image_of_a_file_it_does_not_hold(slack: FakeSlack) -> None:
    client = WebClient(token=BOT_TOKEN, base_url=slack.base_url, retry_handlers=[], timeout=5)
    unshared = client.files_upload_v2(filename="chart.png", content=PNG, title="chart")["files"][0]["id"]
    assert not slack.messages  # uploaded, shared nowhere

    def post(file_id: str) -> str:
        block = {"type": "image", "slack_file": {"id": file_id}, "alt_text": "chart"}
        try:
            return str(client.chat_postMessage(channel="C1", text="t", blocks=[block])["ok"])
        except Exception as exc:  # noqa: BLE001 - the error code is what is checked
            return str(getattr(exc, "response", {}).get("error"))

    assert post(unshared) == "True"
    assert post("F99999") == "invalid_blocks"


def test_the_owner_is_told_once_when_the_bot_is_removed_from_the_sessions_channel(
        engine: Engine, settings: Settings, slack: FakeSlack, tmp_path: Path) -> None:
    slack.burst = 1000  # the pace is tested elsewhere
    from tests.fakes.slack_api import BOT_USER

    channel = slack.add_channel("C7", members=("U1",))
    sid = hitl_script.start(engine, channel="C7")
    hitl_script.machine(engine, settings, tmp_path / "k").run(sid)
    assert notifier(engine, slack).drain(30)
    assert not slack.dm("U1")
    channel.members.discard(BOT_USER)  # someone removes the bot mid-session
    decide(engine, session_id=sid, actor="U1", action="approve", via="button")
    hitl_script.machine(engine, settings, tmp_path / "k").run(sid)
    assert notifier(engine, slack, ChannelPacer(per_second=1000.0, burst=1000)).drain(30)
    with Session(engine) as s:
        failed = s.exec(select(EventDelivery).where(EventDelivery.status == "failed")).all()
    assert len(failed) > 3 and {d.last_error for d in failed} == {"not_in_channel"}  # every event refused...
    (told,) = slack.dm("U1")  # ... and the owner told once
    assert "no longer a member of <#C7>" in text_of(told) and f"/kernel show {sid}" in text_of(told)
    assert "*softmax* on v6e" in text_of(told) and "`not_in_channel`" in text_of(told)
    assert "/invite @kernelbot" in text_of(told)

    decide(engine, session_id=sid, actor="U1", action="iterate", via="button")  # after a restart: still once
    hitl_script.machine(engine, settings, tmp_path / "k").run(sid)
    assert notifier(engine, slack, ChannelPacer(per_second=1000.0, burst=1000)).drain(30)
    assert len(slack.dm("U1")) == 1


def test_the_result_card_gives_the_estimates_likely_range(
        engine: Engine, settings: Settings, slack: FakeSlack, tmp_path: Path) -> None:
    from agents.auto import StageCallback
    from tpu_runner.reports import EvalResult

    def unclear(path: Path, on_stage: StageCallback | None = None) -> EvalResult:  # x1.04, likely x0.90-x1.20
        data = hitl_script.replayed(path, on_stage).to_json()
        data["performance"].update(speedup=1.04, reference=data["performance"]["candidate"] * 1.04, band=[0.9, 1.2])
        data["message"] = "ok: x1.04"
        return EvalResult.from_json(data)

    slack.burst = 1000
    sid = hitl_script.start(engine, channel="C1")
    hitl = hitl_script.machine(engine, settings, tmp_path / "k")
    hitl.evaluate = unclear
    hitl.run(sid)
    decide(engine, session_id=sid, actor="U1", action="approve", via="button")
    hitl.run(sid)
    assert notifier(engine, slack, ChannelPacer(per_second=1000.0, burst=1000)).drain(30)
    card = thread_of(engine, slack, sid)[-1]
    assert keys([card]) == ["card:5"]
    assert "*Result: ok*  x1.04 estimated, likely x0.90-x1.20: no clear gain" in text_of(card)
