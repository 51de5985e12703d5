"""Progress where no terminal is: a plain line per step and a `still ...` line while a step lasts."""

from __future__ import annotations

import io
import time

from bot.cli.progress import Progress, plain_line


def test_off_a_terminal_each_step_is_a_line_and_a_long_step_says_it_is_still_going() -> None:
    stream = io.StringIO()
    with Progress("evaluating k.py", stream=stream, every=0.05) as progress:
        progress.update("lowering")
        time.sleep(0.3)  # several `still` intervals
        progress.update("lowering")  # the same step again is not a new line
        progress.update("checking correctness")
    lines = stream.getvalue().splitlines()
    assert lines[0] == "evaluating k.py: starting (0 s)" and lines[1].startswith("evaluating k.py: lowering (")
    still = [line for line in lines if line.startswith("evaluating k.py: still lowering (")]
    assert len(still) >= 2, lines
    assert sum(line.startswith("evaluating k.py: lowering") for line in lines) == 1
    assert lines[-2].startswith("evaluating k.py: checking correctness") and lines[-1].startswith(
        "evaluating k.py: finished (")


def test_a_failed_step_does_not_say_done() -> None:
    stream = io.StringIO()
    try:
        with Progress("reading tasks", stream=stream, every=10):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert "finished" not in stream.getvalue()
    assert plain_line("x", "compiling", 61.4, still=True) == "x: still compiling (61 s)"
