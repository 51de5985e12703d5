"""A mixture of experts as a kernel family (agents.offline.kernel_family.FamilySpec): what was recognised, with the
TUNABLE space, the brain's choice in it, the plan's strategy and the kernel's source."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents.offline.kernel_family import as_tunable, floor_in, from_tunable
from agents.offline.moe.shape import MiB, MoEParams, MoEShape
from agents.offline.moe.source import moe_source
from agents.offline.program import itemsize
from tpu_runner.hardware import ChipSpec


def _dividing(values: tuple[int, ...], size: int) -> tuple[int, ...]:
    """The values that divide `size`, or the size itself when none does."""
    return tuple(v for v in values if size % v == 0) or (size,)


@dataclass(frozen=True)
class MoE(MoEShape):
    family = "moe"
    reduces = False

    def space(self) -> dict[str, tuple[Any, ...]]:
        return {"BLOCK_ROWS": (128, 256, 512, 1024),
                "BLOCK_FFN": _dividing((256, 512, 1024, 2048), self.ffn),
                "BLOCK_MODEL": _dividing((512, 1024, 2048, 4096), self.model),
                "BLOCK_FFN_DOWN": _dividing((512, 1024, 2048), self.ffn),
                "VMEM_LIMIT_BYTES": tuple(m * MiB for m in (32, 64, 100))}

    def params(self, chip: ChipSpec) -> tuple[dict[str, Any], list[str]]:
        space = self.space()
        size = itemsize(self.dtype)
        pairs = self.tokens * self.top_k
        # Tiles of rows enough that each expert's weights, streamed once per tile, stay behind the MXU's work
        # (a tile of r rows does 2 r flops per weight element fetched), and few enough that padding each
        # expert's last tile wastes little.
        block_rows = floor_in(space["BLOCK_ROWS"], max(128, min(512, pairs // self.experts)))
        chosen = MoEParams(block_rows=block_rows, block_ffn=floor_in(space["BLOCK_FFN"], 512),
                           block_model=floor_in(space["BLOCK_MODEL"], 2048),
                           block_ffn_down=floor_in(space["BLOCK_FFN_DOWN"], 1024), vmem_limit_bytes=64 * MiB)
        routed, dense = self.routed_flops(), self.routed_flops() * self.experts // self.top_k
        peak = chip.peak_for(self.dtype)
        weights = self.experts * self.model * self.ffn * (len(self.ins) + 1) * size
        tiles = pairs // block_rows + self.experts
        reasons = [f"The reference computes all {self.experts} experts on every token: {dense / 1e12:.2f} TFLOP, at "
                   f"least {dense / peak * 1e3:.3g} ms on {chip.name}'s MXU; the top-{self.top_k} experts' work is "
                   f"{routed / 1e12:.2f} TFLOP, at least {routed / peak * 1e3:.3g} ms.",
                   f"Rows sorted by expert in tiles of {block_rows}: at most {tiles} tiles, each expert's last one "
                   f"padded; each tile streams its expert's weights ({weights / self.experts / MiB:.0f} MiB), "
                   f"{2 * block_rows / size:.0f} flops per byte fetched.",
                   f"First kernel: the {len(self.ins)} first matmul{'s' if len(self.ins) > 1 else ''} and the "
                   f"activation in blocks of {chosen.block_ffn} ffn columns; second: the last matmul in blocks of "
                   f"{chosen.block_model} model columns over {chosen.block_ffn_down} ffn at a time, accumulated in "
                   "f32 in VMEM.",
                   "The routing is the reference's own XLA ops, so every token goes to the experts the reference "
                   "picks; each value is rounded where the reference rounds it (the matmuls' outputs, the "
                   "activation's steps, each expert's output)."]
        return as_tunable(chosen), reasons

    def strategy(self) -> str:
        return ("The reference's routing as XLA ops; the (token, expert) pairs sorted by expert into tiles of one "
                "expert each (scalar-prefetched expert ids pick the weight blocks); one pallas_call for the first "
                "matmuls and the activation, one for the last matmul; each token's outputs weighted and summed.")

    def source(self, params: dict[str, Any], header: str, tunable_text: str) -> str:
        from_tunable(MoEParams, params)  # the values are checked here; the written module reads its TUNABLE block
        return moe_source(self, header, tunable_text)
