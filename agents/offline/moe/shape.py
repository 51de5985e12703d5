"""What recognising a mixture of experts found: where the tokens and the experts' weights are among the inputs,
the sizes, the elementwise chain between the experts' first matmuls and their last (a gated activation), and the
reference's own routing ops (the weight each token gives each expert), which the kernel's wrapper repeats as XLA
ops; and the kernel's parameters, typed."""

from __future__ import annotations

from dataclasses import dataclass

from agents.offline.program import Op, Value

MiB = 2**20


@dataclass(frozen=True)
class ExpertIn:
    """One of the experts' first matmuls (a gate's or an up-projection's): tokens [T, model] @ W[e]."""

    weight: int  # input position of W: [experts, model, ffn], or [experts, ffn, model] when transposed
    transposed: bool
    rounds: tuple[str, ...]  # the dtypes its value takes on the way to the chain: the dot's output, then casts
    value: Value  # the value the chain reads, [experts, *tokens, ffn]


@dataclass(frozen=True)
class MoEShape:
    tokens_input: int  # input position of the tokens [*tokens, model]
    ins: tuple[ExpertIn, ...]  # one (a plain MLP) or two (a gated one)
    chain: tuple[Op, ...]  # elementwise ops from the `ins` values to the hidden activation
    hidden: Value  # [experts, *tokens, ffn], the last matmul's left operand
    down: int  # input position of the last matmul's weight: [experts, ffn, model] (or [experts, model, ffn])
    down_transposed: bool
    down_dtype: str  # the last matmul's output dtype, which the reference rounds each expert's output to
    routing: tuple[Op, ...]  # the reference's ops making the combine weights, [experts, *tokens(, 1)] f32
    combine: Value  # their result: the weight of each expert for each token, at most top_k of them not zero
    tokens: int
    model: int
    ffn: int
    experts: int
    top_k: int
    dtype: str  # the tokens' and the weights' dtype
    out_dtype: str
    inputs: tuple[Value, ...]  # the reference's, whose shapes the routing's sizes are written by
    n_inputs: int
    n_static: int

    def describe(self) -> str:
        gated = "gated " if len(self.ins) == 2 else ""
        return (f"a mixture of {self.experts} {gated}MLP experts, top-{self.top_k} routing, over {self.tokens} "
                f"tokens (model {self.model}, ffn {self.ffn}, {self.dtype}); the reference computes every expert "
                f"on every token and weights all but {self.top_k} of them by zero")

    def routed_flops(self) -> int:
        """The matmuls' work for the tokens' chosen experts only (what the kernel does)."""
        return 2 * self.tokens * self.top_k * self.model * self.ffn * (len(self.ins) + 1)


@dataclass(frozen=True, kw_only=True)
class MoEParams:
    """The kernel's TUNABLE values, typed (agents.offline.kernel_family.as_tunable gives the dict the plans carry)."""

    block_rows: int  # rows (token-expert pairs) per tile: every row of a tile goes through one expert
    block_ffn: int  # ffn columns per step of the first kernel
    block_model: int  # output columns per step of the second kernel
    block_ffn_down: int  # contraction per step of the second kernel
    vmem_limit_bytes: int

    def __post_init__(self) -> None:
        if self.block_rows < 8 or min(self.block_ffn, self.block_model, self.block_ffn_down) < 128:
            raise ValueError(f"tiles of at least 8 rows and 128 columns: {self}")
