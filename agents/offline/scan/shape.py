"""What recognising a scan found: a prefix sum (its axis, direction and the elementwise work around it) or a
linear recurrence (its axis, direction and which input is `a`), with the sizes and dtypes; and the words in which
refusals name what the family writes."""

from __future__ import annotations

from dataclasses import dataclass

from agents.offline.program import Op, Value

SCANS_WRITTEN = ("prefix sums (cumsum, either direction, any axis, with elementwise work around it) and the linear "
                 "recurrence h_t = a_t * h_{t-1} + x_t written with lax.associative_scan")


@dataclass(frozen=True)
class CumsumShape:
    shape: tuple[int, ...]  # the scanned array's shape
    axis: int
    reverse: bool
    operands: tuple[tuple[int, Value, str], ...]  # (input position, value, FULL or SCALAR)
    pre: tuple[Op, ...]  # elementwise work computing the scanned value
    scan_in: Value
    scan_out: Value
    post: tuple[Op, ...]  # elementwise work on the prefix sums
    output: Value
    n_inputs: int
    n_static: int

    @property
    def lanes(self) -> bool:
        """The scan runs along the last axis: along lanes, the data as (rows, n)."""
        return self.axis == len(self.shape) - 1

    def describe(self) -> str:
        way = "reverse " if self.reverse else ""
        around = len(self.pre) + len(self.post)
        extra = f" with {around} elementwise ops around it" if around else ""
        return (f"{way}prefix sum along axis {self.axis} of {self.scan_in.dtype}{list(self.shape)}{extra} "
                f"(output {self.output.dtype})")


@dataclass(frozen=True)
class RecurrenceShape:
    shape: tuple[int, ...]
    axis: int  # the time axis; the features after it lie along lanes
    reverse: bool
    a: int  # input positions
    x: int
    dtype: str
    out_dtype: str
    n_inputs: int
    n_static: int

    def describe(self) -> str:
        way = "reverse " if self.reverse else ""
        return (f"{way}linear recurrence h_t = a_t * h_(t-1) + x_t along axis {self.axis} of "
                f"{self.dtype}{list(self.shape)} (a = input {self.a}, x = input {self.x})")
