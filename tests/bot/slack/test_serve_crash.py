"""A real `kernelbot serve` killed (SIGKILL) right after Slack stored one of its posts and before it could record
it: started again, it finds its own post by the message's metadata and posts nothing twice; every event is
delivered, in order per thread."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlmodel import Session, select

from storage import sessions
from storage.connect import open_database
from storage.models import EventDelivery, SlackMessage
from storage.settings import load_settings
from tests.fakes.slack_api import BOT_TOKEN, FakeSlack, Message, fake_slack
from tests.support.reading import keys
from tests.support.slack_http import SECRET, free_port


def _serve(home: Path, fake: FakeSlack, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERNELBOT_", "SLACK_", "ANTHROPIC_"))}
    env.update({"KERNELBOT_HOME": str(home), "SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_SIGNING_SECRET": SECRET,
                "KERNELBOT_SLACK_API_URL": fake.base_url, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"})
    kernelbot = str(Path(sys.executable).parent / "kernelbot")
    with log.open("ab") as out:
        return subprocess.Popen([kernelbot, "serve", "--http", "--host", "127.0.0.1", "--port", str(free_port())],
                                env=env, stdout=out, stderr=subprocess.STDOUT)




@pytest.mark.slow
def test_serve_killed_between_posting_and_recording_posts_nothing_twice(tmp_path: Path) -> None:
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path)})
    engine = open_database(settings)
    expected: dict[str, list[str]] = {}
    with Session(engine) as s, s.begin():
        for channel in ("C1", "C2"):
            record = sessions.create_session(s, mode="auto", task="softmax", target="v6e", owner="U1",
                                             slack_channel=channel)
            sessions.add_event(s, session_id=record.id, kind="session_started", payload={})
            expected[record.id] = ["root"]
            for i in range(4):
                event = sessions.add_event(s, session_id=record.id, kind="job_failed",
                                           payload={"kind": "auto_session", "reason": f"failure {i}"})
                expected[record.id].append(f"event:{event.id}")

    with fake_slack() as fake:
        victim: dict[str, subprocess.Popen[bytes] | None] = {"process": None}
        posts = {"count": 0}

        def kill_on_the_third_post(message: Message) -> None:  # stored by Slack; the answer never arrives
            posts["count"] += 1
            process = victim["process"]
            if posts["count"] == 3 and process is not None:
                os.kill(process.pid, signal.SIGKILL)

        fake.after_post = kill_on_the_third_post
        log = tmp_path / "serve.log"
        first = victim["process"] = _serve(tmp_path, fake, log)
        assert first.wait(timeout=60) == -signal.SIGKILL
        victim["process"] = None
        with Session(engine) as s:
            recorded = len(s.exec(select(SlackMessage)).all())
        stored = sum(len(m) for m in fake.messages.values())
        assert stored >= 3 and recorded < stored  # the third post reached Slack; its recording never happened

        second = _serve(tmp_path, fake, log)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with Session(engine) as s:
                    pending = s.exec(select(EventDelivery).where(EventDelivery.status == "delivered")).all()
                if len(pending) == sum(len(v) for v in expected.values()):
                    break
                time.sleep(0.2)
            else:
                raise AssertionError(f"not everything was delivered:\n{log.read_text()[-3000:]}")
        finally:
            second.send_signal(signal.SIGTERM)
            assert second.wait(timeout=30) == 0
    for session_id, order in expected.items():
        with Session(engine) as s:
            record = sessions.get_session(s, session_id=session_id)
        assert keys(fake.thread(str(record.slack_channel), str(record.slack_thread_ts))) == order
    assert sum(len(m) for m in fake.messages.values()) == sum(len(v) for v in expected.values())
