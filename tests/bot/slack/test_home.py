"""The App Home: plain words, an "Open thread" button per session and a button that says what waits, within a
Home tab's limits (the pure builder); and through the real Bolt app, the view app_home_opened publishes and the
click of a link button acked."""

from __future__ import annotations

import json
import time
from pathlib import Path

from sqlmodel import Session

from bot.slack.app import build_app
from bot.slack.views.home import HOME_BLOCKS, HomeSession, build_home
from storage.connect import open_database
from storage.models import KernelSession, Step, now
from storage.settings import load_settings
from tests.fakes.slack_api import BOT_TOKEN, fake_slack
from tests.support.slack_http import SECRET, click, event, served

THREAD = "1796000001.000100"
URL = "https://slack.com/archives/C1/p1796000001000100"


def _item(sid: str, mode: str = "hitl", status: str = "awaiting", *, waiting: str | None = None,
          thread: str | None = THREAD) -> HomeSession:
    return HomeSession(sid, mode, "softmax", "v6e", status, "U1", "C1", thread, waiting)


def _sections(view: dict) -> list[dict]:
    return [b for b in view["blocks"] if b["type"] == "section"]


def test_the_home_has_buttons_that_say_what_waits_and_open_threads_in_plain_words() -> None:
    pending = [_item("plan1", waiting="await_approval"), _item("result1", waiting="await_decision")]
    recent = [_item("plan1"), _item("other1"), _item("auto1", "auto", "active"),
              _item("search1", "search", "done", thread=None), _item("gone1", "auto", "cancelled"),
              _item("bad1", "search", "failed")]
    view = build_home(user="U1", recent=recent, pending=pending)
    by_id = {b["text"]["text"].split("`")[1]: b for b in _sections(view) if b["text"]["text"].startswith("`")}
    waiting = [b for b in _sections(view) if "accessory" in b][:2]
    assert [(b["accessory"]["text"]["text"], b["accessory"]["url"]) for b in waiting] == [
        ("Review the plan", URL), ("Decide on the result", URL)]
    assert waiting[0]["text"]["text"] == ("`plan1` HITL (step by step) on *softmax* (v6e): waiting for you: a plan "
                                          "to approve")
    assert "waiting for you: a result to decide on" in waiting[1]["text"]["text"]
    # The recent sessions, each with its status in words and a button to its thread when it has one.
    assert "HITL (step by step) on *softmax* (v6e): waiting for you" in by_id["plan1"]["text"]["text"]
    assert by_id["other1"]["text"]["text"].endswith(": waiting for a decision")  # not this person's to take
    assert "Auto on *softmax* (v6e): running" in by_id["auto1"]["text"]["text"]
    assert "Search on *softmax* (v6e): finished" in by_id["search1"]["text"]["text"]
    assert by_id["gone1"]["text"]["text"].endswith(": cancelled") and by_id["bad1"]["text"]["text"].endswith(": failed")
    assert "accessory" not in by_id["search1"]  # no thread yet: no button
    assert by_id["auto1"]["accessory"]["text"]["text"] == "Open thread" and by_id["auto1"]["accessory"]["url"] == URL
    text = json.dumps(view)
    assert "hitl" not in text.replace("home_open", "") and "awaiting" not in text and "await_" not in text
    ids = [b["accessory"]["action_id"] for b in _sections(view) if "accessory" in b]
    assert len(ids) == len(set(ids)) == 7  # unique: plan1 is both waiting and recent


def test_a_crowded_home_stays_within_a_home_tabs_limits() -> None:
    pending = [_item(f"p{i}", waiting="await_decision") for i in range(300)]
    recent = [_item(f"r{i}", "auto", "done") for i in range(15)]
    view = build_home(user="U1", recent=recent, pending=pending)
    assert len(view["blocks"]) <= HOME_BLOCKS
    assert any(b["type"] == "context" and b["elements"][0]["text"].startswith("…and 280 more")
               for b in view["blocks"])
    assert view["blocks"][-1]["text"]["text"].startswith("`r14`")  # the last recent session is still there
    assert all(len(b["accessory"]["url"]) <= 3000 for b in view["blocks"] if "accessory" in b)
    huge = build_home(user="U1", recent=[], pending=[HomeSession(
        "x1", "hitl", "t", "v6e", "awaiting", "U1", "C" * 3000, THREAD, "await_decision")])
    assert "accessory" not in _sections(huge)[1]  # a url Slack would refuse is left out


def test_opening_the_home_publishes_the_buttons_and_a_click_on_one_is_acked(tmp_path: Path) -> None:
    with fake_slack() as fake:
        settings = load_settings({"KERNELBOT_HOME": str(tmp_path), "SLACK_BOT_TOKEN": BOT_TOKEN,
                                  "SLACK_SIGNING_SECRET": SECRET, "KERNELBOT_SLACK_API_URL": fake.base_url})
        engine = open_database(settings)
        with Session(engine) as s, s.begin():
            s.add(KernelSession(id="plan1", mode="hitl", task="softmax", target="v6e", owner="U1", status="awaiting",
                                slack_channel="C1", slack_thread_ts=THREAD, updated_at=now()))
            s.add(Step(session_id="plan1", index=1, kind="plan", status="done", outputs={"plan": "tile rows"}))
        with served(build_app(settings, engine)) as url:
            assert event(url, {"type": "app_home_opened", "user": "U1", "tab": "home"})[0] == 200
            deadline = time.monotonic() + 10
            while "U1" not in fake.home and time.monotonic() < deadline:
                time.sleep(0.05)
            buttons = [b["accessory"] for b in fake.home["U1"]["blocks"] if "accessory" in b]
            assert [(b["text"]["text"], b["url"]) for b in buttons] == [("Review the plan", URL), ("Open thread", URL)]
            for b in buttons:  # Slack sends the click of a link button too: it must be acked, not refused
                assert click(url, action_id=b["action_id"], value=b["value"])[0] == 200
