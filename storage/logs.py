"""Logging for every process: one line an event (or one JSON object), each carrying the job and session it
belongs to, and never a secret. Entry points call `configure_logging`; code that works for a job or a session
wraps that work in `log_context(job=..., session=...)` and everything logged inside (in this thread) says so."""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import re
import sys
import time
from collections.abc import Iterator
from typing import Any

from storage.settings import Settings

_CONTEXT: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar("kernelbot_log_context",
                                                                                       default=())
# Tokens and keys by their shape, whatever their source (a traceback, a URL, an echoed request).
_SECRET_SHAPES = re.compile(r"\b(xox[abposr]-[A-Za-z0-9-]+|xapp-[A-Za-z0-9-]+|sk-ant-[A-Za-z0-9_-]+)")
_URL_PASSWORD = re.compile(r"(://[^:/@\s]+:)[^@\s]+@")
REDACTED = "[redacted]"
HANDLER_NAME = "kernelbot"


@contextlib.contextmanager
def log_context(**ids: Any) -> Iterator[None]:
    """Everything logged in this block (in this thread) names these ids, e.g. job=12 session=3f2a."""
    merged = {**dict(_CONTEXT.get()), **{k: str(v) for k, v in ids.items() if v is not None}}
    token = _CONTEXT.set(tuple(merged.items()))
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    text = _SECRET_SHAPES.sub(REDACTED, text)
    return _URL_PASSWORD.sub(rf"\g<1>{REDACTED}@", text)


class _Formatter(logging.Formatter):
    def __init__(self, *, as_json: bool, secrets: tuple[str, ...]):
        super().__init__()
        self.as_json, self.secrets = as_json, secrets

    def format(self, record: logging.LogRecord) -> str:
        ids = dict(_CONTEXT.get())
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        if self.as_json:
            line = json.dumps({"ts": stamp, "level": record.levelname.lower(), "logger": record.name, **ids,
                               "message": message})
        else:
            where = " ".join(f"{k}={v}" for k, v in ids.items())
            line = f"{stamp} {record.levelname} {record.name}{f' [{where}]' if where else ''}: {message}"
        return redact(line, self.secrets)


def secrets_of(settings: Settings) -> tuple[str, ...]:
    values = (settings.slack_bot_token, settings.slack_app_token, settings.slack_signing_secret,
              settings.anthropic_api_key)
    return tuple(v for v in values if v and len(v) >= 6)


def configure_logging(settings: Settings | None, *, default_level: str = "warning", stream: Any = None) -> None:
    """Send every logger's records to stderr (or `stream`) in the configured format, at the configured level
    (the entry point's default otherwise)."""
    level = ((settings.log_level if settings else None) or default_level).upper()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_Formatter(as_json=bool(settings and settings.log_format == "json"),
                                    secrets=secrets_of(settings) if settings else ()))
    handler.set_name(HANDLER_NAME)
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == HANDLER_NAME]:  # ours from an earlier call only
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)  # libraries stay quiet unless something is wrong
    logging.getLogger("kernelbot").setLevel(level)  # every logger of ours is kernelbot.*
