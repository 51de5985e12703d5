"""Sending to Slack for the notifier: paced per channel, every failure sorted into "later" or "never", and the
bot's own posts found again by their metadata, so a crash between posting and recording a post posts nothing twice.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError

METADATA_TYPE = "kernelbot_post"
MAX_BACKOFF_SECONDS = 30.0
PROCESSING_WAITS = (0.25, 0.5, 1.0, 2.0)  # between looks at an unshared upload Slack is still processing
# ok=false answers that are about this one message: give up on it, go on with the next. Anything else that is
# ok=false (a revoked token, a missing scope) affects everything and is retried until an operator fixes it.
MESSAGE_ERRORS = frozenset({
    "invalid_blocks", "msg_blocks_too_long", "invalid_metadata_format", "invalid_metadata_schema", "no_text",
    "channel_not_found", "not_in_channel", "is_archived", "thread_not_found", "message_not_found",
    "cant_update_message", "edit_window_closed", "too_many_attachments", "file_not_found", "restricted_action",
})


class SlackUnavailable(Exception):
    """Try again later: rate-limited (429), Slack erroring (5xx) or unreachable. `retry_after` is Slack's own
    Retry-After when it gave one."""

    def __init__(self, reason: str, retry_after: float | None = None):
        super().__init__(reason)
        self.retry_after = retry_after


class SlackRejected(Exception):
    """Slack refused this message for good (`error` is its code): retrying the same call cannot succeed."""

    def __init__(self, error: str):
        super().__init__(error)
        self.error = error


def content_hash(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class ChannelPacer:
    """At most `burst` posts per channel in any window of `burst / per_second` seconds (Slack's chat.postMessage
    allows about one per second per channel, with short bursts), and a pause when Slack said Retry-After."""

    per_second: float = 1.0
    burst: int = 3
    _sent: dict[str, list[float]] = field(default_factory=dict)  # channel -> times of the posts in the window
    _paused_until: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def delay(self, channel: str) -> float:
        """Seconds until a post to this channel may go."""
        with self._lock:
            now = time.monotonic()
            paused = self._paused_until.get(channel, 0.0) - now
            if paused > 0:
                return paused
            window = self.burst / self.per_second
            sent = [t for t in self._sent.get(channel, []) if now - t < window]
            self._sent[channel] = sent
            return sent[0] + window - now if len(sent) >= self.burst else 0.0

    def sent(self, channel: str) -> None:
        """Count a post once Slack answered it: it certainly arrived before this, so the window holds on
        Slack's side too, whatever the network's delays."""
        with self._lock:
            self._sent.setdefault(channel, []).append(time.monotonic())

    def wait(self, channel: str, stop: threading.Event | None = None) -> None:
        while (delay := self.delay(channel)) > 0:
            if stop is not None and stop.wait(delay):
                raise SlackUnavailable("stopping")
            if stop is None:
                time.sleep(delay)

    def pause(self, channel: str, seconds: float) -> None:
        with self._lock:
            self._paused_until[channel] = max(self._paused_until.get(channel, 0.0), time.monotonic() + seconds)


def _classify(exc: Exception) -> Exception:
    if isinstance(exc, SlackApiError):
        response = exc.response
        status = getattr(response, "status_code", 200)
        error = str((response.data or {}).get("error", "")) if isinstance(response.data, dict) else ""
        if status == 429 or error == "ratelimited":
            retry = (response.headers or {}).get("Retry-After") or (response.headers or {}).get("retry-after")
            return SlackUnavailable("rate limited (429)", float(retry) if retry else None)
        if status >= 500:
            return SlackUnavailable(f"Slack answered HTTP {status}")
        if error in MESSAGE_ERRORS:
            return SlackRejected(error)
        return SlackUnavailable(f"Slack refused the call: {error or status}")
    return SlackUnavailable(f"Slack is unreachable: {type(exc).__name__}: {exc}")


@dataclass
class SlackSender:
    """The notifier's calls (post, update, upload, find), each paced (posts and uploads) and with its failures
    classified."""

    client: WebClient
    pacer: ChannelPacer = field(default_factory=ChannelPacer)
    stop: threading.Event | None = None
    processing_waits: tuple[float, ...] = PROCESSING_WAITS

    def _call(self, channel: str, method: str, /, **kwargs: Any) -> Any:
        try:
            return getattr(self.client, method)(**kwargs)
        except (SlackClientError, OSError, ValueError) as exc:  # ValueError: a body that is not JSON (an outage page)
            classified = _classify(exc)
            if isinstance(classified, SlackUnavailable) and classified.retry_after:
                self.pacer.pause(channel, classified.retry_after)
            raise classified from exc

    def post(self, *, channel: str, thread_ts: str | None, payload: dict[str, Any], scope: str, key: str) -> str:
        self.pacer.wait(channel, self.stop)
        metadata = {"event_type": METADATA_TYPE, "event_payload": {"scope": scope, "key": key}}
        try:
            response = self._call(channel, "chat_postMessage", channel=channel, thread_ts=thread_ts,
                                  text=payload.get("text", ""), blocks=payload.get("blocks"), metadata=metadata,
                                  unfurl_links=False, unfurl_media=False)
        finally:
            self.pacer.sent(channel)
        return str(response["ts"])

    def update(self, *, channel: str, ts: str, payload: dict[str, Any]) -> None:
        self._call(channel, "chat_update", channel=channel, ts=ts, text=payload.get("text", ""),
                   blocks=payload.get("blocks", []))

    def upload(self, *, channel: str, thread_ts: str | None, files: Sequence[tuple[str, bytes, str]],
               comment: str = "", shared: bool = True) -> str:
        """Upload files (filename, content, title) into the thread as one message; returns the first file's id.
        An upload that is not `shared` posts nothing: the file is the bot's, for a message to show (an image
        block), and is waited for until Slack has processed it, as a message can show it only then."""
        if shared:
            self.pacer.wait(channel, self.stop)
        where: dict[str, Any] = {"channel": channel, "thread_ts": thread_ts, "initial_comment": comment or None} \
            if shared else {}
        try:
            response = self._call(channel, "files_upload_v2", file_uploads=[
                {"filename": name, "content": content, "title": title} for name, content, title in files], **where)
        finally:
            if shared:
                self.pacer.sent(channel)
        uploaded = response.get("files") or [response.get("file") or {}]
        file_id = str(uploaded[0].get("id", ""))
        if not shared:
            self._wait_processed(file_id)
        return file_id

    def _wait_processed(self, file_id: str) -> None:
        """Until files.info gives the file's type (Slack fills it in once it has processed the upload), for a few
        seconds at most: a message showing it earlier is refused (invalid_blocks), and the notifier then posts
        the message without the picture."""
        for delay in (*self.processing_waits, None):
            try:
                if self.client.files_info(file=file_id).get("file", {}).get("mimetype"):
                    return
            except (SlackClientError, OSError, ValueError):
                return  # no files:read, or Slack away: the post says what is wrong, if anything
            if delay is None or (self.stop is not None and self.stop.wait(delay)):
                return
            if self.stop is None:
                time.sleep(delay)

    def find(self, *, channel: str, thread_ts: str | None, scope: str, key: str, filenames: Sequence[str] = (),
             oldest: float | None = None) -> str | None:
        """The ts (or file id) of a post of ours with this scope and key (or a file with one of these names), if
        Slack has one: what a crash between posting and recording left behind."""
        try:
            if thread_ts:
                response = self._call(channel, "conversations_replies", channel=channel, ts=thread_ts,
                                      include_all_metadata=True, limit=1000)
            else:
                response = self._call(channel, "conversations_history", channel=channel, include_all_metadata=True,
                                      limit=200, **({"oldest": f"{oldest:.6f}"} if oldest else {}))
        except SlackRejected:
            return None  # nothing of ours to find there; posting says what is wrong, if anything
        for message in response.get("messages") or []:
            meta = (message.get("metadata") or {}).get("event_payload") or {}
            if meta.get("scope") == scope and meta.get("key") == key:
                return str(message["ts"])
            for f in message.get("files") or []:
                if f.get("name") in filenames:
                    return str(f.get("id"))
        return None
