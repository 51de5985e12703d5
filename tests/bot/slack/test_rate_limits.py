"""Slack's 429s: the listeners' own calls (views.publish, usergroups.users.list, ...) wait out Retry-After and
succeed, while the notifier's client does not retry inside a call (it pauses the channel itself)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.slack.app import notifier_client
from bot.slack.outbound.sender import ChannelPacer, SlackSender, SlackUnavailable
from tests.support.bot import Served, bot_app
from tests.support.reading import wait_for
from tests.support.slack_http import command, event


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Served]:
    with bot_app(tmp_path / "home", KERNELBOT_STEERERS="S1") as served:
        served.fake.throttle_retry_after = 0  # Slack says at least 1 s; 0 keeps the tests quick, the path is one
        served.fake.usergroups = {"S1": ["U5"]}
        yield served


def test_the_app_home_is_published_after_a_429(app: Served) -> None:
    app.fake.throttle["views.publish"] = 1
    event(app.url, {"type": "app_home_opened", "user": "U1", "channel": "D1", "tab": "home"})
    home = wait_for("the published home", lambda: app.fake.home.get("U1"), timeout=10)
    assert home["type"] == "home" and app.fake.rate_limited == 1
    assert [m for m, _ in app.fake.calls].count("views.publish") == 2  # refused once, then taken


def test_a_user_group_is_read_after_a_429_and_its_member_may_steer(app: Served) -> None:
    started = command(app.url, "new softmax --brain offline", fake=app.fake)[1]["text"]
    session_id = re.search(r"`([0-9a-f]{12})`", started).group(1)  # type: ignore[union-attr]
    app.fake.throttle["usergroups.users.list"] = 1
    answer = command(app.url, f"cancel {session_id}", fake=app.fake, user="U5")[1]["text"]
    assert answer == f"Cancelled session `{session_id}`."  # U5 steers as a member of S1, read after the 429
    assert app.fake.rate_limited == 1


def test_the_notifier_gets_the_429_back_at_once_to_pause_the_channel(app: Served) -> None:
    app.fake.throttle_retry_after = 7
    app.fake.throttle["chat.postMessage"] = 1
    sender = SlackSender(notifier_client(app.settings), ChannelPacer(100.0, 100))
    started = time.monotonic()
    with pytest.raises(SlackUnavailable) as raised:
        sender.post(channel="C1", thread_ts=None, payload={"text": "hello"}, scope="session:x", key="root")
    assert raised.value.retry_after == 7 and time.monotonic() - started < 1.0  # no sleep inside the call
