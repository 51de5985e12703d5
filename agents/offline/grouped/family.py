"""The grouped matmul as a kernel family (agents.offline.kernel_family.FamilySpec): what was recognised, with the
TUNABLE space, the brain's choice in it, the plan's strategy and the kernel's source."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents.offline.grouped.shape import GroupedParams, GroupedShape, MiB
from agents.offline.grouped.source import grouped_source
from agents.offline.kernel_family import as_tunable, dividing, first_vmem_limit, floor_in, from_tunable
from agents.offline.program import itemsize
from tpu_runner.hardware import ChipSpec


@dataclass(frozen=True)
class Grouped(GroupedShape):
    family = "grouped"
    reduces = False

    def space(self) -> dict[str, tuple[Any, ...]]:
        return {"BLOCK_M": dividing(self.m, (128, 256, 512, 1024)),
                "BLOCK_N": dividing(self.n, (256, 512, 1024, 2048)),
                "BLOCK_K": tuple(sorted(set(dividing(self.k, (256, 512, 1024, 2048)) + (self.k,)))),
                "VMEM_LIMIT_BYTES": tuple(x * MiB for x in (32, 64, 100))}

    def params(self, chip: ChipSpec) -> tuple[dict[str, Any], list[str]]:
        space = self.space()
        block_m, block_n = floor_in(space["BLOCK_M"], 512), floor_in(space["BLOCK_N"], 1024)
        vmem = first_vmem_limit(chip.vmem_bytes)
        # The whole of k a step when both blocks fit (double-buffered) in half the limit: a group's weight block
        # then stays put across its consecutive visits, fetched once per group and column block, not once per
        # row tile and k step.
        size = itemsize(self.dtype)
        whole_k = 2 * (block_m + block_n) * self.k * size + 3 * block_m * block_n * 4 <= vmem // 2
        block_k = self.k if whole_k else floor_in(space["BLOCK_K"], 1024)
        flops = 2 * self.m * self.k * self.n
        tiles = -(-self.m // block_m)
        visits = tiles + self.groups  # one boundary per group, the rows past their total one more group
        weights = self.groups if whole_k else visits  # times each column block of the weights is fetched
        moved = (visits * block_m * self.k * (self.n // block_n) + weights * self.k * self.n + self.m * self.n) * size
        reasons = [f"The grouped matmul is {flops / 1e9:.3g} GFLOP, at least "
                   f"{flops / chip.peak_for(self.dtype) * 1e3:.3g} ms on {chip.name}'s MXU; the kernel does it as "
                   f"at most {visits} row-tile visits per column block where a dense matmul takes {tiles} (a tile on "
                   f"a group boundary once per group in it), ~{moved / MiB:.0f} MiB through HBM.",
                   f"Tiles of {block_m} rows x {block_n} columns with "
                   + (f"the whole of k ({self.k}) a step, so a group's weights are fetched once per column block "
                      "while its visits run" if whole_k else f"{block_k} of k a step")
                   + f": ~{flops / moved:.0f} FLOP per byte moved, above the chip's ratio of MXU to HBM rates, and "
                   "the f32 accumulator stays in VMEM across k.",
                   "The schedule (each visit's group and row tile) is computed from the group sizes on the device "
                   "and prefetched as scalars; the visits beyond the groups' count repeat the last one's row tile "
                   "and group (its output block stays in VMEM) and compute nothing."]
        return as_tunable(GroupedParams(block_m=block_m, block_n=block_n, block_k=block_k,
                                        vmem_limit_bytes=vmem)), reasons

    def strategy(self) -> str:
        return ("One pallas_call over (column block, visit, k block), its schedule prefetched as scalars: visit v "
                "is a (group, row tile) pair in row order; the rows' tile and the group's weights are its blocks, "
                "the product accumulates in f32 over k, and the last k step stores the rows of the tile that belong "
                "to the group, leaving the others to the tile's other visits (the output block stays in VMEM while "
                "consecutive visits share it).")

    def source(self, params: dict[str, Any], header: str, tunable_text: str) -> str:
        return grouped_source(self, from_tunable(GroupedParams, params), header, tunable_text)
