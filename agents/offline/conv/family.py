"""The convolution as a kernel family (agents.offline.kernel_family.FamilySpec): what was recognised, with the
TUNABLE space, the brain's choice in it, the plan's strategy and the kernel's source. Plans and the search carry
parameters as dicts; they become the typed ConvParams here, at the family's edge."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents.offline.conv.params import ConvParams, choose_params, conv_space
from agents.offline.conv.shape import PLANE, POOL, TILED, ConvShape
from agents.offline.conv.source import conv_source
from agents.offline.kernel_family import as_tunable, from_tunable
from tpu_runner.hardware import ChipSpec


@dataclass(frozen=True)
class Conv(ConvShape):
    family = "convolution"

    def space(self) -> dict[str, tuple[Any, ...]]:
        return conv_space(self)

    def params(self, chip: ChipSpec) -> tuple[dict[str, Any], list[str]]:
        chosen, reasons = choose_params(self, chip)
        return as_tunable(chosen), reasons

    def strategy(self) -> str:
        return ("Implicit GEMM in one pallas_call over (sample, output-channel block, position block): the sample's "
                "input in VMEM with positions on the lanes, each tap a shifted window of it stacked into a patch, "
                "one f32-accumulated MXU dot per chunk, and the epilogue fused on the accumulator"
                + {TILED: ".", POOL: "; the global pool accumulates across position blocks.",
                   PLANE: "; each block holds a whole plane so its statistics are computed in VMEM."}[self.mode])

    def source(self, params: dict[str, Any], header: str, tunable_text: str) -> str:
        return conv_source(self, from_tunable(ConvParams, params), header, tunable_text)
