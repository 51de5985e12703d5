"""What recognising the triangle update found (which inputs are the pair, the mask, each projection's weights),
its sizes, and the kernel's parameters, typed."""

from __future__ import annotations

from dataclasses import dataclass

MiB = 2**20


@dataclass(frozen=True)
class Projection:
    """x @ weights[value], times sigmoid(x @ weights[gate]) when gated, times the mask when masked (input indices)."""

    value: int
    gate: int | None
    masked: bool


@dataclass(frozen=True)
class TriangleShape:
    x: int  # the pair input [N, N, C_in]
    mask: int | None  # [N, N, 1] or [N, N], multiplied into the masked projections
    left: Projection  # the contraction's operand whose free axis is the output's first
    right: Projection
    scale: int | None  # [C], multiplied into the normalised t
    out: Projection  # the output projection of the normalised t (its gate a projection of x)
    residues: int  # N
    c_in: int
    channels: int  # C: the contraction's batch axis
    c_out: int
    incoming: bool  # contracted over the first axis, t[i, j] = sum_k left[k, i] right[k, j], not the second
    eps: float
    dtype: str
    out_dtype: str
    n_inputs: int
    n_static: int

    def describe(self) -> str:
        gated = " and gated" if self.left.gate is not None else ""
        masked = "masked" if self.left.masked else "unmasked"
        edges = "incoming" if self.incoming else "outgoing"
        return (f"triangle multiplicative update ({edges}): {masked}{gated} projections of {self.dtype}"
                f"[{self.residues}, {self.residues}, {self.c_in}] to {self.channels} channels, contracted per "
                f"channel over the shared axis, RMS-normalised over the channels (eps {self.eps:g}), projected to "
                f"{self.c_out}{' and gated' if self.out.gate is not None else ''}")


@dataclass(frozen=True, kw_only=True)
class TriangleParams:
    """The kernel's TUNABLE values, typed (agents.offline.kernel_family.as_tunable gives the dict the plans carry)."""

    block_rows: int  # positions (i, k) per step of the projections and of the output projection
    block_i: int  # rows of t per step of the contraction
    block_j: int  # columns of t per step
    vmem_limit_bytes: int

    def __post_init__(self) -> None:
        if min(self.block_rows, self.block_i, self.block_j) < 1:
            raise ValueError(f"blocks hold at least one row: {self}")
