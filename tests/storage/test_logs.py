"""Logs: every line names the job and session it belongs to, in text or JSON, and never carries a secret."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator

import pytest

from storage.logs import HANDLER_NAME, configure_logging, log_context, redact
from storage.settings import load_settings

TOKEN = "xoxb-1234-abcdef-secret"


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    level, root_level = logging.getLogger("kernelbot").level, logging.getLogger().level
    yield
    root = logging.getLogger()
    root.setLevel(root_level)
    for handler in [h for h in root.handlers if h.get_name() == HANDLER_NAME]:
        root.removeHandler(handler)
    logging.getLogger("kernelbot").setLevel(level)


def _configured(**env: str) -> io.StringIO:
    stream = io.StringIO()
    configure_logging(load_settings({"SLACK_BOT_TOKEN": TOKEN, "ANTHROPIC_API_KEY": "plain-key-9876", **env}),
                      default_level="info", stream=stream)
    return stream


def test_lines_carry_the_job_and_session_and_no_secret() -> None:
    stream = _configured()
    log = logging.getLogger("kernelbot.test")
    with log_context(job=12, session="3f2a"):
        log.info("posting with %s and plain-key-9876 to postgresql://bob:hunter2@db/kb", TOKEN)
        with log_context(channel="C1"):
            log.warning("nested")
    log.info("outside")
    lines = stream.getvalue().splitlines()
    assert "[job=12 session=3f2a]" in lines[0] and "INFO kernelbot.test" in lines[0]
    assert TOKEN not in lines[0] and "plain-key-9876" not in lines[0] and "hunter2" not in lines[0]
    assert lines[0].count("[redacted]") == 3
    assert "[job=12 session=3f2a channel=C1]" in lines[1]
    assert "[" not in lines[2].split("kernelbot.test", 1)[1]


def test_json_lines_and_tracebacks_are_redacted_too() -> None:
    stream = _configured(KERNELBOT_LOG_FORMAT="json")
    try:
        raise RuntimeError(f"Slack said no to {TOKEN}")
    except RuntimeError:
        with log_context(session="s1"):
            logging.getLogger("kernelbot.test").exception("it failed")
    record = json.loads(stream.getvalue())
    assert record["session"] == "s1" and record["level"] == "error" and "it failed" in record["message"]
    assert "Traceback" in record["message"] and TOKEN not in record["message"]


def test_context_is_per_thread_and_levels_follow_the_settings() -> None:
    stream = _configured(KERNELBOT_LOG_LEVEL="warning")
    log = logging.getLogger("kernelbot.test")

    def other() -> None:
        log.warning("from another thread")

    with log_context(job=1):
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        log.info("dropped at warning level")
    assert stream.getvalue().count("\n") == 1 and "job=" not in stream.getvalue()


def test_token_shapes_are_redacted_whatever_their_source() -> None:
    assert redact("xapp-1-A0-123 and sk-ant-api03-abc_DEF and xoxp-9-9") == "[redacted] and [redacted] and [redacted]"
