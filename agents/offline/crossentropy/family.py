"""Cross-entropy as a kernel family (agents.offline.kernel_family.FamilySpec): what was recognised, with the
TUNABLE space, the brain's choice in it, the plan's strategy and the kernel's source."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents.offline.crossentropy.shape import CrossEntropyParams, CrossEntropyShape, MiB
from agents.offline.crossentropy.source import cross_entropy_source
from agents.offline.kernel_family import as_tunable, floor_in, from_tunable
from agents.offline.program import itemsize
from tpu_runner.hardware import ChipSpec


def _dividing(values: tuple[int, ...], size: int) -> tuple[int, ...]:
    """The values that divide `size`, or all of them when none does (the kernel masks a ragged last block)."""
    return tuple(v for v in values if size % v == 0) or values


@dataclass(frozen=True)
class CrossEntropy(CrossEntropyShape):
    family = "crossentropy"
    reduces = True

    def space(self) -> dict[str, tuple[Any, ...]]:
        rows = _dividing((8, 64, 128, 256, 512, 1024, 2048), self.rows) if self.rows >= 8 else (8,)
        return {"BLOCK_ROWS": rows, "BLOCK_VOCAB": _dividing((128, 256, 512, 1024, 2048, 4096), self.vocab),
                "VMEM_LIMIT_BYTES": tuple(m * MiB for m in (32, 64, 100))}

    def params(self, chip: ChipSpec) -> tuple[dict[str, Any], list[str]]:
        space = self.space()
        size = itemsize(self.dtype)
        if self.matmul:
            # Rows enough that the weight, re-read once per row block, stays behind the MXU's work.
            block_rows = floor_in(space["BLOCK_ROWS"], min(1024, self.rows))
            block_vocab = floor_in(space["BLOCK_VOCAB"], 512)
            flops = 2 * self.rows * self.model * self.vocab
            weight = self.model * self.vocab * size
            least = flops / chip.peak_for(self.dtype) * 1e3
            reasons = [f"The head does {flops / 1e12:.2f} TFLOP: at least {least:.3g} ms on {chip.name}'s MXU; the "
                       f"{self.rows}x{self.vocab} logits "
                       f"({self.rows * self.vocab * size / 2**30:.1f} GiB in {self.dtype}) never reach HBM.",
                       f"Row blocks of {block_rows}: the {block_rows}x{self.model} hidden states stay in VMEM while "
                       f"the {weight / 2**30:.2f} GiB weight streams past in blocks of {block_vocab} columns, "
                       f"{self.rows // block_rows} times in all."]
        else:
            block_rows = floor_in(space["BLOCK_ROWS"], min(256, self.rows))
            block_vocab = floor_in(space["BLOCK_VOCAB"], 2048)
            moved = self.rows * self.vocab * size
            reasons = [f"Cross-entropy is memory-bound: the {moved / MiB:.0f} MiB of logits read once, at least "
                       f"{moved / chip.hbm_bandwidth * 1e3:.3g} ms at {chip.name}'s "
                       f"{chip.hbm_bandwidth / 1e9:.0f} GB/s (the reference reads them for the max, again for the "
                       "sum of exponentials, and again for the label).",
                       f"Blocks of {block_rows} rows x {block_vocab} columns "
                       f"({block_rows * block_vocab * size / MiB:.0f} MiB), double-buffered."]
        reasons.append("Online: a running row max and sum of exponentials in VMEM, rescaled as the max grows; the "
                       "label's logit picked where the block's column positions equal the labels; each row's loss "
                       "written once, at its last block" + (f", then XLA's {self.reduce} over the rows."
                                                            if self.reduce != "none" else "."))
        if self.matmul and self.dtype in ("bfloat16", "float16"):
            reasons.append("The logits stay in f32 out of the MXU (the reference rounds them to its dtype first); "
                           "the loss is that much closer to its float64 truth.")
        chosen = CrossEntropyParams(block_rows=block_rows, block_vocab=block_vocab, vmem_limit_bytes=64 * MiB)
        return as_tunable(chosen), reasons

    def strategy(self) -> str:
        made = ("each logits tile a matmul of the row block's hidden states with a block of the weight, on the MXU"
                if self.matmul else "each logits tile read once")
        return ("One pallas_call over (row blocks, vocabulary blocks), the vocabulary last and 'arbitrary': "
                f"{made}; an online log-sum-exp and the label's logit per row in VMEM; the loss per row written "
                "once.")

    def source(self, params: dict[str, Any], header: str, tunable_text: str) -> str:
        return cross_entropy_source(self, from_tunable(CrossEntropyParams, params), header, tunable_text)
