"""What recognising a grouped matmul found (which inputs are the rows, the weights and the group sizes, the sizes)
and the kernel's parameters, typed."""

from __future__ import annotations

from dataclasses import dataclass

MiB = 2**20


@dataclass(frozen=True)
class GroupedShape:
    lhs: int  # input index of the rows [m, k], sorted by group
    rhs: int  # of the weights [groups, k, n] ([groups, n, k] when transposed)
    sizes: int  # of the group sizes [groups], summing to m
    m: int
    k: int
    n: int
    groups: int
    transposed: bool
    dtype: str  # the rows' as the grouped matmul reads them
    rhs_dtype: str
    out_dtype: str
    n_inputs: int
    n_static: int

    def describe(self) -> str:
        layout = "[groups, n, k]" if self.transposed else "[groups, k, n]"
        return (f"grouped matmul (ragged_dot) of {self.dtype}[{self.m}, {self.k}] rows sorted into {self.groups} "
                f"groups by {self.groups} weights {layout} with n = {self.n} -> {self.out_dtype}[{self.m}, {self.n}]")


@dataclass(frozen=True, kw_only=True)
class GroupedParams:
    """The kernel's TUNABLE values, typed (agents.offline.kernel_family.as_tunable gives the dict the plans carry)."""

    block_m: int  # rows per tile (a tile on a group boundary is visited once per group in it)
    block_n: int
    block_k: int
    vmem_limit_bytes: int

    def __post_init__(self) -> None:
        if min(self.block_m, self.block_n, self.block_k) < 1:
            raise ValueError(f"blocks hold at least one element: {self}")
