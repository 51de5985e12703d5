"""One chart drawn at a time in a process: matplotlib's text layout (mathtext's parser, the font cache) is shared by
every figure and not safe from two threads at once, Figure API or not. Drawn from 8 threads, 18-20 of 32 profile
charts failed (a log axis's tick labels: pyparsing's ParseException, 'pop from empty list'), and evaluations that run
in threads (`evaluate_many`) lost their results to it. Every chart the product draws goes through `draws_alone`;
drawing one takes ~0.1-0.3 s, so waiting for another costs little."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

_P = ParamSpec("_P")
_R = TypeVar("_R")
_LOCK = threading.Lock()


def draws_alone(draw: Callable[_P, _R]) -> Callable[_P, _R]:
    """`draw`, run while no other chart of this process is being drawn."""
    @functools.wraps(draw)
    def alone(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with _LOCK:
            return draw(*args, **kwargs)
    return alone
