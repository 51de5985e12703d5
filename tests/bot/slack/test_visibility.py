"""Who may see a session and where: the rule (pure), Slack's answers read through the fake Slack with a cache and
hiding when Slack cannot answer; and through the real Bolt app, a private channel's session hidden from an
outsider in `/kernel list`, `status`, `show`, the App Home and another channel's digest, shown to a member."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from slack_sdk import WebClient
from sqlalchemy import Engine
from sqlmodel import Session

from bot.slack.app import build_app
from bot.slack.visibility import ChannelDirectory, ChannelFacts, audience, visible
from storage.connect import open_database
from storage.models import KernelSession, Step, now
from storage.settings import load_settings
from tests.fakes.slack_api import BOT_TOKEN, FakeSlack, fake_slack
from tests.support.reading import wait_for
from tests.support.slack_http import SECRET, command, event, served

PUBLIC = ChannelFacts(private=False)
PRIVATE = ChannelFacts(private=True, members=frozenset({"UANA", "UBOB"}))


@pytest.mark.parametrize("channel, facts, viewer, where, shown", [
    # A person's own place (the App Home): public to all, private to members, unknown to nobody.
    ("CPUB", PUBLIC, "UEVE", None, True),
    ("GPRIV", PRIVATE, "UANA", None, True),
    ("GPRIV", PRIVATE, "UEVE", None, False),
    ("GPRIV", None, "UANA", None, False),  # Slack could not say: hidden
    ("CPUB", None, "UANA", None, False),
    (None, None, "UEVE", None, True),  # started from a terminal: public
    # A channel's listing or digest (no one viewer): its own sessions and public ones, never another private one.
    ("GPRIV", PRIVATE, None, "GPRIV", True),
    ("GPRIV", None, None, "GPRIV", True),  # its own channel needs no lookup
    ("GPRIV", PRIVATE, None, "COTHER", False),
    ("CPUB", PUBLIC, None, "GPRIV", True),
    ("CPUB", None, None, "COTHER", False),
    (None, None, None, "COTHER", True),
    # A person's answer in a channel is fit for everyone there: whoever asked in GPRIV is in it.
    ("GPRIV", PRIVATE, "UANA", "COTHER", False),  # a member, but asked in another channel
    ("GPRIV", PRIVATE, "UANA", "GPRIV", True),
    ("GPRIV", None, "UANA", "GPRIV", True),  # Slack away: the channel's own sessions still show there
    ("CPUB", PUBLIC, "UEVE", "COTHER", True),
    ("GPRIV", PRIVATE, None, None, False),  # no one in particular, nowhere in particular: public only
])
def test_the_rule(channel: str | None, facts: ChannelFacts | None, viewer: str | None, where: str | None,
                  shown: bool) -> None:
    assert visible(channel, facts, viewer=viewer, where=where) is shown


def test_without_slack_only_own_and_terminal_sessions_show() -> None:
    shown = audience(None, where="C1")
    assert shown("C1") and shown(None) and not shown("C2")
    assert not audience(None, viewer="U1")("C1")


def test_the_directory_reads_slack_caches_and_hides_when_slack_cannot_answer() -> None:
    with fake_slack() as fake:
        fake.add_channel("CPUB", members=("UANA",))
        fake.add_channel("GPRIV", private=True, members=("UANA", "UBOB"))
        fake.add_channel("GNOBOT", private=True, members=("UANA",), bot=False)
        client = WebClient(token=BOT_TOKEN, base_url=fake.base_url, retry_handlers=[])
        directory = ChannelDirectory(client)
        assert directory.facts("CPUB") == PUBLIC
        assert directory.facts("GPRIV") == ChannelFacts(private=True, members=frozenset({"UANA", "UBOB", "UBOT"}))
        assert directory.facts("GNOBOT") is None  # a private channel the bot is not in does not exist for it
        asked = len(fake.calls)
        assert directory.allows("GPRIV", viewer="UBOB", where=None)
        assert not directory.allows("GPRIV", viewer="UEVE", where=None)
        assert len(fake.calls) == asked  # from the cache

        fake.down = True  # Slack away: what was never answered stays hidden
        fresh = ChannelDirectory(client)
        assert fresh.facts("CPUB") is None and not fresh.allows("CPUB", viewer="UANA", where=None)
        fake.down = False
        assert fresh.facts("CPUB") is None  # a failure is remembered for a little while, not asked at every line
        fresh.ttl_seconds = 0.0
        assert fresh.facts("CPUB") == PUBLIC


# -- through the Slack app --------------------------------------------------------------------------------------
@dataclass
class Served:
    url: str
    fake: FakeSlack
    engine: Engine


@pytest.fixture
def served_app(tmp_path: Path) -> Iterator[Served]:
    with fake_slack() as fake:
        fake.add_channel("CPUB", members=("UANA", "UEVE"))
        fake.add_channel("GSECRET", private=True, members=("UANA",))
        settings = load_settings({"KERNELBOT_HOME": str(tmp_path), "SLACK_BOT_TOKEN": BOT_TOKEN,
                                  "SLACK_SIGNING_SECRET": SECRET, "KERNELBOT_SLACK_API_URL": fake.base_url,
                                  "KERNELBOT_STEERERS": "anyone"})
        engine = open_database(settings)
        at = now()
        with Session(engine) as s, s.begin():
            s.add(KernelSession(id="secret1", mode="hitl", task="gelu", target="v6e", owner="UANA",
                                status="awaiting", slack_channel="GSECRET", slack_thread_ts="1796000001.000100",
                                created_at=at, updated_at=at))
            s.add(Step(session_id="secret1", index=1, kind="plan", status="done", outputs={"plan": "tile rows"}))
            s.add(KernelSession(id="public1", mode="auto", task="softmax", target="v6e", owner="UEVE",
                                status="active", slack_channel="CPUB", slack_thread_ts="1796000002.000200",
                                created_at=at - 1, updated_at=at - 1))
            s.add(KernelSession(id="terminal1", mode="search", task="matmul", target="v6e", status="done",
                                created_at=at - 2, updated_at=at - 2))
        with served(build_app(settings, engine)) as url:
            yield Served(url, fake, engine)


def _reply(app: Served, text: str, *, user: str, channel: str) -> str:
    status, body = command(app.url, text, fake=app.fake, user=user, channel=channel)
    assert status == 200
    return body["text"]


def test_a_private_channels_session_is_hidden_from_an_outsider_and_shown_to_a_member(served_app: Served) -> None:
    app = served_app
    outsider = _reply(app, "list", user="UEVE", channel="CPUB")
    assert "public1" in outsider and "terminal1" in outsider and "secret1" not in outsider
    assert "secret1" not in _reply(app, "status", user="UEVE", channel="CPUB")
    assert "public1" in _reply(app, "status", user="UEVE", channel="CPUB")
    assert _reply(app, "show secret1", user="UEVE", channel="CPUB") == _reply(
        app, "show nosuch1", user="UEVE", channel="CPUB").replace("nosuch1", "secret1")  # as if there were none
    assert _reply(app, "cancel secret1", user="UEVE", channel="CPUB") == _reply(
        app, "cancel nosuch1", user="UEVE", channel="CPUB").replace("nosuch1", "secret1")

    member = _reply(app, "list", user="UANA", channel="GSECRET")
    assert "secret1" in member and "public1" in member
    assert "secret1" in _reply(app, "status", user="UANA", channel="GSECRET")
    shown = _reply(app, "show secret1", user="UANA", channel="GSECRET")
    assert "`secret1`" in shown and "1. plan" in shown
    # A member asking in another channel: the answer appears there, so the private session stays out of it.
    assert "secret1" not in _reply(app, "list", user="UANA", channel="CPUB")

    for user in ("UEVE", "UANA"):
        assert event(app.url, {"type": "app_home_opened", "user": user, "tab": "home"})[0] == 200
    wait_for("both App Homes", lambda: {"UEVE", "UANA"} <= set(app.fake.home), timeout=10.0)
    outsider_home, member_home = json.dumps(app.fake.home["UEVE"]), json.dumps(app.fake.home["UANA"])
    assert "public1" in outsider_home and "secret1" not in outsider_home
    assert "secret1" in member_home and "Review the plan" in member_home


def test_another_channels_digest_leaves_a_private_channels_session_out(served_app: Served) -> None:
    app = served_app
    elsewhere = _reply(app, "digest preview", user="UEVE", channel="CPUB")
    assert "Waiting for a decision" not in elsewhere and "secret1" not in elsewhere
    own = _reply(app, "digest preview", user="UANA", channel="GSECRET")
    assert "*Waiting for a decision (1)*" in own and "secret1" in own

