"""The search's library of TPU optimisation strategies.

Each strategy is advice an LLM implementer can apply to a kernel; the ones that amount to moving a tunable
parameter (a larger tile, a deeper pipeline) also carry that move, so they apply without any brain to a
kernel that declares its TUNABLE space (agents.tunable).
"""

from __future__ import annotations

from dataclasses import dataclass

from agents import tunable

MATMULS = ("matmul", "matmul_epilogue", "batched_matmul")
ROWS = ("row_reduction", "elementwise")
ATTENTION = ("attention",)


@dataclass(frozen=True)
class Move:
    roles: tuple[str, ...]  # tunables whose role ends with one of these (tunable.role)
    direction: int  # +1: the next value in the declared list, -1: the previous one


@dataclass(frozen=True)
class Strategy:
    id: str
    title: str
    category: str  # tiling | pipelining | memory | compute | fusion | grid | numerics | attention
    advice: str  # what to do and why, for an implementer
    families: tuple[str, ...] = ()  # empty: any family
    move: Move | None = None

    def applies_to(self, family: str | None) -> bool:
        return not self.families or family is None or family in self.families

    def apply(self, params: tunable.Params, space: tunable.Space) -> tunable.Params | None:
        """The parameters after this strategy's move, or None when it has none or nothing moves."""
        if self.move is None:
            return None
        return tunable.step(params, space, self.move.roles, self.move.direction)


def _tile(axis: str, grow: bool, families: tuple[str, ...], why: str) -> Strategy:
    verb = "grow" if grow else "shrink"
    return Strategy(
        id=f"{verb}_block_{axis.lower()}", title=f"{'Larger' if grow else 'Smaller'} {axis} tile",
        category="tiling", families=families, move=Move((f"BLOCK_{axis}",), 1 if grow else -1),
        advice=f"{'Increase' if grow else 'Decrease'} the block size along {axis}, keeping it a multiple of 8 "
               f"(sublanes) or 128 (lanes) and a divisor of the dimension. {why}")


LIBRARY: tuple[Strategy, ...] = (
    _tile("M", True, MATMULS, "Fewer, larger tiles raise arithmetic intensity: each B tile is re-read from HBM "
          "once per M tile, so traffic on B falls as the M tile grows, until VMEM runs out."),
    _tile("M", False, MATMULS, "Smaller M tiles cut VMEM use and give megacore more parallel grid steps."),
    _tile("N", True, MATMULS, "A wider N tile re-reads A fewer times and keeps stores lane-dense."),
    _tile("N", False, MATMULS, "A narrower N tile fits double buffering in VMEM when the tiles are too big."),
    _tile("K", True, MATMULS, "A deeper K tile amortises the per-grid-step overhead (~0.35 us) over more MXU work "
          "and touches the accumulator fewer times."),
    _tile("K", False, MATMULS, "A shallower K tile shortens each DMA, so the pipeline starts sooner and VMEM "
          "pressure falls."),
    _tile("ROWS", True, ROWS + ("matmul_epilogue",), "More rows per block means fewer grid steps; row-wise "
          "kernels are memory bound and want blocks of 1-4 MiB."),
    _tile("ROWS", False, ROWS + ("matmul_epilogue",), "Fewer rows per block leaves room for double buffering "
          "and more parallel steps for both TensorCores."),
    _tile("COLS", True, ROWS, "Wider column blocks make each DMA longer and every store lane-dense."),
    _tile("COLS", False, ROWS, "Narrower column blocks reduce VMEM per step when rows are very long."),
    _tile("Q", True, ATTENTION, "A taller query block re-reads K and V fewer times per head."),
    _tile("Q", False, ATTENTION, "A shorter query block lowers VMEM use for the score matrix."),
    _tile("KV", True, ATTENTION, "A longer KV block does more MXU work per online-softmax rescale."),
    _tile("KV", False, ATTENTION, "A shorter KV block skips more fully-masked blocks in causal attention."),
    _tile("VOCAB", True, ("row_reduction",), "A wider vocabulary block means fewer passes of the running "
          "max and sum."),
    Strategy("bigger_blocks_by_bytes", "Target larger blocks in bytes", "tiling", families=ROWS,
             move=Move(("BLOCK_BYTES", "BLOCK_BYTES_F32"), 1),
             advice="Size blocks by bytes (1-4 MiB per input block) rather than by rows, so every dtype and width "
                    "gets DMAs long enough to reach HBM bandwidth."),
    Strategy("smaller_blocks_by_bytes", "Target smaller blocks in bytes", "tiling", families=ROWS,
             move=Move(("BLOCK_BYTES", "BLOCK_BYTES_F32"), -1),
             advice="Smaller byte-sized blocks leave VMEM for double buffering and give more grid steps to split "
                    "across cores."),
    Strategy("deeper_pipeline", "Deeper input buffering", "pipelining", move=Move(("BUFFERS",), 1),
             advice="Double-buffer the streamed inputs (pipeline_mode=pl.Buffered(2), the default) so the next "
                    "block's DMA overlaps this block's work."),
    Strategy("shallower_pipeline", "Shallower input buffering", "pipelining", move=Move(("BUFFERS",), -1),
             advice="Single-buffer an input (pipeline_mode=pl.Buffered(1)) whose block index rarely changes, to "
                    "free VMEM for larger tiles."),
    Strategy("raise_vmem_limit", "Raise the scoped VMEM limit", "memory", move=Move(("VMEM_LIMIT_BYTES",), 1),
             advice="Set vmem_limit_bytes in pltpu.CompilerParams above the 16/32 MiB default so larger tiles "
                    "and double buffers compile (v5e/v6e have 128 MiB of VMEM, v5p 95 MiB)."),
    Strategy("lower_vmem_limit", "Lower the scoped VMEM limit", "memory", move=Move(("VMEM_LIMIT_BYTES",), -1),
             advice="A smaller scoped VMEM limit leaves room to XLA fusions around the kernel."),
    Strategy("f32_accumulator_scratch", "f32 accumulator in VMEM scratch", "memory", families=MATMULS,
             advice="Accumulate partial products in a pltpu.VMEM((bm, bn), jnp.float32) scratch, zeroed under "
                    "pl.when(k == 0) and written out under pl.when(k == last), instead of re-reading the output."),
    Strategy("reduction_axis_last", "Reduction axis last and arbitrary", "grid",
             advice="Put the reduction (K) axis last in the grid and mark it 'arbitrary' in dimension_semantics; "
                    "mark the others 'parallel' so megacore chips split them across TensorCores."),
    Strategy("grid_order_reuse", "Order the grid for operand reuse", "grid", families=MATMULS,
             advice="Order grid axes so the operand whose block index does not change between consecutive steps "
                    "is the larger one: Pallas skips the DMA when a block index repeats."),
    Strategy("lane_dense_output", "Lane-dense output blocks", "memory",
             advice="Make the output block's last dimension a multiple of 128 (reshape or transpose outside the "
                    "kernel if needed): masked partial stores are several times slower."),
    Strategy("mxu_native_dtype", "Feed the MXU bf16, accumulate in f32", "compute", families=MATMULS + ATTENTION,
             advice="Keep bf16 operands as bf16 into jnp.dot with preferred_element_type=jnp.float32; casting to "
                    "f32 first runs the MXU at a fraction of its bf16 rate."),
    Strategy("avoid_transposes", "Contract without transposes", "compute", families=MATMULS + ATTENTION,
             advice="Use lax.dot_general with dimension numbers (e.g. contracting the last axes of q and k) instead "
                    "of transposing a block in VMEM; XLU transposes compete with the MXU."),
    Strategy("fuse_epilogue", "Fuse the epilogue into the kernel", "fusion", families=("matmul_epilogue",),
             move=Move(("FUSE_EPILOGUE",), -1),  # (True, False): towards True
             advice="Apply bias, activation, scaling and row reductions to the f32 accumulator in VMEM before the "
                    "single store, instead of writing the matmul result to HBM and reading it back."),
    Strategy("fuse_passes", "One pass instead of several", "fusion", families=ROWS,
             advice="Compute every statistic a row needs (max and sum, or mean and mean of squares) in one pass over "
                    "the block held in VMEM; each extra pass over HBM costs a full read."),
    Strategy("online_softmax", "Online (flash) softmax", "attention", families=ATTENTION + ("matmul_epilogue",),
             advice="Keep running max and sum in VMEM scratch and rescale the accumulator per KV block, so the "
                    "score matrix never leaves VMEM."),
    Strategy("causal_block_skip", "Skip fully-masked blocks", "attention", families=ATTENTION,
             advice="Under pl.when, skip KV blocks entirely above the causal diagonal and apply the mask only on "
                    "blocks that straddle it; that halves the work of causal attention."),
    Strategy("gqa_kv_reuse", "Share K/V blocks across grouped heads", "attention", families=ATTENTION,
             advice="Process all query heads of a KV group in one grid step so each K/V block is loaded once per "
                    "group rather than once per query head."),
    Strategy("reciprocal_multiply", "Multiply by a reciprocal", "numerics",
             advice="Replace divisions by a per-row denominator with one pl.reciprocal (approx=True where the "
                    "tolerance allows) and a multiply; the VPU divides slowly."),
    Strategy("f32_transcendentals", "Transcendentals in f32", "numerics",
             advice="Compute exp, log, tanh and erf in f32 even for bf16 data: v5e has no bf16 VPU/EUP, and f32 "
                    "keeps softmax and GELU within tolerance."),
    Strategy("hoist_invariants", "Hoist loop-invariant work", "compute",
             advice="Load per-column parameters (bias, gamma, beta) once per block with their own BlockSpec whose "
                    "index does not change along the inner axis, and compute constants outside the kernel body."),
    Strategy("fewer_grid_steps", "Fewer grid steps", "grid",
             advice="Each grid step costs ~0.35 us of overhead: merge small blocks (or batch and head axes into one "
                    "block) until a step moves at least a few hundred KiB."),
    Strategy("megacore_parallel", "Expose parallelism to both TensorCores", "grid",
             advice="On v4/v5p (two TensorCores per chip) make sure a 'parallel' grid axis has an even, large "
                    "extent, so the grid splits evenly across cores."),
    Strategy("cost_estimate", "Tell XLA the kernel's cost", "compute",
             advice="Pass pl.CostEstimate(flops, transcendentals, bytes_accessed) to pallas_call so XLA schedules "
                    "the surrounding program around the kernel sensibly."),
    Strategy("pad_to_tiles", "Pad to (8, 128) tiles", "memory",
             advice="Pad ragged dimensions to multiples of (8, 128) outside the kernel (or mask the tail block) so "
                    "every block is a whole number of vreg tiles."),
)

BY_ID = {s.id: s for s in LIBRARY}


def for_family(family: str | None) -> list[Strategy]:
    return [s for s in LIBRARY if s.applies_to(family)]


def get(strategy_id: str) -> Strategy:
    try:
        return BY_ID[strategy_id]
    except KeyError:
        raise KeyError(f"no strategy {strategy_id!r}; the library has {', '.join(sorted(BY_ID))}") from None
