"""The scans as kernel families (agents.offline.kernel_family.FamilySpec): a prefix sum and a linear recurrence,
each what was recognised with the TUNABLE space, the brain's choice in it, the plan's strategy and the kernel's
source. Plans and the search carry parameters as dicts; the typed choice becomes one here, at the family's edge.
The kernels read their parameters as the TUNABLE names of the written module, so the source needs none of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents.offline.kernel_family import as_tunable
from agents.offline.scan.params import choose_cumsum, choose_recurrence, cumsum_space, recurrence_space
from agents.offline.scan.shape import CumsumShape, RecurrenceShape
from agents.offline.scan.source import cumsum_source, recurrence_source
from tpu_runner.hardware import ChipSpec


@dataclass(frozen=True)
class Cumsum(CumsumShape):
    family = "scan"
    reduces = True  # the scan axis is carried from grid step to grid step, like a reduction

    def space(self) -> dict[str, tuple[Any, ...]]:
        return cumsum_space(self)

    def params(self, chip: ChipSpec) -> tuple[dict[str, Any], list[str]]:
        chosen, reasons = choose_cumsum(self, chip)
        return as_tunable(chosen), reasons

    def strategy(self) -> str:
        return ("One pallas_call over (blocks of lines, chunks along the scan), the chunk axis last and 'arbitrary'. "
                "Per chunk: the elementwise work before the scan on the block in VMEM, the chunk's prefix sums as a "
                "matmul with a triangle of ones on the MXU (f32 split into exact bf16 parts), plus the running total "
                "from the previous chunks (VMEM scratch), then the elementwise work after it and one store.")

    def source(self, params: dict[str, Any], header: str, tunable_text: str) -> str:
        return cumsum_source(self, header, tunable_text)


@dataclass(frozen=True)
class Recurrence(RecurrenceShape):
    family = "scan"
    reduces = True

    def space(self) -> dict[str, tuple[Any, ...]]:
        return recurrence_space(self)

    def params(self, chip: ChipSpec) -> tuple[dict[str, Any], list[str]]:
        chosen, reasons = choose_recurrence(self, chip)
        return as_tunable(chosen), reasons

    def strategy(self) -> str:
        return ("One pallas_call over (leading batch, blocks of features, chunks of time steps), the time axis last "
                "and 'arbitrary'. Per chunk, a loop over its steps computes h = a_t * h + x_t for a block of "
                "features in f32 and stores each step's h; h carries into the next chunk through VMEM scratch.")

    def source(self, params: dict[str, Any], header: str, tunable_text: str) -> str:
        return recurrence_source(self, header, tunable_text)
