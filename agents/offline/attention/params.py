"""The flash-attention kernel's parameters: the TUNABLE space the search and the autotuner move in, apart from the
brain's own first choice in it (a heuristic from the shapes), which comes with the sentences that reason it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents.offline.attention.shape import AttentionShape, MiB, in_place
from agents.offline.kernel_family import floor_in
from agents.offline.program import itemsize
from tpu_runner.hardware import ChipSpec


@dataclass(frozen=True, kw_only=True)
class AttentionParams:
    """The kernel's TUNABLE values, typed (agents.offline.kernel_family.as_tunable gives the dict the plans carry)."""

    block_q: int  # query rows per block (all of the sequence when it is shorter)
    block_kv: int | None = None  # keys per block; None on a square causal grid, whose key blocks are the query's
    heads_per_step: int  # query heads of one K/V head stacked as the rows of one tile
    # Batch elements per grid step, stacked like the heads; None where no bias is shared across the batch (only
    # a shared bias tile is then read once for all of them) or the inputs are read in place on the lanes.
    batch_per_step: int | None = None
    chunk_rows: int  # query rows whose scores are computed at a time within a block (all of it when it does not divide)
    row_sums_on_mxu: bool | None = None  # p @ [V | 1]; None where V's dimension is not a multiple of 128
    transpose_k: bool  # K read as (dim, keys), transposed once in HBM
    vmem_limit_bytes: int

    def __post_init__(self) -> None:
        if self.block_q < 1 or (self.block_kv is not None and self.block_kv < 1):
            raise ValueError(f"blocks hold at least one row: {self.block_q=}, {self.block_kv=}")
        if self.chunk_rows < 1:
            raise ValueError(f"{self.chunk_rows=} must be at least 1")
        if self.heads_per_step < 1:
            raise ValueError(f"{self.heads_per_step=} must be at least 1")
        if self.batch_per_step is not None and self.batch_per_step < 1:
            raise ValueError(f"{self.batch_per_step=} must be at least 1")


def _head_choices(spec: AttentionShape) -> tuple[int, ...]:
    """Query heads per grid step: divisors of the group. Only where q and the output are read in place on the
    lanes: a (heads, queries, dim) block of the (b, h, s, d) layout leaves libtpu's static profile empty (0
    cycles), and the evaluator could not time the kernel."""
    if not (in_place(spec.q_order, spec.head_dim) and in_place(spec.out_order, spec.v_dim)):
        return (1,)
    return tuple(h for h in (1, 2, 4, 8, 16) if spec.group % h == 0)


def stacks_batch(spec: AttentionShape) -> bool:
    """Whether batch elements can share a grid step: a score bias without a batch axis (one tile of it then serves
    the whole stack instead of being read again per batch element), the (b, h, s, d) layout."""
    lanes = any(in_place(order, d) for order, d in ((spec.q_order, spec.head_dim), (spec.k_order, spec.head_dim),
                                                     (spec.v_order, spec.v_dim), (spec.out_order, spec.v_dim)))
    return spec.bias is not None and "b" not in spec.bias_order and spec.batch > 1 and not lanes


def attention_space(spec: AttentionShape) -> dict[str, tuple[Any, ...]]:
    space: dict[str, tuple[Any, ...]] = {"BLOCK_Q": (128, 256, 512, 1024)}
    if not spec.square_causal:  # (square causal grids pair query and key blocks of one size)
        space["BLOCK_KV"] = (128, 256, 512, 1024)
    space["HEADS_PER_STEP"] = _head_choices(spec)
    if stacks_batch(spec):
        space["BATCH_PER_STEP"] = tuple(b for b in (1, 2, 4, 8) if spec.batch % b == 0)
    space["CHUNK_ROWS"] = (128, 256, 512, 1024)
    if spec.v_dim % 128 == 0:
        space["ROW_SUMS_ON_MXU"] = (False, True)
    # K read as (dim, keys): the scores' matmul then needs no transpose of each K block in VMEM, at the price of
    # one transpose of K in HBM.
    space["TRANSPOSE_K"] = (False, True)
    space["VMEM_LIMIT_BYTES"] = tuple(m * MiB for m in (32, 64, 100))
    return space


def choose_params(spec: AttentionShape, chip: ChipSpec) -> tuple[AttentionParams, list[str]]:
    """The brain's first choice in the space, and why (the first sentence: the roofline)."""
    space = attention_space(spec)
    square = spec.square_causal
    bq = floor_in(space["BLOCK_Q"], min(1024, spec.seq))
    bkv = bq if square else floor_in(space["BLOCK_KV"], min(512, spec.kv_seq))
    # Enough query rows per step that each K/V block feeds ~2048 rows of the MXU, from the heads that share it.
    hb = floor_in(space["HEADS_PER_STEP"], max(1, 2048 // bq))
    # A bias shared by the batch is the largest input of all (5p: 64 x 4096 x 4096 against q's 4 x 64 x 4096 x 128):
    # read per batch element, it outweighs the MXU's time; stacked, one tile serves the whole stack.
    bb = floor_in(space["BATCH_PER_STEP"], max(1, 8 // hb)) if "BATCH_PER_STEP" in space else None
    stacked = bb is not None and bb > 1
    # Measured on a v5e: chunks of rows pay against key blocks of 1024 (not of 512); the MXU's row sums pay on
    # whole blocks, the VPU's on chunks.
    # With batch elements stacked (5p: 4 of them), whole blocks ran faster than chunks: 9.51 ms against 11.10.
    rows = floor_in(space["CHUNK_ROWS"], 256 if bkv >= 1024 and not stacked else bq)
    sums_on_mxu = (rows >= bq and not stacked) if "ROW_SUMS_ON_MXU" in space else None
    flops = 4 * spec.batch * spec.heads * spec.seq * spec.kv_seq * spec.head_dim / (2 if spec.causal else 1)
    size = itemsize(spec.dtype)
    q_bytes = spec.batch * spec.heads * spec.seq * spec.head_dim * size
    kv_bytes = spec.batch * spec.kv_heads * spec.kv_seq * spec.head_dim * size * 2
    # Transposing K in HBM pays when K is small beside Q (grouped heads): one copy of K against a transpose of
    # each K block in VMEM for every query block.
    transpose_k = spec.group > 1
    reasons = [f"Attention does {flops / 1e9:.0f} GFLOP on {(q_bytes + kv_bytes) / MiB:.0f} MiB of q, k and v: "
               "compute-bound once the score matrix stays in VMEM.",
               f"Query blocks of {bq} and key blocks of {bkv}: the {hb * bq}x{bkv} f32 score tile and the "
               f"{hb * bq}x{spec.v_dim} accumulator stay in VMEM; K/V blocks are re-read once per query block."]
    if square:
        reasons.append("Causal: the grid visits only the blocks on or below the diagonal, query block i paired with "
                       "block n-1-i so that every row of the grid has n+1 steps of equal work; the mask is applied "
                       "on the diagonal blocks only. About half the work of the full matrix.")
    elif spec.causal:
        reasons.append("Causal with different query and key lengths: every block is computed and masked.")
    if spec.group > 1:
        reasons.append(f"{spec.group} query heads share each K/V head: the index map sends head h to K/V head "
                       f"h / {spec.group}, so K and V are never repeated in HBM, and {hb} of them are stacked in one "
                       f"tile so each K/V block fetched serves {hb * bq} query rows.")
    if in_place(spec.q_order, spec.head_dim):
        reasons.append("The (batch, seq, heads, dim) inputs are read in place: a block is a run of positions of "
                       "one head, its dimension on the lanes, so no transpose goes through HBM.")
    if transpose_k:
        reasons.append(f"K ({kv_bytes / 2 / MiB:.0f} MiB) is transposed once in HBM to (dim, keys), so the scores' "
                       "matmul takes each block as it comes, with no transpose in VMEM.")
    if rows < bq:
        reasons.append(f"The scores are computed {rows} query rows at a time within a block, in a rolled loop: "
                       f"a {rows}x{bkv} f32 tile at a time instead of the block's (on a v5e, at blocks of 1024 "
                       "keys, 7-15% faster; at 512 slower)."
                       + (" On the diagonal each chunk of rows multiplies only the keys up to its last row."
                          if square else ""))
    if sums_on_mxu:
        reasons.append("The softmax's row sums come from the MXU: V is extended by a column block of ones in VMEM, "
                       "so p @ [V | 1] gives the sums beside the output (a 128-wide V leaves half of v6e's 256-wide "
                       "MXU idle).")
    if spec.folded_scale != 1.0:
        reasons.append("The scale multiplies q (d columns) rather than the scores (block_kv columns).")
    if spec.bias is not None:
        reasons.append("The score bias is read one (query block x key block) tile at a time beside the scores.")
    if stacked:
        bias_bytes = spec.heads * spec.seq * spec.kv_seq * size / (2 if square else 1)
        reasons.append(f"The bias has no batch axis: {bb} batch elements share each grid step, so each of its tiles "
                       f"is read once per {bb} (~{bias_bytes * spec.batch / bb / MiB:.0f} MiB read in all "
                       f"instead of ~{bias_bytes * spec.batch / MiB:.0f}).")
    params = AttentionParams(block_q=bq, block_kv=None if square else bkv, heads_per_step=hb, batch_per_step=bb,
                             chunk_rows=rows,
                             row_sums_on_mxu=sums_on_mxu, transpose_k=transpose_k, vmem_limit_bytes=64 * MiB)
    return params, reasons
