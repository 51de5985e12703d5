"""A local fake of the Anthropic Messages API for the real SDK to talk to.

Stateful like the service: it checks the key, the model, max_tokens, that roles alternate and that every
tool_result answers a tool_use of the previous assistant turn; it caches system prefixes marked with
cache_control and reports cache reads and writes in `usage`; it plays a script of turns (text, tool calls,
rate limits with retry-after, overload); and it records every request for the test to inspect.
"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

API_KEY = "sk-test-kernelbot"
MODELS = [
    {"id": "claude-opus-5-1", "created_at": "2026-05-01T00:00:00Z", "line": "opus", "lifecycle": "active"},
    {"id": "claude-opus-5-5", "created_at": "2026-09-01T00:00:00Z", "line": "opus", "lifecycle": "active"},
    {"id": "claude-opus-6-0", "created_at": "2026-11-01T00:00:00Z", "line": "opus", "lifecycle": "deprecated"},
    {"id": "claude-sonnet-5-5", "created_at": "2026-10-01T00:00:00Z", "line": "sonnet", "lifecycle": "active"},
]
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}


def tokens(value: Any) -> int:
    """A stable stand-in for a tokenizer: about four characters a token."""
    return max(1, len(json.dumps(value, sort_keys=True)) // 4)


@dataclass
class FakeAnthropic:
    """Script entries: {"text": ...}, {"tool_use": {"name": ..., "input": {...}}, "text": optional},
    {"status": 429, "retry_after": seconds}, {"status": 529}; "stop_reason" ("max_tokens", "refusal",
    "pause_turn") overrides the turn's own; an entry with "repeat": True is played for every request from then on
    (a model that always answers the same way)."""

    script: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    counted: list[dict[str, Any]] = field(default_factory=list)  # count_tokens requests
    cached_prefixes: set[str] = field(default_factory=set)
    base_url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle_messages(self, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        problem = self._invalid(body)
        if problem:
            return 400, _error(400, problem), {}
        if not self.script:
            return 500, _error(500, "the fake has no scripted turn left"), {}
        turn = self.script[0] if self.script[0].get("repeat") else self.script.pop(0)
        if "status" in turn:
            headers = {"retry-after": str(turn["retry_after"])} if "retry_after" in turn else {}
            return turn["status"], _error(turn["status"], f"scripted {turn['status']}"), headers
        content: list[dict[str, Any]] = []
        if turn.get("text"):
            content.append({"type": "text", "text": turn["text"]})
        if "tool_use" in turn:
            content.append({"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:12]}", **turn["tool_use"]})
        read, write = self._cache(body)
        usage = {"input_tokens": tokens(body["messages"]), "output_tokens": tokens(content),
                 "cache_read_input_tokens": read, "cache_creation_input_tokens": write}
        return 200, {"id": f"msg_{uuid.uuid4().hex[:12]}", "type": "message", "role": "assistant",
                     "model": body["model"], "content": content,
                     "stop_reason": turn.get("stop_reason") or ("tool_use" if "tool_use" in turn else "end_turn"),
                     "stop_sequence": None,
                     "usage": usage}, {}

    def _invalid(self, body: dict[str, Any]) -> str | None:
        if body.get("model") not in {m["id"] for m in MODELS}:
            return f"model: {body.get('model')!r} not found"
        if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
            return "max_tokens: required positive integer"
        messages = body.get("messages") or []
        if not messages or messages[0]["role"] != "user":
            return "messages: must start with a user turn"
        for i, message in enumerate(messages):
            expected = "user" if i % 2 == 0 else "assistant"
            if message["role"] != expected:
                return f"messages.{i}: roles must alternate user/assistant"
            content = message["content"]
            results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"] \
                if isinstance(content, list) else []
            if results:
                previous = messages[i - 1]["content"]
                asked = {b["id"] for b in previous if isinstance(b, dict) and b.get("type") == "tool_use"}
                if {r["tool_use_id"] for r in results} != asked:
                    return f"messages.{i}: tool_result ids must answer the previous tool_use blocks"
        return None

    def _cache(self, body: dict[str, Any]) -> tuple[int, int]:
        """Cache reads and writes for the system prefix up to the last block marked cache_control."""
        system = body.get("system") or []
        marked = [i for i, block in enumerate(system) if isinstance(block, dict) and block.get("cache_control")]
        if not marked:
            return 0, 0
        prefix = system[: marked[-1] + 1] + [body.get("tools", [])]
        key = hashlib.sha256(json.dumps(prefix, sort_keys=True).encode()).hexdigest()
        size = tokens(prefix)
        if key in self.cached_prefixes:
            return size, 0
        self.cached_prefixes.add(key)
        return 0, size


def _error(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


def _handler(fake: FakeAnthropic) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _reply(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("request-id", f"req_{uuid.uuid4().hex[:12]}")
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorised(self) -> bool:
            key = self.headers.get("x-api-key") or self.headers.get("authorization", "").removeprefix("Bearer ")
            if key != API_KEY:
                self._reply(401, _error(401, "invalid x-api-key"))
                return False
            return True

        def do_GET(self) -> None:  # noqa: N802
            if not self._authorised():
                return
            if self.path.split("?")[0] == "/v1/models":
                data = [{"type": "model", "display_name": m["id"], **m} for m in MODELS]
                self._reply(200, {"data": data, "has_more": False, "first_id": data[0]["id"],
                                  "last_id": data[-1]["id"]})
            else:
                self._reply(404, _error(404, f"no route {self.path}"))

        def do_POST(self) -> None:  # noqa: N802
            if not self._authorised():
                return
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            route = self.path.split("?")[0]
            if route == "/v1/messages/count_tokens":
                with fake.lock:
                    fake.counted.append(body)
                self._reply(200, {"input_tokens": tokens(body.get("messages")) + tokens(body.get("system", []))})
                return
            if route != "/v1/messages":
                self._reply(404, _error(404, f"no route {self.path}"))
                return
            with fake.lock:
                fake.requests.append({"body": body, "headers": dict(self.headers)})
                status, reply, headers = fake.handle_messages(body)
            self._reply(status, reply, headers)

    return Handler


@contextmanager
def fake_anthropic(script: list[dict[str, Any]] | None = None) -> Iterator[FakeAnthropic]:
    fake = FakeAnthropic(script=list(script or []))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    fake.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
