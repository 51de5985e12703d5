"""The executor the Bolt app runs its listeners on, in lanes: acks, clicks and events share the main lane; each
kind of slow work (a lazy listener marked with `in_lane`) has a small lane of its own, so it waits for its own
turn and never holds up an ack behind it.

Bolt runs an ack function and its lazy functions on the one `listener_executor` it is given (with
`process_before_response=False` the ack function too); its thread lazy runner wraps each lazy function with
`functools.wraps`, which carries the lane's mark over to what is submitted here. Unmarked work takes the main lane.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
MARK = "kernelbot_lane"


@dataclass(frozen=True)
class Lane:
    """A kind of slow work and how many of it run at once; more wait their turn."""

    name: str  # its threads' name prefix
    workers: int

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"lane {self.name!r} needs at least one worker ({self.workers=})")


def in_lane(work: F, lane: Lane) -> F:
    """`work` (a function or a functools.partial, given to Bolt as a lazy listener) runs in `lane`."""
    setattr(work, MARK, lane)
    return work


def lane_of(work: Callable[..., Any]) -> Lane | None:
    return getattr(work, MARK, None)


class Lanes(Executor):
    """The main lane, `main_workers` threads named `bolt-*`; each lane's threads are started the first time work
    comes for it."""

    def __init__(self, main_workers: int) -> None:
        self._main = ThreadPoolExecutor(max_workers=main_workers, thread_name_prefix="bolt")
        self._lanes: dict[Lane, ThreadPoolExecutor] = {}
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        lane = lane_of(fn)
        return (self._main if lane is None else self._pool(lane)).submit(fn, *args, **kwargs)

    def _pool(self, lane: Lane) -> ThreadPoolExecutor:
        with self._lock:
            pool = self._lanes.get(lane)
            if pool is None:
                pool = self._lanes[lane] = ThreadPoolExecutor(max_workers=lane.workers,
                                                              thread_name_prefix=lane.name)
            return pool

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            pools = [self._main, *self._lanes.values()]
        for pool in pools:
            pool.shutdown(wait=wait, cancel_futures=cancel_futures)
