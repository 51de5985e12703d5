"""`/kernel digest subscribe|unsubscribe` through the real Bolt app, with the scheduler and the notifier running:
a channel that subscribes gets the next digest without a restart, one that unsubscribes (even one the settings
list) gets no more, a mistyped word gets the closest, and `/kernel digest` says where digests go without naming a
private channel to those not in it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from slack_sdk import WebClient
from sqlmodel import Session, select

from bot.slack.app import build_app
from bot.slack.outbound.digest import digest_ops
from bot.slack.outbound.notifier import Notifier
from bot.slack.outbound.sender import SlackSender
from bot.slack.scheduler import KernelScheduler
from bot.slack.visibility import ChannelDirectory
from storage.connect import open_database
from storage.models import DigestRun, DigestSubscription
from storage.settings import load_settings
from tests.fakes.slack_api import BOT_TOKEN, FakeSlack, fake_slack
from tests.support.reading import wait_for
from tests.support.slack_http import SECRET, command, served


def _digests_posted(fake: FakeSlack, channel: str) -> int:
    return sum(1 for m in fake.messages.get(channel, []) if m.text.startswith("Kernel digest"))


def test_subscribe_and_unsubscribe_take_effect_at_the_next_digest_without_a_restart(tmp_path: Path) -> None:
    with fake_slack() as fake:
        fake.add_channel("CNEW", members=("UANA", "UEVE"))
        fake.add_channel("CENV", members=("UANA",))
        fake.add_channel("GTEAM", private=True, members=("UANA",))
        fake.add_channel("GNOBOT", private=True, members=("UANA",), bot=False)
        settings = load_settings({"KERNELBOT_HOME": str(tmp_path), "SLACK_BOT_TOKEN": BOT_TOKEN,
                                  "SLACK_SIGNING_SECRET": SECRET, "KERNELBOT_SLACK_API_URL": fake.base_url,
                                  "KERNELBOT_DIGEST_CHANNELS": "CENV", "KERNELBOT_DIGEST_CRON": "* * * * * *"})
        engine = open_database(settings)
        client = WebClient(token=BOT_TOKEN, base_url=fake.base_url, retry_handlers=[], timeout=5)
        notifier = Notifier(engine, SlackSender(client), poll_seconds=0.2, digest_ops=digest_ops)
        worker = threading.Thread(target=notifier.run, daemon=True)
        scheduler = KernelScheduler(settings, engine, visibility=ChannelDirectory(client))
        worker.start()
        try:
            with served(build_app(settings, engine, notify=notifier.notify)) as url:
                def reply(text: str, channel: str, user: str = "UANA") -> str:
                    status, body = command(url, text, fake=fake, user=user, channel=channel)
                    assert status == 200
                    return body["text"]

                where = reply("digest", "CNEW")
                assert where.startswith("The daily digest goes out at `* * * * * *` (UTC), next ")
                assert "to <#CENV> (KERNELBOT_DIGEST_CHANNELS). This channel does not get it." in where
                assert "to <#CENV> (KERNELBOT_DIGEST_CHANNELS)" in reply("digest list", "CNEW")
                assert "Did you mean `subscribe`?" in reply("digest subscrbe", "CNEW")
                assert "Did you mean `unsubscribe`?" in reply("digest unsubscibe", "CNEW")
                refused = reply("digest subscribe", "GNOBOT")
                assert "/invite @kernelbot" in refused and "This channel was not subscribed." in refused

                scheduler.start()  # serving, with the settings' channel only
                wait_for("the digest in CENV", lambda: _digests_posted(fake, "CENV") >= 1, timeout=10.0)
                assert _digests_posted(fake, "CNEW") == 0

                subscribed = reply("digest subscribe", "CNEW", user="UEVE")
                assert subscribed.startswith("This channel now gets the daily digest at `* * * * * *` (UTC)")
                wait_for("the digest in CNEW", lambda: _digests_posted(fake, "CNEW") >= 1,
                         timeout=10.0)  # the next fire, no restart
                assert "already gets the daily digest" in reply("digest subscribe", "CNEW")
                assert reply("digest subscribe", "GTEAM").startswith("This channel now gets")  # private, the bot in it

                left = reply("digest unsubscribe", "CENV")
                assert left == ("This channel no longer gets the daily digest. KERNELBOT_DIGEST_CHANNELS lists it; "
                                "this holds over that list. `/kernel digest subscribe` brings it back.")
                assert reply("digest unsubscribe", "CNEW").startswith("This channel no longer gets the daily digest.")
                assert "nothing was changed" in reply("digest unsubscribe", "CNEW")

                # Who is not in the private channel sees that one gets digests, not which.
                outsider = reply("digest", "CNEW", user="UEVE")
                assert "to 1 private channel(s) you are not in. This channel does not get it." in outsider
                assert "GTEAM" not in outsider and "CENV" not in outsider
                assert "to <#GTEAM> (subscribed by <@UANA> " in reply("digest", "GTEAM")

                time.sleep(1.1)  # a fire that was under way when they unsubscribed may still record its digest
                with Session(engine) as s:
                    before = {c: len(s.exec(select(DigestRun).where(DigestRun.channel == c)).all())
                              for c in ("CENV", "CNEW")}
                time.sleep(1.6)  # at least one fire since
                with Session(engine) as s:
                    after = {c: len(s.exec(select(DigestRun).where(DigestRun.channel == c)).all())
                             for c in ("CENV", "CNEW")}
                    rows = {r.channel: (r.subscribed, r.changed_by) for r in s.exec(select(DigestSubscription))}
                    assert s.exec(select(DigestRun).where(DigestRun.channel == "GTEAM")).first() is not None
                assert after == before  # no digest since, for either
                assert rows == {"CNEW": (False, "UANA"), "CENV": (False, "UANA"), "GTEAM": (True, "UANA")}
        finally:
            scheduler.stop()
            notifier.close()
            worker.join(10)
