"""Choosing a kernel's parameters from the roofline and the VMEM budget, with the reasons, for the plan.

Pure: a spec and a chip in, parameters and sentences out.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from agents.offline.emit import space_of
from agents.offline.expr import NotRecognised, default_dtypes
from agents.offline.families import Matmul, Rowwise, Spec
from agents.offline.kernel_family import FamilySpec, floor_in
from agents.offline.program import Program, Value, itemsize
from storage.settings import EvalLimits
from tpu_runner.hardware import ChipSpec
from tpu_runner.timing import GRID_STEP_CYCLES, HBM_EFFICIENCY

MiB = 2**20
DEFAULT_VMEM_LIMIT = 64 * MiB
VMEM_FILL = 0.92  # the share of a scoped VMEM limit the modelled tiles may take (the compiler needs some)
BLOCK_TARGET_BYTES = 2 * MiB  # a streamed block long enough to reach HBM bandwidth, small enough to double-buffer


# How the compiler says a kernel's scoped VMEM did not fit: "Scoped allocation with size 68.00M and limit 64.00M".
_SCOPED_VMEM = re.compile(r"Scoped allocation with size ([\d.]+)([KMG]) and limit [\d.]+[KMG]")
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}


def raised_vmem_limit(params: dict[str, Any], space: dict[str, tuple[Any, ...]], error: str,
                      vmem_bytes: int) -> dict[str, Any] | None:
    """The same parameters with VMEM_LIMIT_BYTES raised to the smallest declared value that holds the scoped
    allocation the compiler's error names, within the chip's VMEM; None when the error names none or no value
    fits. Keeping the blocks is the point: a larger tile that only lacked the limit may be the faster kernel."""
    found = _SCOPED_VMEM.search(error)
    if found is None or "VMEM_LIMIT_BYTES" not in space:
        return None
    need = float(found.group(1)) * _UNITS[found.group(2)]
    current = params.get("VMEM_LIMIT_BYTES") or 0
    fits = sorted(v for v in space["VMEM_LIMIT_BYTES"]
                  if isinstance(v, int) and v > current and need <= v <= vmem_bytes)
    return {**params, "VMEM_LIMIT_BYTES": fits[0]} if fits else None


def _with_dtypes(params: dict[str, Any], reasons: list[str], space: dict[str, tuple[Any, ...]],
                 chip: ChipSpec) -> tuple[dict[str, Any], list[str]]:
    """The plan's ELEMENTWISE_DTYPES, and why."""
    choice = default_dtypes(chip.name, space["ELEMENTWISE_DTYPES"])
    if "reference" in space["ELEMENTWISE_DTYPES"]:
        reasons.append("The elementwise work is computed in the reference's own dtypes (bf16 stays bf16), as XLA "
                       f"computes it: {chip.name}'s VPU has bf16 lanes, twice the f32 rate." if choice == "reference"
                       else f"The elementwise work is computed in f32: {chip.name}'s VPU has no bf16 lanes.")
    return {**params, "ELEMENTWISE_DTYPES": choice}, reasons


def rowwise_params(spec: Rowwise, chip: ChipSpec) -> tuple[dict[str, Any], list[str]]:
    space = space_of(spec)
    cols = spec.main[-1]
    rows = max(1, int(round(math.prod(spec.main) / cols)))
    width = cols if spec.reduces else min(cols, 2048)
    params: dict[str, Any] = {}
    reasons = [f"Row reductions need whole rows in VMEM, so a block is rows x all {cols} columns." if spec.reduces
               else "Elementwise work tiles freely; blocks of up to 2048 lanes keep stores lane-dense."]
    if not spec.reduces:
        params["BLOCK_COLS"] = floor_in(space["BLOCK_COLS"], width)
        width = min(cols, params["BLOCK_COLS"])
    if spec.moved_axis is not None:  # transposed in VMEM, a row takes whole lane tiles
        width = max(width, 128)
    per_row = width * 4 * max(1, sum(o.kind == "full" for o in spec.operands) + 1)
    params["BLOCK_ROWS"] = floor_in(space["BLOCK_ROWS"], max(8, BLOCK_TARGET_BYTES // per_row))
    # Rows rewritten (moved or merged axes): 32 MiB holds the blocks, and at 64 the v5e compiles of a softmax over
    # 64 channels (32 MB of input) and an instance norm (64 MB) ran out of VMEM beside XLA's own temporaries.
    rewritten = spec.moved_axis is not None or spec.merged_from is not None
    params["VMEM_LIMIT_BYTES"] = 32 * MiB if rewritten else DEFAULT_VMEM_LIMIT
    working = params["BLOCK_ROWS"] * per_row / MiB
    reasons.append(f"The task is memory-bound (about {len(spec.ops)} ops per element), so the block size is set by "
                   f"bytes: {params['BLOCK_ROWS']} rows x {width} columns is ~{working:.1f} MiB of f32 working set "
                   "per step, double-buffered well inside a "
                   f"{params['VMEM_LIMIT_BYTES'] // MiB} MiB scoped VMEM limit ({chip.vmem_bytes // MiB} MiB on "
                   f"{chip.name}).")
    if spec.merged_from is not None:
        reasons.append(f"The rows run along the reference's axes {spec.merged_from} to the last, merged into one: "
                       "the same array in memory, read as stored.")
    if spec.moved_axis is not None:
        reasons.append(f"The rows run along axis {spec.moved_axis} of the reference's layout: a block is that axis by "
                       "a run of the positions after it, read as stored and transposed in VMEM into rows (and the "
                       "result back), so no transpose passes through HBM.")
    if rows % params["BLOCK_ROWS"]:
        reasons.append(f"{rows} rows are not a multiple of the block; the input is padded to whole blocks.")
    return _with_dtypes(params, reasons, space, chip)


@dataclass(frozen=True)
class MatmulTile:
    bm: int
    bn: int
    bk: int
    sub: int
    limit: int
    vmem: int
    traffic: int
    steps: int
    memory_s: float
    seconds: float


def _matmul_tile(spec: Matmul, chip: ChipSpec, space: dict[str, tuple[Any, ...]]) -> MatmulTile | None:
    """The tile the time model likes best: max(MXU time, HBM traffic at the usable bandwidth) plus a fixed cost
    per grid step, among the tiles whose VMEM (double-buffered inputs, f32 accumulator, double-buffered output
    and epilogue operand blocks, the epilogue's f32 temporaries on SUB_M rows) fits a declared limit."""
    in_bytes, out_bytes = itemsize(spec.lhs.value.dtype), itemsize(spec.output.dtype)
    batch = max(1, math.prod(spec.main) // (spec.m * spec.n))
    compute = 2 * batch * spec.m * spec.n * spec.k / chip.peak_for(spec.lhs.value.dtype)
    full_bytes = sum(itemsize(o.value.dtype) for o in spec.operands if o.kind == "full")
    limits = sorted(v for v in space["VMEM_LIMIT_BYTES"] if v <= chip.vmem_bytes)
    tiles: list[MatmulTile] = []
    out_cols = 128 if spec.out_kind == "row" else None
    widths = (spec.n,) if spec.reduces else tuple(b for b in space["BLOCK_N"] if b <= max(128, spec.n))
    for bm in (b for b in space["BLOCK_M"] if b <= max(64, spec.m)):
        for bn in widths:
            for bk in (b for b in space["BLOCK_K"] if b <= max(128, spec.k)):
                # The largest SUB_M whose f32 temporaries fit beside the tiles (a per-row output is a (bm, 1)
                # block, laid out over one lane tile).
                base = (2 * (bm * bk + bk * bn) * in_bytes + bm * bn * 4
                        + 2 * bm * ((out_cols or bn) * out_bytes + bn * full_bytes))
                subs = [c for c in sorted(space["SUB_M"], reverse=True) if bm % c == 0 and c < bm] or [bm]
                # Mosaic reuses the epilogue's temporaries: about one f32 (SUB_M, bn) slab beside the tiles (26k's
                # 1024 x 8192 tile with a full-size operand used 105 MiB where the tiles alone come to 104).
                fits = [(c, base + c * bn * 4, next((v for v in limits if base + c * bn * 4 <= VMEM_FILL * v),
                                                    None)) for c in subs]
                sub, vmem, limit = next((f for f in fits if f[2] is not None), (subs[-1], 0, None))
                if limit is None:
                    continue
                m_p, n_p, k_p = (-(-spec.m // bm) * bm, -(-spec.n // bn) * bn, -(-spec.k // bk) * bk)
                traffic = batch * (m_p * k_p * in_bytes * (n_p // bn) + k_p * n_p * in_bytes * (m_p // bm)
                                   + m_p * (1 if out_cols else n_p) * out_bytes + m_p * n_p * full_bytes)
                steps = batch * (m_p // bm) * (n_p // bn) * (k_p // bk)
                memory = traffic / (chip.hbm_bandwidth * HBM_EFFICIENCY)
                seconds = max(compute * (m_p * n_p * k_p) / (spec.m * spec.n * spec.k), memory) \
                    + steps * GRID_STEP_CYCLES / chip.clock_hz
                tiles.append(MatmulTile(bm, bn, bk, sub, limit, vmem, traffic, steps, memory, seconds))
    if not tiles:
        return None
    # Among the tiles within 2% of the best time, the smallest: less VMEM, and the evaluator can check a kernel
    # at derived shapes only as small as its blocks (a multiple of each), within its interpret-mode budget.
    if not spec.reduces:  # (whole rows follow the array: N is not a block there)
        full = sum(o.kind == "full" for o in spec.operands)
        checkable = [t for t in tiles if t.bm * t.bk + t.bk * t.bn + t.bm * t.bn * (1 + full) + 8 * t.bn
                     <= EvalLimits.full_check_elements]
        tiles = checkable or tiles
    fastest = min(t.seconds for t in tiles)
    return min((t for t in tiles if t.seconds <= 1.02 * fastest),
               key=lambda t: (t.bm * t.bn + t.bk * (t.bm + t.bn), t.seconds))


def matmul_params(spec: Matmul, chip: ChipSpec) -> tuple[dict[str, Any], list[str]]:
    space = space_of(spec)
    in_bytes = itemsize(spec.lhs.value.dtype)
    flops = 2 * spec.m * spec.n * spec.k
    peak = chip.peak_for(spec.lhs.value.dtype)
    ideal_bytes = (spec.m * spec.k + spec.k * spec.n) * in_bytes + spec.m * spec.n * itemsize(spec.output.dtype)
    intensity = flops / ideal_bytes
    ridge = peak / chip.hbm_bandwidth
    params: dict[str, Any] = {}
    reasons = [f"{flops / 1e9:.1f} GFLOP over at least {ideal_bytes / MiB:.0f} MiB: arithmetic intensity "
               f"{intensity:.0f} FLOP/byte against {chip.name}'s ridge point of {ridge:.0f}, so the kernel is "
               f"{'compute' if intensity > ridge else 'memory'}-bound at best."]
    tile = _matmul_tile(spec, chip, space)
    if tile is None:
        raise NotRecognised(f"no matmul tile of {spec.m}x{spec.n} fits {chip.name}'s VMEM with whole rows of "
                            f"{spec.n} columns")
    params.update({"BLOCK_M": tile.bm, "BLOCK_K": tile.bk, "SUB_M": tile.sub, "VMEM_LIMIT_BYTES": tile.limit})
    if not spec.reduces:
        params["BLOCK_N"] = tile.bn
    rows = (f"The epilogue reduces over rows, so each block holds whole rows of {spec.n} columns; "
            if spec.reduces else "")
    reasons.append(
        f"{rows}Tiles of {tile.bm}x{tile.bn} with K steps of {tile.bk}, chosen by the time model over the "
        f"space: HBM traffic A x {-(-spec.n // tile.bn)} + B x {-(-spec.m // tile.bm)} re-reads is "
        f"{tile.traffic / MiB:.0f} MiB ({tile.memory_s * 1e3:.3g} ms at {chip.name}'s usable bandwidth) against "
        f"{flops / peak * 1e3:.3g} ms of MXU work and {tile.steps} grid steps; the double-buffered tiles, the "
        f"f32 accumulator and the output blocks take ~{tile.vmem / MiB:.0f} MiB of VMEM under a "
        f"{tile.limit // MiB} MiB scoped limit, the epilogue finishing {tile.sub} rows at a time.")
    if in_bytes == 2:
        reasons.append("bf16 operands go to the MXU as bf16 with f32 accumulation (preferred_element_type).")
    elif not spec.highest:
        reasons.append("f32 operands are rounded to bf16 for the MXU with f32 accumulation, as XLA computes a "
                       "default-precision f32 matmul on TPU (a reference asking for precision=HIGHEST would get "
                       "full f32 products, at a third of the rate or less).")
    else:
        reasons.append("The reference asks for precision=HIGHEST, so the products stay in full f32 (several MXU "
                       "passes), as XLA computes them.")
    if spec.epilogue:
        reasons.append(f"The {len(spec.epilogue)}-op epilogue runs on the accumulator in VMEM at the last K "
                       "step, so the matmul result never goes to HBM and back.")
    return _with_dtypes(params, reasons, space, chip)


def cost_line(program: Program, chip: ChipSpec) -> str:
    """FLOPs, compulsory bytes and the roofline class of the reference's program on the chip."""
    flops = 0.0
    for op in program.ops:
        if op.prim == "dot_general":
            (lhs_contract, _), _ = op.params["dimension_numbers"]
            lhs = op.args[0]
            depth = math.prod(tuple(lhs.shape[d] for d in lhs_contract)) if isinstance(lhs, Value) else 1
            flops += 2.0 * op.out.size * depth
        else:
            flops += max((a.size for a in op.args if isinstance(a, Value)), default=op.out.size)
    moved = sum(v.size * itemsize(v.dtype) for v in program.inputs)
    moved += sum(v.size * itemsize(v.dtype) for v in program.outputs if isinstance(v, Value))
    dtype = program.inputs[0].dtype if program.inputs else "float32"
    peak = chip.peak_for(dtype)
    seconds = max(flops / peak, moved / chip.hbm_bandwidth)
    bound = "compute" if flops / peak > moved / chip.hbm_bandwidth else "memory"
    return (f"{flops / 1e9:.3g} GFLOP and {moved / 2**20:.0f} MiB that must cross HBM (inputs read once, output "
            f"written once): {flops / max(moved, 1):.1f} FLOP/byte against a ridge of "
            f"{peak / chip.hbm_bandwidth:.0f}, so {bound}-bound, roofline {seconds * 1e3:.3g} ms on {chip.name}.")


def choose(spec: Spec, chip: ChipSpec) -> tuple[dict[str, Any], list[str]]:
    if isinstance(spec, FamilySpec):
        return spec.params(chip)
    return matmul_params(spec, chip) if isinstance(spec, Matmul) else rowwise_params(spec, chip)
