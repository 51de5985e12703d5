"""Retention as a kernel family (agents.offline.kernel_family.FamilySpec): what was recognised, with the TUNABLE
space, the brain's choice in it, the plan's strategy and the kernel's source."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents.offline.kernel_family import as_tunable, floor_in, from_tunable
from agents.offline.program import itemsize
from agents.offline.retention.shape import MAX_EXPONENT, MiB, RetentionParams, RetentionShape
from agents.offline.retention.source import retention_source
from tpu_runner.hardware import ChipSpec


@dataclass(frozen=True)
class Retention(RetentionShape):
    family = "retention"
    reduces = True

    def space(self) -> dict[str, tuple[Any, ...]]:
        # Blocks over which the fastest decay stays inside MAX_EXPONENT (the factored decay is exact there).
        blocks = tuple(b for b in (128, 256, 512, 1024) if self.fastest_rate * b <= MAX_EXPONENT)
        return {"BLOCK": blocks, "VMEM_LIMIT_BYTES": tuple(m * MiB for m in (32, 64, 100))}

    def params(self, chip: ChipSpec) -> tuple[dict[str, Any], list[str]]:
        block = floor_in(self.space()["BLOCK"], min(512, self.seq))
        flops = 2 * self.groups * self.seq * self.seq * (self.head_dim + self.v_dim) // 2
        moved = self.groups * self.seq * (2 * self.head_dim + self.v_dim) * itemsize(self.dtype)
        reasons = [f"Retention does {flops / 1e9:.0f} GFLOP on the causal half on {moved / MiB:.0f} MiB of q, k and "
                   f"v: at least {flops / chip.peak_for(self.dtype) * 1e3:.3g} ms on {chip.name}'s MXU, "
                   "compute-bound once the score matrix and the decay stay in VMEM (the reference materialises "
                   f"both: {self.groups * self.seq * self.seq * 4 / 2**30:.1f} GiB of f32 scores).",
                   f"Square blocks of {block} positions: the {block}x{block} f32 score tile, its decay and the "
                   f"{block}x{self.v_dim} accumulator stay in VMEM; the grid visits only the blocks on or below the "
                   "diagonal, query block i paired with block n-1-i so every row of the grid has equal work.",
                   "The decay exp(rate (n - m)) is factored around the query block's last position: one exponential "
                   "per key and one per query per block instead of one per score.",
                   "Two passes: the rows' absolute sums first, then the scores again, normalised and rounded to "
                   f"{self.v_dtype} as the reference rounds them, times V. Half as much MXU work again as one pass "
                   "that divides at the end, but one pass rounds the scores before normalising them, which moves "
                   "outputs that cancel by more than a rounding of the reference's."]
        return as_tunable(RetentionParams(block=block, vmem_limit_bytes=64 * MiB)), reasons

    def strategy(self) -> str:
        return ("Two pallas_calls over (batch x head, query block, key block on or below the diagonal), neither "
                "writing a score to HBM: the first weights the f32 scores q k^T by the decay and sums each row's "
                "absolute values; the second computes them again, divides each row by its floored sum, rounds as "
                "the reference does and adds the product with V to an f32 accumulator in VMEM.")

    def source(self, params: dict[str, Any], header: str, tunable_text: str) -> str:
        return retention_source(self, from_tunable(RetentionParams, params), header, tunable_text)
