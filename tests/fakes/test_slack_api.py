"""The fake Slack Web API behaves as the real client expects: threads, edits, limits, 429s, files, metadata."""

from __future__ import annotations

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler

from tests.fakes.slack_api import BOT_TOKEN, Message, fake_slack


def test_threads_edits_metadata_and_the_bots_own_messages() -> None:
    with fake_slack() as fake:
        client = WebClient(token=BOT_TOKEN, base_url=fake.base_url)
        assert client.auth_test()["user_id"] == "UBOT"
        root = client.chat_postMessage(channel="C1", text="session s1", metadata={
            "event_type": "kernelbot_event", "event_payload": {"event_id": 7}})
        reply = client.chat_postMessage(channel="C1", text="plan", thread_ts=root["ts"])
        client.chat_update(channel="C1", ts=root["ts"], text="session s1: planning")
        assert [m.text for m in fake.thread("C1", root["ts"])] == ["session s1: planning", "plan"]
        replies = client.conversations_replies(channel="C1", ts=root["ts"], include_all_metadata=True)
        assert replies["messages"][0]["metadata"]["event_payload"] == {"event_id": 7}
        assert float(reply["ts"]) > float(root["ts"])
        fake.messages["C1"].append(Message(channel="C1", ts="1.000001", text="a person", user="U1"))
        with pytest.raises(SlackApiError, match="cant_update_message"):
            client.chat_update(channel="C1", ts="1.000001", text="edited")
        with pytest.raises(SlackApiError, match="invalid_auth"):
            WebClient(token="xoxb-wrong", base_url=fake.base_url).auth_test()


def test_limits_rate_limits_and_outages() -> None:
    with fake_slack() as fake:
        client = WebClient(token=BOT_TOKEN, base_url=fake.base_url)
        section = {"type": "section", "text": {"type": "mrkdwn", "text": "x"}}
        with pytest.raises(SlackApiError, match="invalid_blocks"):
            client.chat_postMessage(channel="C1", text="t", blocks=[section] * 51)
        with pytest.raises(SlackApiError, match="invalid_blocks"):
            client.chat_postMessage(channel="C1", text="t", blocks=[{**section, "text": {"type": "mrkdwn",
                                                                                          "text": "y" * 3001}}])
        for _ in range(fake.burst):
            client.chat_postMessage(channel="C2", text="ok")
        with pytest.raises(SlackApiError) as raised:
            client.chat_postMessage(channel="C2", text="one too many")
        assert raised.value.response.status_code == 429 and raised.value.response.headers["Retry-After"]
        patient = WebClient(token=BOT_TOKEN, base_url=fake.base_url,
                            retry_handlers=[RateLimitErrorRetryHandler(max_retry_count=3)])
        patient.chat_postMessage(channel="C2", text="after waiting")
        assert fake.messages["C2"][-1].text == "after waiting" and fake.rate_limited >= 2
        fake.down = True
        with pytest.raises(SlackApiError):
            client.chat_postMessage(channel="C3", text="while down")
        assert "C3" not in fake.messages


def test_files_upload_into_a_thread() -> None:
    with fake_slack() as fake:
        client = WebClient(token=BOT_TOKEN, base_url=fake.base_url)
        root = client.chat_postMessage(channel="C1", text="session")
        client.files_upload_v2(channel="C1", thread_ts=root["ts"], content="def computation(x):\n    return x\n",
                               filename="kernel.py", title="kernel", initial_comment="the kernel")
        (posted,) = [m for m in fake.thread("C1", root["ts"]) if m.files]
        assert fake.files[posted.files[0]]["content"].startswith(b"def computation")
