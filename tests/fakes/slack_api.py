"""A stateful fake of the Slack Web API, for the real `slack_sdk` client (base_url pointed here).

It keeps channels, messages with real-looking `ts`, threads, edits, metadata, ephemeral messages, views and
files (the bot's uploads, and people's: `add_upload`, then `files.info` and a private download URL served only with
the bot token), and enforces what a bot must respect: the bot token, a per-channel posting rate (a burst, then
HTTP 429 with Retry-After), block limits (`invalid_blocks`, `msg_blocks_too_long`; an image block must show a
file whose upload was completed, shared or not), edits of the bot's own messages only, and an outage switch
(HTTP 503). A post to a user id is the bot's direct message with that person, kept under the user id as its
channel (`dm`). Tests read the state directly.

Channels a test declares (`add_channel`) have members and may be private, as in Slack: the bot cannot post where
it is not a member (`not_in_channel`; a private channel it is not in does not exist for it, `channel_not_found`),
may join public channels (`conversations.join`, with `channels:join`), and sees who is in a channel
(`conversations.members`) and which channels a person is in (`users.conversations`: public ones, and private
ones the bot shares). A channel no test declared is public and has the bot in it, so tests that do not care
about membership need not declare anything. Replies to a slash command's `response_url` are kept in `responses`
(`wait_response` waits for one). `throttle[method] = n` answers the next n calls of a method with HTTP 429 and
`Retry-After: throttle_retry_after`, whatever the method, as Slack's per-method tiers do.
"""

from __future__ import annotations

import email.parser
import itertools
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BOT_TOKEN = "xoxb-kernelbot-test"
APP_TOKEN = "xapp-kernelbot-test"
BOT_USER = "UBOT"
TEAM = "T0001"
MAX_BLOCKS = 50
SECTION_LIMIT = 3000
BLOCKS_TEXT_LIMIT = 12000
TEXT_LIMIT = 40000
RESPONSES_PER_URL = 5


@dataclass
class Message:
    channel: str
    ts: str
    text: str
    user: str = BOT_USER
    blocks: list[dict[str, Any]] = field(default_factory=list)
    thread_ts: str | None = None
    metadata: dict[str, Any] | None = None
    files: list[str] = field(default_factory=list)
    edits: int = 0


@dataclass
class Channel:
    id: str
    name: str
    private: bool = False
    members: set[str] = field(default_factory=set)  # user ids; the bot is BOT_USER


@dataclass
class FakeSlack:
    base_url: str = ""
    messages: dict[str, list[Message]] = field(default_factory=dict)  # channel -> in order
    ephemeral: list[dict[str, Any]] = field(default_factory=list)
    views: dict[str, dict[str, Any]] = field(default_factory=dict)  # view id -> view
    home: dict[str, dict[str, Any]] = field(default_factory=dict)  # user -> published view
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    downloads: list[str] = field(default_factory=list)  # ids of files served at url_private_download (bot token)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    down: bool = False
    burst: int = 3  # messages a channel takes at once before the rate applies
    per_second: float = 1.0  # chat.postMessage per channel, after the burst
    rate_limited: int = 0  # 429s answered
    usergroups: dict[str, list[str]] = field(default_factory=dict)  # group id -> member user ids
    archived: set[str] = field(default_factory=set)  # channels that refuse posts (is_archived)
    processing: bool = False  # uploads not processed yet: files.info has no mimetype, image blocks refuse them
    channels: dict[str, Channel] = field(default_factory=dict)  # declared channels (`add_channel`)
    responses: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # response_url id -> bodies posted
    throttle: dict[str, int] = field(default_factory=dict)  # method -> how many of its next calls get a 429
    throttle_retry_after: int = 1  # the Retry-After of those 429s, in seconds
    # What auth.test reports in x-oauth-scopes, as Slack does (None: no such header).
    scopes: tuple[str, ...] | None = ("commands", "chat:write", "files:write", "files:read", "channels:history",
                                      "groups:history", "users:read", "usergroups:read", "channels:read",
                                      "groups:read", "channels:join", "im:read", "mpim:read")
    socket_url: str = ""  # what apps.connections.open hands out (the Socket Mode fake's address)
    after_post: Callable[[Message], None] | None = None  # runs once a message is stored, before the answer
    _stamps: dict[str, list[float]] = field(default_factory=dict)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _last_ts: int = 0  # microseconds of the latest ts handed out
    lock: threading.Lock = field(default_factory=threading.Lock)

    # -- reading the state ----------------------------------------------------------------------------------------
    def thread(self, channel: str, ts: str) -> list[Message]:
        return [m for m in self.messages.get(channel, []) if m.ts == ts or m.thread_ts == ts]

    def find(self, channel: str, ts: str) -> Message | None:
        return next((m for m in self.messages.get(channel, []) if m.ts == ts), None)

    def dm(self, user: str) -> list[Message]:
        """What the bot said to this person in their direct messages."""
        return list(self.messages.get(user, []))

    def add_channel(self, channel_id: str, *, name: str = "", private: bool = False, members: tuple[str, ...] = (),
                    bot: bool = True) -> Channel:
        """Declare a channel with these members (and the bot, unless `bot=False`)."""
        with self.lock:
            people = set(members) | ({BOT_USER} if bot else set())
            self.channels[channel_id] = Channel(channel_id, name or channel_id.lower(), private, people)
            return self.channels[channel_id]

    def response_url(self, key: str) -> str:
        """A slash command's response_url served here; what is posted to it lands in `responses[key]`."""
        return f"{self.base_url}respond/{key}"

    # -- membership -------------------------------------------------------------------------------------------
    def _bot_sees(self, channel: str) -> bool:
        known = self.channels.get(channel)
        return known is None or not known.private or BOT_USER in known.members

    def _post_refused(self, channel: str) -> str | None:
        """Why the bot may not post here, if it may not (as chat.postMessage and file sharing answer)."""
        if not self._bot_sees(channel):
            return "channel_not_found"
        known = self.channels.get(channel)
        if known is not None and BOT_USER not in known.members:
            return "not_in_channel"
        return None

    def _channel_object(self, c: Channel) -> dict[str, Any]:
        return {"id": c.id, "name": c.name, "is_channel": not c.private, "is_group": c.private,
                "is_private": c.private, "is_member": BOT_USER in c.members, "is_archived": c.id in self.archived,
                "num_members": len(c.members)}

    def m_conversations_info(self, args: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        channel = str(args.get("channel") or "")
        if not channel or not self._bot_sees(channel):
            return 200, {"ok": False, "error": "channel_not_found"}, {}
        known = self.channels.get(channel) or Channel(channel, channel.lower(), members={BOT_USER})
        needed = "groups:read" if known.private else "channels:read"
        if self.scopes is not None and needed not in self.scopes:
            return 200, {"ok": False, "error": "missing_scope", "needed": needed}, {}
        return 200, {"ok": True, "channel": self._channel_object(known)}, {}

    def m_conversations_join(self, args: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        channel = str(args.get("channel") or "")
        if self.scopes is not None and "channels:join" not in self.scopes:
            return 200, {"ok": False, "error": "missing_scope", "needed": "channels:join"}, {}
        if not channel or not self._bot_sees(channel):
            return 200, {"ok": False, "error": "channel_not_found"}, {}
        known = self.channels.get(channel)
        if known is None:
            return 200, {"ok": True, "channel": self._channel_object(Channel(channel, channel.lower(),
                                                                             members={BOT_USER}))}, {}
        if known.private:
            return 200, {"ok": False, "error": "method_not_supported_for_channel_type"}, {}
        if channel in self.archived:
            return 200, {"ok": False, "error": "is_archived"}, {}
        already = BOT_USER in known.members
        known.members.add(BOT_USER)
        body: dict[str, Any] = {"ok": True, "channel": self._channel_object(known)}
        if already:
            body["warning"] = "already_in_channel"
        return 200, body, {}

    def m_conversations_members(self, args: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        channel = str(args.get("channel") or "")
        if not channel or not self._bot_sees(channel):
            return 200, {"ok": False, "error": "channel_not_found"}, {}
        known = self.channels.get(channel)
        members = sorted(known.members) if known else [BOT_USER]
        return 200, {"ok": True, "members": members, "response_metadata": {"next_cursor": ""}}, {}

    def m_users_conversations(self, args: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        """The channels a person is in, of those the bot may know of (declared channels only)."""
        user = str(args.get("user") or BOT_USER)
        types = str(args.get("types") or "public_channel").split(",")
        out = [self._channel_object(c) for c in self.channels.values() if user in c.members
               and ("private_channel" if c.private else "public_channel") in types and self._bot_sees(c.id)]
        return 200, {"ok": True, "channels": out, "response_metadata": {"next_cursor": ""}}, {}

    def wait_response(self, key: str, timeout: float = 10.0) -> dict[str, Any]:
        """The first body posted to `response_url(key)`, once it arrives (AssertionError after `timeout`)."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                posted = self.responses.get(key)
                if posted:
                    return posted[0]
            if time.monotonic() > deadline:
                raise AssertionError(f"nothing was posted to the response_url {key} within {timeout} s")
            time.sleep(0.01)

    def respond(self, key: str, body: dict[str, Any]) -> int:
        """A post to a response_url: Slack takes five per command (then 404, `used_url`)."""
        with self.lock:
            if len(self.responses.get(key, [])) >= RESPONSES_PER_URL:
                return 404
            self.responses.setdefault(key, []).append(body)
            return 200

    # -- the API --------------------------------------------------------------------------------------------------
    def _ts(self) -> str:
        """Like Slack's: the post's time in seconds with microseconds, unique and increasing in the workspace."""
        self._last_ts = max(self._last_ts + 1, int(time.time() * 1_000_000))
        return f"{self._last_ts // 1_000_000}.{self._last_ts % 1_000_000:06d}"

    def _rate_ok(self, channel: str) -> float:
        """0 when a post to this channel may go now, else the seconds to wait (Retry-After)."""
        now = time.monotonic()
        stamps = [t for t in self._stamps.get(channel, []) if now - t < self.burst / self.per_second]
        self._stamps[channel] = stamps
        if len(stamps) >= self.burst:
            return max(1.0, stamps[0] + self.burst / self.per_second - now)
        stamps.append(now)
        return 0.0

    def _check_blocks(self, blocks: list[dict[str, Any]]) -> str | None:
        if len(blocks) > MAX_BLOCKS:
            return "invalid_blocks"
        total = 0
        for block in blocks:
            if block.get("type") == "image" and not self._image_ok(block):
                return "invalid_blocks"
            text = (block.get("text") or {}).get("text", "") if block.get("type") == "section" else ""
            if len(text) > SECTION_LIMIT:
                return "invalid_blocks"
            total += len(json.dumps(block))
        return "msg_blocks_too_long" if total > BLOCKS_TEXT_LIMIT * 2 else None

    def _image_ok(self, block: dict[str, Any]) -> bool:
        """As Slack checks an image block: alt text, and a picture by URL or a file Slack holds completely."""
        slack_file = block.get("slack_file") or {}
        if not block.get("alt_text") or bool(block.get("image_url")) == bool(slack_file):
            return False
        if slack_file:
            stored = self.files.get(str(slack_file.get("id")))
            return stored is not None and bool(stored.get("completed")) and not self.processing
        return True

    @staticmethod
    def _is_user(channel: str) -> bool:
        return channel[:1] in ("U", "W")

    def call(self, method: str, args: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        with self.lock:
            self.calls.append((method, args))
            if self.throttle.get(method, 0) > 0:
                self.throttle[method] -= 1
                self.rate_limited += 1
                return 429, {"ok": False, "error": "ratelimited"}, {"Retry-After": str(self.throttle_retry_after)}
            handler = getattr(self, "m_" + method.replace(".", "_"), None)
            if handler is None:
                return 200, {"ok": False, "error": "unknown_method"}, {}
            return handler(args)

    def m_auth_test(self, args: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        headers = {"x-oauth-scopes": ",".join(self.scopes)} if self.scopes is not None else {}
        return 200, {"ok": True, "url": "https://kernelbot-test.slack.com/", "team": "test", "user": "kernelbot",
                     "team_id": TEAM, "user_id": BOT_USER, "bot_id": "B0001"}, headers

    def m_chat_postMessage(self, args: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:  # noqa: N802
        channel = str(args.get("channel") or "")
        if not channel:
            return 200, {"ok": False, "error": "channel_not_found"}, {}
        if channel in self.archived:
            return 200, {"ok": False, "error": "is_archived"}, {}
        refused = None if self._is_user(channel) else self._post_refused(channel)  # a user id: the bot's DM
        if refused:
            return 200, {"ok": False, "error": refused}, {}
        wait = self._rate_ok(channel)
        if wait:
            self.rate_limited += 1
            return 429, {"ok": False, "error": "ratelimited"}, {"Retry-After": str(int(wait + 0.999))}
        blocks = _json_arg(args.get("blocks")) or []
        problem = self._check_blocks(blocks)
        if problem:
            return 200, {"ok": False, "error": problem}, {}
        text = str(args.get("text") or "")
        warning = "message_truncated" if len(text) > TEXT_LIMIT else None
        thread_ts = args.get("thread_ts")
        if thread_ts and not self.find(channel, str(thread_ts)):
            return 200, {"ok": False, "error": "thread_not_found"}, {}
        message = Message(channel=channel, ts=self._ts(), text=text[:TEXT_LIMIT], blocks=blocks,
                          thread_ts=str(thread_ts) if thread_ts else None, metadata=_json_arg(args.get("metadata")))
        self.messages.setdefault(channel, []).append(message)
        if self.after_post:
            self.after_post(message)
        body: dict[str, Any] = {"ok": True, "channel": channel, "ts": message.ts,
                                "message": {"text": message.text, "ts": message.ts, "user": BOT_USER}}
        if warning:
            body["warning"] = warning
        return 200, body, {}

    def m_chat_update(self, args: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        message = self.find(str(args.get("channel")), str(args.get("ts")))
        if message is None:
            return 200, {"ok": False, "error": "message_not_found"}, {}
        if message.user != BOT_USER:
            return 200, {"ok": False, "error": "cant_update_message"}, {}
        blocks = _json_arg(args.get("blocks"))
        if blocks is not None:
            problem = self._check_blocks(blocks)
            if problem:
                return 200, {"ok": False, "error": problem}, {}
            message.blocks = blocks
        if "text" in args:
            message.text = str(args["text"])[:TEXT_LIMIT]
        message.edits += 1
        return 200, {"ok": True, "channel": message.channel, "ts": message.ts}, {}

    def m_chat_postEphemeral(self, args: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:  # noqa: N802
        channel = str(args.get("channel") or "")
        refused = self._post_refused(channel)
        if refused:
            return 200, {"ok": False, "error": refused}, {}
        known = self.channels.get(channel)
        if known is not None and str(args.get("user")) not in known.members:
            return 200, {"ok": False, "error": "user_not_in_channel"}, {}
        self.ephemeral.append(dict(args))
        return 200, {"ok": True, "message_ts": self._ts()}, {}

    def _listed(self, m: Message, with_metadata: bool) -> dict[str, Any]:
        item: dict[str, Any] = {"ts": m.ts, "text": m.text, "user": m.user, "blocks": m.blocks,
                                "thread_ts": m.thread_ts or m.ts}
        if with_metadata and m.metadata:
            item["metadata"] = m.metadata
        if m.files:
            item["files"] = [{"id": f, "name": self.files[f]["name"], "title": self.files[f].get("title")}
                             for f in m.files if f in self.files]
        return item

    def m_conversations_replies(self, args: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        channel, ts = str(args.get("channel")), str(args.get("ts"))
        if not self.find(channel, ts):
            return 200, {"ok": False, "error": "thread_not_found"}, {}
        with_metadata = str(args.get("include_all_metadata", "")).lower() in ("1", "true")
        out = [self._listed(m, with_metadata) for m in self.thread(channel, ts)]
        return 200, {"ok": True, "messages": out, "has_more": False}, {}

    def m_conversations_history(self, args: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Top-level messages of a channel, newest first (only those after `oldest`, when given)."""
        channel = str(args.get("channel"))
        with_metadata = str(args.get("include_all_metadata", "")).lower() in ("1", "true")
        oldest = float(args.get("oldest") or 0)
        top = [m for m in self.messages.get(channel, []) if (m.thread_ts is None or m.thread_ts == m.ts)
               and float(m.ts) > oldest]
        limit = int(args.get("limit") or 100)
        out = [self._listed(m, with_metadata) for m in reversed(top)][:limit]
        return 200, {"ok": True, "messages": out, "has_more": len(top) > limit}, {}

    def m_usergroups_users_list(self, args: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        group = str(args.get("usergroup"))
        if group not in self.usergroups:
            return 200, {"ok": False, "error": "no_such_subteam"}, {}
        return 200, {"ok": True, "users": list(self.usergroups[group])}, {}

    def m_apps_connections_open(self, args: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        if not self.socket_url:
            return 200, {"ok": False, "error": "socket_mode_not_enabled"}, {}
        return 200, {"ok": True, "url": self.socket_url}, {}

    def m_views_open(self, args: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        if not args.get("trigger_id"):
            return 200, {"ok": False, "error": "invalid_trigger_id"}, {}
        view = _json_arg(args.get("view")) or {}
        view_id = f"V{next(self._ids):05d}"
        self.views[view_id] = {**view, "id": view_id}
        return 200, {"ok": True, "view": self.views[view_id]}, {}

    def m_views_update(self, args: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        view_id = str(args.get("view_id"))
        if view_id not in self.views:
            return 200, {"ok": False, "error": "not_found"}, {}
        self.views[view_id] = {**(_json_arg(args.get("view")) or {}), "id": view_id}
        return 200, {"ok": True, "view": self.views[view_id]}, {}

    def m_views_publish(self, args: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        self.home[str(args.get("user_id"))] = _json_arg(args.get("view")) or {}
        return 200, {"ok": True}, {}

    def m_files_getUploadURLExternal(self, args: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:  # noqa: N802
        file_id = f"F{next(self._ids):05d}"
        self.files[file_id] = {"id": file_id, "name": args.get("filename"), "length": int(args.get("length", 0)),
                               "content": None}
        return 200, {"ok": True, "file_id": file_id, "upload_url": f"{self.base_url}upload/{file_id}"}, {}

    def m_files_completeUploadExternal(self, args: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:  # noqa: N802
        files = _json_arg(args.get("files")) or []
        channel = args.get("channel_id")
        for f in files:
            stored = self.files.get(f["id"])
            if stored is None or stored["content"] is None:
                return 200, {"ok": False, "error": "file_not_found"}, {}
            stored["title"], stored["completed"] = f.get("title"), True
        if channel:
            refused = self._post_refused(str(channel))
            if refused:
                return 200, {"ok": False, "error": refused}, {}
            thread_ts = args.get("thread_ts")
            if thread_ts and not self.find(str(channel), str(thread_ts)):
                return 200, {"ok": False, "error": "thread_not_found"}, {}
            message = Message(channel=str(channel), ts=self._ts(), text=str(args.get("initial_comment") or ""),
                              thread_ts=str(thread_ts) if thread_ts else None, files=[f["id"] for f in files])
            self.messages.setdefault(str(channel), []).append(message)
            if self.after_post:
                self.after_post(message)
        return 200, {"ok": True, "files": [{"id": f["id"], "title": f.get("title")} for f in files]}, {}

    def add_upload(self, name: str, content: bytes | str) -> str:
        """A file as Slack holds it after a person uploaded it (to a modal's file_input): its id."""
        data = content.encode() if isinstance(content, str) else content
        with self.lock:
            file_id = f"F{next(self._ids):05d}"
            self.files[file_id] = {"id": file_id, "name": name, "title": name, "length": len(data), "content": data,
                                   "completed": True}
            return file_id

    def file_object(self, file_id: str) -> dict[str, Any]:
        """What files.info says of a stored file; its private download URL is served by this fake."""
        stored = self.files[file_id]
        url = f"{self.base_url}files/{file_id}/{urllib.parse.quote(str(stored['name']))}"
        return {"id": file_id, "name": stored["name"], "title": stored.get("title") or stored["name"],
                "size": len(stored["content"] or b""), "mimetype": "" if self.processing else "text/plain",
                "url_private": url, "url_private_download": url}

    def m_files_info(self, args: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        file_id = str(args.get("file") or "")
        if file_id not in self.files or self.files[file_id]["content"] is None:
            return 200, {"ok": False, "error": "file_not_found"}, {}
        return 200, {"ok": True, "file": self.file_object(file_id)}, {}

    def download(self, file_id: str, token: str) -> tuple[int, bytes]:
        """A GET of a private file URL: only with the bot token in Authorization (401 otherwise)."""
        with self.lock:
            if token != BOT_TOKEN:
                return 401, b""
            stored = self.files.get(file_id)
            if stored is None or stored["content"] is None:
                return 404, b""
            self.downloads.append(file_id)
            return 200, stored["content"]

    def upload(self, file_id: str, content: bytes) -> int:
        with self.lock:
            stored = self.files.get(file_id)
            if stored is None:
                return 404
            stored["content"] = content
            return 200


def _json_arg(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return None
    return value


def _file_bytes(headers: Any, raw: bytes) -> bytes:
    """The uploaded bytes, from a raw body or the file part of a multipart form."""
    content_type = headers.get("Content-Type") or ""
    if not content_type.startswith("multipart/"):
        return raw
    message = email.parser.BytesParser().parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode() + raw)
    for part in message.walk():
        if part.get_filename() or part.get_param("name", header="content-disposition") == "file":
            return part.get_payload(decode=True) or b""
    return raw


def _handler(fake: FakeSlack) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _reply(self, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _bytes(self, status: int, data: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8" if status == 200 else "text/html")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            path = self.path.split("?")[0].strip("/").removeprefix("api/")
            if path.startswith("upload/"):
                self._reply(fake.upload(path.split("/", 1)[1], _file_bytes(self.headers, raw)), {"ok": True}, {})
                return
            if path.startswith("respond/"):  # a slash command's response_url: no token, as in Slack
                status = fake.respond(path.split("/", 1)[1], json.loads(raw or b"{}"))
                self._bytes(status, b"ok" if status == 200 else b"used_url")
                return
            if fake.down:
                self._reply(503, {"ok": False, "error": "service_unavailable"}, {})
                return
            token = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
            if path.startswith("files/") and self.command == "GET":  # url_private_download: files/ID/NAME
                self._bytes(*fake.download(path.split("/")[1], token))
                return
            content_type = self.headers.get("Content-Type") or ""
            if "json" in content_type:
                args = json.loads(raw or b"{}")
            else:
                args = {k: v[-1] for k, v in urllib.parse.parse_qs(raw.decode()).items()}
            token = token or str(args.pop("token", ""))
            if token != (APP_TOKEN if path == "apps.connections.open" else BOT_TOKEN):
                self._reply(200, {"ok": False, "error": "invalid_auth"}, {})
                return
            self._reply(*fake.call(path, args))

        do_GET = do_POST

    return Handler


@contextmanager
def fake_slack() -> Iterator[FakeSlack]:
    fake = FakeSlack()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    fake.base_url = f"http://127.0.0.1:{server.server_address[1]}/api/"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
