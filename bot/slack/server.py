"""`kernelbot serve`, assembled: the Bolt app over HTTP or Socket Mode in every process (in Socket Mode, the
connection's state recorded every few seconds for the health check); the notifier (and the scheduler) in the one
process that holds the leader lock; with `--with-runner`, a runner in the same process for a single-host team."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from agents.session_jobs import runner_kinds
from bot.slack.app import build_app, notifier_client
from bot.slack.http_mode import make_server
from bot.slack.leader import LeaderLock
from bot.slack.outbound.digest import digest_ops
from bot.slack.outbound.notifier import Notifier
from bot.slack.outbound.sender import SlackSender
from bot.slack.socket_health import RECORD_SECONDS, SocketRecorder, state_path
from bot.slack.socket_mode import SocketConnection, connect
from storage.settings import Settings
from tpu_runner.hardware import CHIPS
from tpu_runner.runner import RunnerConfig, RunnerDaemon, describe_host

log = logging.getLogger("kernelbot.serve")
LEADER_POLL_SECONDS = 5.0


@dataclass(frozen=True)
class ServeOptions:
    http: bool = False
    host: str = "0.0.0.0"
    port: int = 3000
    with_runner: bool = False
    runner_concurrency: int = 1
    suites: tuple[Path, ...] = ()


# What the leader runs besides the notifier: returns a stop function (the scheduler, when configured).
LeaderService = Callable[[Settings, Engine], Callable[[], None]]


@dataclass
class Server:
    settings: Settings
    engine: Engine
    options: ServeOptions
    leader_services: list[LeaderService] = field(default_factory=list)
    socket_record_seconds: float = RECORD_SECONDS  # how often the Socket Mode state is written for the health check
    stop: threading.Event = field(default_factory=threading.Event)
    notifier: Notifier | None = None
    _threads: list[threading.Thread] = field(default_factory=list)
    _stops: list[Callable[[], None]] = field(default_factory=list)
    _runner: Any = None
    _http: Any = None
    _socket: Any = None
    _shutdown_lock: threading.Lock = field(default_factory=threading.Lock)
    _shut_down: bool = False

    def __post_init__(self) -> None:
        self.app = build_app(self.settings, self.engine, suites=list(self.options.suites),
                             socket_mode=not self.options.http, notify=self.notify)
        self.leader = LeaderLock(self.engine)

    def notify(self) -> None:
        if self.notifier is not None:
            self.notifier.notify()

    # -- background parts -----------------------------------------------------------------------------------------
    def start(self) -> None:
        self._spawn(self._lead, "leader")
        if self.options.with_runner:
            self._start_runner()

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _lead(self) -> None:
        leading = False
        while not self.stop.is_set():
            try:
                held = self.leader.try_acquire()
            except Exception:  # noqa: BLE001 - the database may be away for a while; keep trying
                log.exception("serve: could not ask for the leader lock")
                held = False
            if held and not leading:
                log.info("serve: this process leads: it runs the notifier%s",
                         " and the scheduler" if self.leader_services else "")
                self._start_leader_work()
                leading = True
            elif leading and not held:
                log.warning("serve: lost the leader lock; stopping the notifier until it is regained")
                self._stop_leader_work()
                leading = False
            self.stop.wait(LEADER_POLL_SECONDS)
        if leading:
            self._stop_leader_work()
        self.leader.release()

    def _start_leader_work(self) -> None:
        sender = SlackSender(notifier_client(self.settings))
        self.notifier = Notifier(self.engine, sender, digest_ops=digest_ops)
        notifier_thread = threading.Thread(target=self.notifier.run, name="notifier", daemon=True)
        notifier_thread.start()
        self._stops = [self.notifier.close]
        for service in self.leader_services:
            try:
                self._stops.append(service(self.settings, self.engine))
            except Exception:  # noqa: BLE001 - the notifier goes on; the log says which service did not start
                log.exception("serve: a leader service (%s) did not start", getattr(service, "__name__", service))

    def _stop_leader_work(self) -> None:
        for stop in reversed(self._stops):
            try:
                stop()
            except Exception:  # noqa: BLE001 - stop the others regardless
                log.exception("serve: stopping a background service failed")
        self._stops = []
        self.notifier = None

    def _start_runner(self) -> None:
        self._runner = RunnerDaemon(engine=self.engine, settings=self.settings,
                                    hardware=describe_host(self.settings),
                                    job_kinds=runner_kinds(self.settings.job_modules),
                                    config=RunnerConfig(name="serve-embedded", targets=tuple(CHIPS),
                                                        concurrency=self.options.runner_concurrency))
        self._spawn(self._runner.run, "runner")

    # -- the front ------------------------------------------------------------------------------------------------
    def serve_forever(self) -> None:
        """Answer Slack until `shutdown` (blocks)."""
        if self.options.http:
            self._http = make_server(self.app, host=self.options.host, port=self.options.port,
                                     healthy=lambda: not self.stop.is_set())
            log.info("serve: answering Slack on http://%s:%d/slack/events", self.options.host, self.options.port)
            self._http.serve_forever()
        else:
            self._socket = connect(self.app, self.settings)
            log.info("serve: connected to Slack over Socket Mode")
            self._watch_socket(self._socket)

    def _watch_socket(self, socket: SocketConnection) -> None:
        """Until `shutdown`, record every few seconds whether the socket is connected, for the health check."""
        recorder = SocketRecorder(state_path(self.settings.home))
        was_connected = True
        while True:
            connected = socket.is_connected()
            if connected != was_connected:
                log.log(logging.INFO if connected else logging.WARNING, "serve: Socket Mode %s",
                        "connected again" if connected else "disconnected; the client reconnects")
                was_connected = connected
            try:
                recorder.record(connected, time.time())
            except OSError:
                log.exception("serve: cannot record the Socket Mode connection for the health check")
            if self.stop.wait(self.socket_record_seconds):
                return

    def shutdown(self, grace_seconds: float = 30.0) -> None:
        """Stop everything once (the signal handler's thread and the main thread both ask; the second waits)."""
        with self._shutdown_lock:
            if self._shut_down:
                return
            self._shut_down = True
            self._shutdown(grace_seconds)

    def _shutdown(self, grace_seconds: float) -> None:
        self.stop.set()
        if self._http is not None:
            self._http.shutdown()
        if self._socket is not None:
            self._socket.close()
        if self._runner is not None:
            self._runner.request_stop()
        for thread in self._threads:
            thread.join(timeout=grace_seconds)
