"""Attention as a kernel family (agents.offline.kernel_family.FamilySpec): what was recognised, with the TUNABLE
space, the brain's choice in it, the plan's strategy and the kernel's source. Plans and the search carry
parameters as dicts; they become the typed AttentionParams here, at the family's edge."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents.offline.attention.params import AttentionParams, attention_space, choose_params
from agents.offline.attention.shape import AttentionShape
from agents.offline.attention.source import attention_source
from agents.offline.kernel_family import as_tunable, from_tunable
from tpu_runner.hardware import ChipSpec


@dataclass(frozen=True)
class Attention(AttentionShape):
    family = "attention"
    reduces = True

    def space(self) -> dict[str, tuple[Any, ...]]:
        return attention_space(self)

    def params(self, chip: ChipSpec) -> tuple[dict[str, Any], list[str]]:
        chosen, reasons = choose_params(self, chip)
        return as_tunable(chosen), reasons

    def strategy(self) -> str:
        return ("Flash attention in one pallas_call: a grid over (batch, head group, query block, key block); per "
                "key block the scores stay in VMEM and an online softmax (running max and sum) rescales an f32 "
                "accumulator; the output is written once, at the last key block."
                + (" Query heads sharing a K/V head are stacked as the rows of one tile, so each K/V block is "
                   "fetched once per group." if self.group > 1 else ""))

    def source(self, params: dict[str, Any], header: str, tunable_text: str) -> str:
        return attention_source(self, from_tunable(AttentionParams, params), header, tunable_text)
