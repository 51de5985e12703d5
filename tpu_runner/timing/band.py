"""How sure an estimated speedup is: its likely range, from how far the estimate has been from measured TPU times.

A program's time is trusted as far as the class its time is mostly in (`calibration.BANDS`); a speedup divides
two such times whose errors are independent (the candidate's kernels and the reference's XLA ops are modelled
from different figures), so their log errors add in quadrature. A speedup whose range includes 1 is no clear
gain, whatever its point estimate; searches still rank by the point estimate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tpu_runner.timing.calibration import band


def program_band(seconds_by_class: Mapping[str, float], target: str) -> tuple[float, float]:
    """(low, high): true time / estimated time for a program, from the class most of its time is in."""
    if not seconds_by_class:
        return band("", target)
    dominant = max(seconds_by_class, key=lambda k: seconds_by_class[k])
    return band(dominant, target)


def speedup_band(speedup: float, reference: tuple[float, float], candidate: tuple[float, float]) -> list[float]:
    """speedup = reference / candidate; the true one is speedup x (ref true/est) / (cand true/est)."""
    down = math.hypot(math.log(1 / reference[0]), math.log(candidate[1]))
    up = math.hypot(math.log(reference[1]), math.log(1 / candidate[0]))
    return [speedup * math.exp(-down), speedup * math.exp(up)]


def clear_gain(perf: Any) -> bool | None:
    """True for a gain the band holds, False for a band that includes 1 or lies below it, None if unknown."""
    if not getattr(perf, "band", None):
        return None
    return perf.band[0] > 1.0


def clear_improvement(speedup: float, band: Sequence[float] | None, method: str | None, over: float) -> bool:
    """Whether a kernel's speedup beats `over` (the best kernel's so far, or 1.0: the reference). A measured one
    must beat it by more than its own spread: a gain inside the spread is no gain, and the earlier kernel stays. An
    estimate beats it by its value: its band is the model's error, much the same for two kernels of one task."""
    if method == "measured" and band:
        return band[0] > over
    return speedup > over


def measured_band(speedup: float, reference: tuple[float, float], candidate: tuple[float, float]) -> list[float]:
    """A measured speedup's range from the spread of each time ((median, spread) pairs): their relative spreads
    add in quadrature. A gain inside it is no gain."""
    rel = math.hypot(reference[1] / reference[0] if reference[0] else 0.0,
                     candidate[1] / candidate[0] if candidate[0] else 0.0)
    return [speedup / (1 + rel), speedup * (1 + rel)]


def band_text(perf: Any) -> str:
    """'likely x0.90-x1.20: no clear gain' for an estimate, '±2%' for a measurement ('' without a band)."""
    if not getattr(perf, "band", None):
        return ""
    low, high = perf.band
    if getattr(perf, "method", "estimated") == "measured":
        text = f"±{(high / low) ** 0.5 - 1:.0%}" if low > 0 else ""
    else:
        text = f"likely x{low:.2f}-x{high:.2f}"
    if low <= 1.0 <= high:
        text += ": no clear gain"
    elif high < 1.0:
        text += ": slower"
    return text


def describe_speedup(perf: Any) -> str:
    """'x1.04 estimated, likely x0.90-x1.20: no clear gain', or 'x2.10 measured, ±1%'."""
    if perf is None:
        return "no speedup"
    extra = band_text(perf)
    return f"x{perf.speedup:.2f} {perf.method}" + (f", {extra}" if extra else "")
