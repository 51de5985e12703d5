"""Progress of long commands on stderr: a spinner updated in place on a terminal; elsewhere (piped, logged, under a
supervisor) a plain line per change of step and a `still ...` line while a step lasts, so a log never goes silent
for minutes."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from types import TracebackType
from typing import Any, TextIO

STILL_EVERY_S = 30.0


def plain_line(label: str, step: str, elapsed: float, *, still: bool = False) -> str:
    """`evaluating k.py: lowering (12 s)`, or `... still lowering (42 s)`."""
    return f"{label}: {'still ' if still else ''}{step} ({elapsed:.0f} s)"


class Progress:
    """`with Progress("evaluating k.py") as p: p.update("lowering")`."""

    def __init__(self, label: str, *, stream: TextIO | None = None, every: float = STILL_EVERY_S,
                 console: Any = None) -> None:
        self.label, self.every = label, every
        self.stream = stream or sys.stderr
        self.console = console  # a rich Console on stderr, used only where the stream is a terminal
        self.step = "starting"
        self._started = self._said = time.monotonic()
        self._status: Any = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._ticker: threading.Thread | None = None

    @property
    def on_terminal(self) -> bool:
        return self.console is not None and self.stream.isatty()

    def __enter__(self) -> Progress:
        if self.on_terminal:
            self._status = self.console.status(f"{self.label}: {self.step}")
            self._status.__enter__()
        else:
            self._say(plain_line(self.label, self.step, 0.0))
            self._ticker = threading.Thread(target=self._tick, name="progress", daemon=True)
            self._ticker.start()
        return self

    def update(self, step: str) -> None:
        with self._lock:
            if step == self.step:
                return
            self.step = step
        if self._status is not None:
            self._status.update(f"{self.label}: {step}")
        else:
            self._say(plain_line(self.label, step, time.monotonic() - self._started))

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self._status is not None:
            self._status.__exit__(kind, exc, tb)
        elif kind is None:
            self._say(plain_line(self.label, "finished", time.monotonic() - self._started))

    def _tick(self) -> None:
        while not self._stop.wait(self.every / 5):
            with self._lock:
                step, quiet_for = self.step, time.monotonic() - self._said
            if quiet_for >= self.every:
                self._say(plain_line(self.label, step, time.monotonic() - self._started, still=True))

    def _say(self, line: str) -> None:
        self._said = time.monotonic()
        # The reader went away, or the stream closed: progress is optional.
        with contextlib.suppress(BrokenPipeError, ValueError):
            print(line, file=self.stream, flush=True)
