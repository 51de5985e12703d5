"""What recognising attention found: where q, k, v and a bias are among the inputs, the role of each of their
axes, the sizes, and the ops the reference does to the scores before the softmax; with what follows from them
(the group of query heads per K/V head, causal or not, the scale that can go on q)."""

from __future__ import annotations

import math
from dataclasses import dataclass

MiB = 2**20
ROLES = ("b", "h", "s", "d")  # the canonical layout every input is read as


@dataclass(frozen=True)
class ScoreOp:
    """One step of what the reference does to the scores before the softmax, replayed on each tile."""

    kind: str  # "scale" (times a constant), "bias" (plus the bias input), "causal" (keys after the query masked)
    value: float = 1.0


@dataclass(frozen=True)
class AttentionShape:
    q: int  # input positions
    k: int
    v: int
    bias: int | None
    q_order: tuple[str, ...]  # the role of each input axis ("1": a size-1 axis without one)
    k_order: tuple[str, ...]
    v_order: tuple[str, ...]
    bias_order: tuple[str, ...]  # over (b, h, q, k); "1" where the bias broadcasts
    out_order: tuple[str, ...]  # the output's axes before its final reshape
    out_dims: tuple[tuple[str, ...], ...]  # after it: each axis the product of these roles' sizes
    batch: int
    heads: int
    kv_heads: int
    seq: int
    kv_seq: int
    head_dim: int
    v_dim: int
    score_ops: tuple[ScoreOp, ...]
    dtype: str  # q's dtype
    v_dtype: str
    out_dtype: str
    n_inputs: int
    n_static: int

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def causal(self) -> bool:
        return any(op.kind == "causal" for op in self.score_ops)

    @property
    def scale(self) -> float:
        return math.prod(op.value for op in self.score_ops if op.kind == "scale")

    @property
    def square_causal(self) -> bool:
        """Causal over equal query and key lengths: the grid visits only the blocks on or below the diagonal."""
        return self.causal and self.seq == self.kv_seq

    @property
    def folded_scale(self) -> float:
        """The scale applied before anything else touches the scores, which can go on q instead (d columns, not
        block_kv) where that is exact: q in float32, or a power of two. Rounding a bfloat16 q times 1/sqrt(128)
        moves each score by ~2^-9 of itself, which picks another key where the scores are large (the evaluator's
        "large" inputs did so on a chip); then it stays on the scores, as do later scale ops."""
        scale = 1.0
        for op in self.score_ops:
            if op.kind != "scale":
                break
            scale *= op.value
        exact = self.dtype == "float32" or math.frexp(scale)[0] == 0.5
        return scale if exact else 1.0

    def describe(self) -> str:
        kind = "causal " if self.causal else ""
        heads = f"{self.heads} heads" + (f" sharing {self.kv_heads} K/V heads" if self.group > 1 else "")
        bias = " plus a score bias" if self.bias is not None else ""
        layout = "".join(r for r in self.q_order if r != "1")
        return (f"{kind}attention, batch {self.batch}, {heads}, {self.seq} queries x {self.kv_seq} keys of "
                f"dimension {self.head_dim} ({self.dtype}, {layout} layout), scale {self.scale:.4g}{bias}")


def in_place(order: tuple[str, ...], d: int) -> bool:
    """Read in place as (batch, seq, heads x dim) with a head's dim on the lanes: the (b, s, h, d) layout."""
    return tuple(r for r in order if r != "1") == ("b", "s", "h", "d") and d % 128 == 0


def final_shape(dims: tuple[tuple[str, ...], ...], sizes: dict[str, int]) -> tuple[int, ...]:
    return tuple(math.prod(sizes[r] for r in roles) for roles in dims)
