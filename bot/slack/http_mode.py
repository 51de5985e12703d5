"""HTTP mode: Slack's requests at /slack/events handed to the Bolt app, one thread per request (Bolt's own
development server answers one request at a time), and /healthz for load balancers and container checks."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from slack_bolt import App, BoltRequest

EVENTS_PATH = "/slack/events"
MAX_BODY_BYTES = 1_000_000


def make_server(app: App, *, host: str, port: int, healthy: Any = lambda: True) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # requests are logged by Bolt's listeners, not line by line
            pass

        def _send(self, status: int, body: bytes, headers: dict[str, Any] | None = None) -> None:
            self.send_response(status)
            for key, values in (headers or {}).items():
                for value in values if isinstance(values, list | tuple) else [values]:
                    if key.lower() != "content-length":
                        self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            if self.path.split("?")[0] == "/healthz":
                ok = bool(healthy())
                self._send(200 if ok else 503, json.dumps({"ok": ok}).encode(),
                           {"Content-Type": "application/json"})
                return
            self._send(404, b"")

        def do_POST(self) -> None:  # noqa: N802
            path, _, query = self.path.partition("?")
            if path != EVENTS_PATH:
                self._send(404, b"")
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._send(413, b"")
                return
            body = self.rfile.read(length).decode("utf-8")
            response = app.dispatch(BoltRequest(body=body, query=query, headers=self.headers))
            payload = response.body if isinstance(response.body, str) else json.dumps(response.body)
            self._send(response.status, payload.encode("utf-8"), response.headers)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def serve_in_thread(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="slack-http", daemon=True)
    thread.start()
    return thread
