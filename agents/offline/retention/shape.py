"""What recognising retention found (where q, k and v are among the inputs, the sizes, each head's decay rate,
the rows' floor), and the kernel's parameters, typed."""

from __future__ import annotations

import math
from dataclasses import dataclass

MiB = 2**20
# The decay is factored per block into a row part and a column part (exp(rate (n - c)) x exp(rate (c - m)), c the
# block's last query): exact while |rate| x block stays well inside float32's exponent range.
MAX_EXPONENT = 40.0


@dataclass(frozen=True)
class RetentionShape:
    q: int  # input positions
    k: int
    v: int
    batch_dims: tuple[int, ...]  # the leading axes the matmuls batch over (batch, heads, ...)
    seq: int
    head_dim: int
    v_dim: int
    rates: tuple[float, ...]  # the decay's exponent per step, row-major over rate_shape
    rate_shape: tuple[int, ...]  # over the batch axes: the size of each the rate varies along, else 1
    eps: float  # rows are divided by max(sum |row|, eps)
    dtype: str  # q's dtype
    v_dtype: str
    out_dtype: str
    n_inputs: int
    n_static: int

    @property
    def groups(self) -> int:
        return math.prod(self.batch_dims)

    @property
    def fastest_rate(self) -> float:
        return max((abs(r) for r in self.rates), default=0.0)

    def describe(self) -> str:
        dims = "x".join(str(d) for d in self.batch_dims)
        slowest, fastest = min(abs(r) for r in self.rates), self.fastest_rate
        return (f"retention (causal decay, rows L1-normalised), {dims} batch x heads, {self.seq} positions of "
                f"dimension {self.head_dim} ({self.dtype}), decay rates {slowest:.3g}..{fastest:.3g} per step, "
                f"row floor {self.eps:g}")


@dataclass(frozen=True, kw_only=True)
class RetentionParams:
    """The kernel's TUNABLE values, typed (agents.offline.kernel_family.as_tunable gives the dict the plans carry)."""

    block: int  # query and key positions per block (square: the grid walks the blocks on or below the diagonal)
    vmem_limit_bytes: int

    def __post_init__(self) -> None:
        if self.block < 1:
            raise ValueError(f"a block holds at least one position: {self.block=}")
