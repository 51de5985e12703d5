"""What a kernel family written in its own module or package provides, so the brain, the planner and the emitter
need no case for it.

A family defines a frozen dataclass for what it recognised (a spec) with the methods below, and a recogniser
`(program, output) -> spec` that raises NotRecognised when the program is not of its kind. It lists the
recogniser in `families.RECOGNISERS`; `families.recognise` tries those before the built-in families, so a family
owns the primitives it claims (a convolution, a scan) and says why when it cannot take a program.

A family package (agents.offline.attention, agents.offline.conv, agents.offline.scan) keeps one idea per module:
what was recognised (shape), recognising it, the parameters (a typed frozen dataclass, its space and the brain's
choice), the kernel's source, its fixed helpers as real functions (helpers) and the spec with the methods below
(family). The parameters cross into the dicts of the plans, the search and the written module's TUNABLE block through
`as_tunable` and `from_tunable`, here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Protocol, TypeVar, runtime_checkable

from tpu_runner.hardware import ChipSpec


@runtime_checkable
class FamilySpec(Protocol):
    family: str
    reduces: bool
    n_inputs: int
    n_static: int

    def describe(self) -> str:
        """One line for the plan's analysis: what was recognised, with its sizes and dtypes."""

    def space(self) -> dict[str, tuple[Any, ...]]:
        """The kernel's TUNABLE space."""

    def params(self, chip: ChipSpec) -> tuple[dict[str, Any], list[str]]:
        """The brain's first choice in that space and the sentences that reason it (the first: the roofline)."""

    def strategy(self) -> str:
        """The plan's Strategy section."""

    def source(self, params: dict[str, Any], header: str, tunable_text: str) -> str:
        """The whole kernel module: `header` (docstring and imports) and `tunable_text` (the TUNABLE block) first."""


def floor_in(values: tuple[Any, ...], limit: float) -> Any:
    """The largest value of a TUNABLE axis not above `limit` (the smallest value when none is)."""
    fitting = [v for v in values if v <= limit]
    return max(fitting) if fitting else min(values)


def dividing(size: int, blocks: tuple[int, ...]) -> tuple[int, ...]:
    """The blocks of a TUNABLE axis that divide `size`, or the whole size when none does."""
    return tuple(b for b in blocks if size % b == 0) or (size,)


def first_vmem_limit(vmem_bytes: int) -> int:
    """The scoped VMEM limit a family's first kernel asks for: 64 MiB on a chip with 128 MiB of VMEM (v5e, v6e),
    else 32 MiB or half the chip's VMEM, the less - within the VMEM, not all of it (the compiler keeps some)."""
    return 64 * 2**20 if vmem_bytes >= 128 * 2**20 else min(32 * 2**20, vmem_bytes // 2)


P = TypeVar("P")


def as_tunable(params: Any) -> dict[str, Any]:
    """A family's parameters (a frozen dataclass) as the TUNABLE values the plans, the search and the written
    module pass around: each field under its upper-case name, in field order; a None field is not in this
    kernel's space and is left out."""
    values = {f.name.upper(): getattr(params, f.name) for f in fields(params)}
    return {name: value for name, value in values.items() if value is not None}


def from_tunable(cls: type[P], values: Mapping[str, Any]) -> P:
    """A family's parameters from TUNABLE values: the names of its fields, upper-cased (others are ignored, as the
    written module ignores them)."""
    names = {f.name.upper(): f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{names[key]: value for key, value in values.items() if key in names})
