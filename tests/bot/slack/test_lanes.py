"""The listeners' executor: work marked for a lane runs on that lane's threads, at most its workers at once; the
rest runs on the main lane."""

from __future__ import annotations

import threading
from functools import partial

import pytest

from bot.slack.lanes import Lane, Lanes, in_lane


def thread_name() -> str:
    return threading.current_thread().name


def test_marked_work_runs_in_its_lane_and_the_rest_in_the_main_lane() -> None:
    lanes = Lanes(main_workers=2)
    try:
        slow = in_lane(partial(thread_name), Lane("slow-work", workers=1))
        assert lanes.submit(slow).result(timeout=5).startswith("slow-work")
        assert lanes.submit(thread_name).result(timeout=5).startswith("bolt")
    finally:
        lanes.shutdown()


def test_a_lane_runs_at_most_its_workers_at_once_and_the_main_lane_goes_on() -> None:
    lanes, lane = Lanes(main_workers=1), Lane("one-at-a-time", workers=1)
    release, started = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        release.wait(5)

    try:
        first = lanes.submit(in_lane(partial(hold), lane))
        assert started.wait(5)
        second = lanes.submit(in_lane(partial(thread_name), lane))
        assert lanes.submit(thread_name).result(timeout=5).startswith("bolt")  # not behind the lane
        assert not second.done()  # waits its turn
        release.set()
        first.result(timeout=5)
        assert second.result(timeout=5).startswith("one-at-a-time")
    finally:
        release.set()
        lanes.shutdown()


def test_a_lane_has_a_worker() -> None:
    with pytest.raises(ValueError, match="workers=0"):
        Lane("none", workers=0)
