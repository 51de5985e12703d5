"""Pallas TPU kernel source for a recognised family and a choice of parameters.

The module written is self-contained (the evaluator loads it alone), declares its TUNABLE space so the search and
the autotuner can move it without a brain, pads ragged dimensions to whole blocks outside the kernel, and tells
XLA its cost with pl.CostEstimate.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from agents.offline.expr import (
    COL,
    FULL,
    ROW,
    SCALAR,
    BlockCode,
    as_typed,
    dtype_space,
    segment_helpers,
    source_helpers,
    to_helper,
)
from agents.offline.families import Matmul, Operand, Rowwise, Spec
from agents.offline.kernel_family import FamilySpec
from agents.offline.program import Op, Program, Value, itemsize
from agents.offline.tail import tail_lines, wrapper_tail

_TRANSCENDENTAL = {"exp", "log", "log1p", "expm1", "tanh", "logistic", "sqrt", "rsqrt", "erf", "sin", "cos",
                   "exp2", "tan", "pow"}



def _tunable(space: dict[str, tuple[Any, ...]], params: dict[str, Any]) -> str:
    lines = ["# The search and the autotuner vary these (agents.tunable); the values below are this plan's.",
             "TUNABLE = {"]
    lines += [f'    "{name}": {tuple(values)!r},' for name, values in space.items()]
    lines.append("}")
    lines += [f"{name} = {params[name]!r}" for name in space]
    return "\n".join(lines)


def _header(title: str, spec: Spec) -> str:
    return (f'"""Pallas TPU kernel written by kernelbot\'s offline brain: {title}.\n\n'
            f'Recognised: {spec.describe()}.\n"""\n\nimport jax\nimport jax.numpy as jnp\nfrom jax import lax\n'
            "from jax.experimental import pallas as pl\nfrom jax.experimental.pallas import tpu as pltpu\n\n")


def _body(code: BlockCode, indent: str) -> str:
    return "\n".join(f"{indent}{line}" for line in code.lines)


def _load(operand: Operand, ref: str, where: str = "...") -> str:
    return as_typed(f"{ref}[{where}]", operand.value.dtype)


def _dtypes(values: list[Any]) -> tuple[str, ...]:
    """ELEMENTWISE_DTYPES's choices for a kernel computing `values`."""
    return dtype_space({v.dtype for v in values})


def _flops(ops: tuple[Op, ...]) -> tuple[int, int]:
    transcendental = sum(op.prim in _TRANSCENDENTAL for op in ops)
    return max(1, len(ops) - transcendental), transcendental


def _signature(n_inputs: int, n_static: int) -> list[str]:
    return [f"a{i}" for i in range(n_inputs)] + [f"s{i}" for i in range(n_static)]


def _align(dtype: str) -> int:
    return {"bfloat16": 16, "float16": 16, "int8": 32}.get(dtype, 8)


# -- rowwise ----------------------------------------------------------------------------------------------------
def up_to(values: tuple[int, ...], dim: int) -> tuple[int, ...]:
    """A block axis's values below `dim` and the first at or above it: a block is clamped to its dimension, so
    larger ones give the same kernel (a plan or a search step there would evaluate it again)."""
    first = next((v for v in values if v >= dim), None)
    return tuple(v for v in values if v < dim) + ((first,) if first is not None else ())


def rowwise_space(spec: Rowwise) -> dict[str, tuple[Any, ...]]:
    rows = math.prod(spec.main[:-1]) if len(spec.main) > 1 else 1
    blocks = (8, 16, 32, 64, 128, 256, 512, 1024, 2048)
    if spec.moved_axis is not None:  # rows are the positions after the axis: blocks of them are whole lane tiles
        rows, blocks = math.prod(spec.main[spec.moved_axis:-1]), (128, 256, 512, 1024, 2048)
    space: dict[str, tuple[Any, ...]] = {"BLOCK_ROWS": up_to(blocks, rows)}
    if not spec.reduces:
        space["BLOCK_COLS"] = up_to((128, 256, 512, 1024, 2048, 4096, 8192), spec.main[-1] if spec.main else 1)
    space["VMEM_LIMIT_BYTES"] = tuple(m * 2**20 for m in (16, 32, 64, 100))
    space["ELEMENTWISE_DTYPES"] = _dtypes([op.out for op in spec.ops] + [o.value for o in spec.operands])
    return space


def rowwise_source(spec: Rowwise, params: dict[str, Any]) -> str:
    if spec.moved_axis is not None:
        return _moved_rowwise_source(spec, params)
    names = [f"x{o.index}_ref" for o in spec.operands]
    full = next(o for o in spec.operands if o.kind == FULL)
    code = BlockCode(main=spec.main, names={}, kinds={}, lines=[], cols=f"x{full.index}_ref.shape[-1]", typed=True)
    for operand, ref in zip(spec.operands, names, strict=True):
        code.bind(operand.value, _load(operand, ref), operand.kind)
    for op in spec.ops:
        code.emit(op)
    result = code.ref(spec.output)
    ops_per_element, transcendental = _flops(spec.ops)
    out_cols = "cols_p" if spec.out_kind == FULL else "1"
    out_block = "(br, bc)" if spec.out_kind == FULL else "(br, 1)"
    out_index = "lambda i, j: (i, j)" if spec.out_kind == FULL else "lambda i, j: (i, 0)"
    shaped = {FULL: "a{i}.reshape(rows, cols)", ROW: "a{i}.reshape(rows, 1)", COL: "a{i}.reshape(1, cols)",
              SCALAR: "jnp.reshape(a{i}, (1, 1))"}
    pads = {FULL: "_padded(_padded({x}, 0, rows_p), 1, cols_p)", ROW: "_padded({x}, 0, rows_p)",
            COL: "_padded({x}, 1, cols_p)", SCALAR: "{x}"}
    specs = {FULL: "pl.BlockSpec((br, bc), lambda i, j: (i, j))", ROW: "pl.BlockSpec((br, 1), lambda i, j: (i, 0))",
             COL: "pl.BlockSpec((1, bc), lambda i, j: (0, j))", SCALAR: "pl.BlockSpec((1, 1), lambda i, j: (0, 0))"}
    args = ", ".join(_signature(spec.n_inputs, spec.n_static))
    prepared = "\n".join(f"    x{o.index} = {pads[o.kind].format(x=shaped[o.kind].format(i=o.index))}"
                         for o in spec.operands)
    in_specs = ", ".join(specs[o.kind] for o in spec.operands)
    keeps_dims = len(spec.output.shape) == len(spec.main)  # sum(..., keepdims=True): one value per row, kept 2-D
    # Rows along the last axis, or along several trailing ones merged (the same array in memory).
    first = -1 if spec.merged_from is None else spec.merged_from
    cols_of = "main[-1]" if spec.merged_from is None else f"math.prod(main[{first}:])"
    kept = "(1,)" if spec.merged_from is None else f"(1,) * (len(main) - {first})"
    reshape_back = "main" if spec.out_kind == FULL else f"main[:{first}] + {kept}" if keeps_dims else f"main[:{first}]"
    cols_choice = "cols" if spec.reduces else "_block(cols, BLOCK_COLS, 128)"
    space = rowwise_space(spec)
    helpers = source_helpers() + to_helper() + (segment_helpers() if code.segments else "")
    header = _header("a row-wise kernel", spec)
    if spec.merged_from is not None:
        header = header.replace("import jax\n", "import math\n\nimport jax\n", 1)
    return (header + _tunable(space, params) + "\n" + helpers + f'''

def _kernel({", ".join(names)}, o_ref):
{_body(code, "    ")}
    o_ref[...] = jnp.broadcast_to({result}, o_ref.shape).astype(o_ref.dtype)


def computation({args}):
    main = a{full.index}.shape
    cols = {cols_of}
    rows = a{full.index}.size // cols
    br = _block(rows, BLOCK_ROWS, {_align(full.value.dtype)})
    bc = {cols_choice}
    rows_p, cols_p = _round_up(rows, br), _round_up(cols, bc)
{prepared}
    out = pl.pallas_call(
        _kernel,
        grid=(rows_p // br, cols_p // bc),
        in_specs=[{in_specs}],
        out_specs=pl.BlockSpec({out_block}, {out_index}),
        out_shape=jax.ShapeDtypeStruct((rows_p, {out_cols}), jnp.{spec.output.dtype}),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
        cost_estimate=pl.CostEstimate(
            flops={ops_per_element} * rows * cols, transcendentals={transcendental} * rows * cols,
            bytes_accessed={" + ".join(f"x{o.index}.size * x{o.index}.dtype.itemsize" for o in spec.operands)}
            + rows * {out_cols.replace("cols_p", "cols")} * {itemsize(spec.output.dtype)}),
    )({", ".join(f"x{o.index}" for o in spec.operands)})
    return out[:rows, :{"cols" if spec.out_kind == FULL else "1"}].reshape({reshape_back})
''')


_MOVED_HELPERS = '''

def _rows(ref):
    """A (row length, positions) block of the reference's layout as rows: (positions, row length), in f32."""
    return ref[...].astype(jnp.float32).T


def _per_row(ref):
    """A (1, positions) block of per-row values as a column: (positions, 1)."""
    return jnp.broadcast_to(ref[...].astype(jnp.float32), (128, ref.shape[-1])).T[:, 0:1]


def _per_column(ref):
    """A (row length, 1) block of per-column values as a row: (1, row length)."""
    return jnp.broadcast_to(ref[...].astype(jnp.float32), (ref.shape[0], 128)).T[0:1, :]
'''


def _moved_rowwise_source(spec: Rowwise, params: dict[str, Any]) -> str:
    """The row-wise kernel for rows along axis `spec.moved_axis` of the reference's layout, viewed (before, row,
    after): a block is (row, a run of positions after it), transposed in VMEM into rows and back."""
    axis = spec.moved_axis
    names = [f"x{o.index}_ref" for o in spec.operands]
    full = next(o for o in spec.operands if o.kind == FULL)
    code = BlockCode(main=spec.main, names={}, kinds={}, lines=[], cols=f"x{full.index}_ref.shape[0]", typed=True)
    loads = {FULL: "_rows({ref})", ROW: "_per_row({ref})", COL: "_per_column({ref})", SCALAR: "{ref}[...]"}
    for operand, ref in zip(spec.operands, names, strict=True):
        loaded = loads[operand.kind].format(ref=ref)
        code.bind(operand.value, as_typed(loaded, "float32") if operand.kind != SCALAR else _load(operand, ref),
                  operand.kind)
    for op in spec.ops:
        code.emit(op)
    result = code.ref(spec.output)
    ops_per_element, transcendental = _flops(spec.ops)
    row_out = spec.out_kind == ROW
    store = ("jnp.broadcast_to({r}.astype(jnp.float32), (o_ref.shape[-1], 128)).T[0:1, :]" if row_out
             else "jnp.broadcast_to({r}, o_ref.shape[::-1]).astype(jnp.float32).T").format(r=result)
    shaped = {FULL: "_padded(a{i}.reshape(p, r, q), 2, q_p)", ROW: "_padded(a{i}.reshape(p, 1, q), 2, q_p)",
              COL: "a{i}.reshape(r, 1)", SCALAR: "jnp.reshape(a{i}, (1, 1))"}
    specs = {FULL: "pl.BlockSpec((None, r, bq), lambda i, j: (i, 0, j))",
             ROW: "pl.BlockSpec((None, 1, bq), lambda i, j: (i, 0, j))",
             COL: "pl.BlockSpec((r, 1), lambda i, j: (0, 0))", SCALAR: "pl.BlockSpec((1, 1), lambda i, j: (0, 0))"}
    prepared = "\n".join(f"    x{o.index} = {shaped[o.kind].format(i=o.index)}" for o in spec.operands)
    keeps_dims = len(spec.output.shape) == len(spec.main)
    final = "main" if not row_out else f"main[:{axis}] + (1,) + main[{axis + 1}:]" if keeps_dims \
        else f"main[:{axis}] + main[{axis + 1}:]"
    space = rowwise_space(spec)
    helpers = source_helpers() + to_helper() + (segment_helpers() if code.segments else "") + _MOVED_HELPERS
    header = _header("a row-wise kernel", spec).replace("import jax\n", "import math\n\nimport jax\n", 1)
    return (header + _tunable(space, params) + "\n" + helpers + f'''

def _kernel({", ".join(names)}, o_ref):
{_body(code, "    ")}
    o_ref[...] = {store}.astype(o_ref.dtype)


def computation({", ".join(_signature(spec.n_inputs, spec.n_static))}):
    main = a{full.index}.shape
    p, r, q = math.prod(main[:{axis}]), main[{axis}], math.prod(main[{axis + 1}:])
    bq = _block(q, BLOCK_ROWS, 128)  # positions per block: the rows of the transposed block, whole lane tiles
    q_p = _round_up(q, bq)
{prepared}
    out = pl.pallas_call(
        _kernel,
        grid=(p, q_p // bq),
        in_specs=[{", ".join(specs[o.kind] for o in spec.operands)}],
        out_specs=pl.BlockSpec((None, {"1" if row_out else "r"}, bq), lambda i, j: (i, 0, j)),
        out_shape=jax.ShapeDtypeStruct((p, {"1" if row_out else "r"}, q_p), jnp.{spec.output.dtype}),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
        cost_estimate=pl.CostEstimate(
            flops={ops_per_element} * p * r * q, transcendentals={transcendental} * p * r * q,
            bytes_accessed={" + ".join(f"x{o.index}.size * x{o.index}.dtype.itemsize" for o in spec.operands)}
            + p * {"1" if row_out else "r"} * q * {itemsize(spec.output.dtype)}),
    )({", ".join(f"x{o.index}" for o in spec.operands)})
    return out[:, :, :q].reshape({final})
''')


# -- matmul + epilogue ------------------------------------------------------------------------------------------
def matmul_space(spec: Matmul) -> dict[str, tuple[Any, ...]]:
    # A transposed left operand's rows are its lanes: blocks of them are whole lane tiles.
    rows = (128, 256, 512, 1024, 2048, 4096) if spec.lhs_transposed else (64, 128, 256, 512, 1024, 2048, 4096)
    space: dict[str, tuple[Any, ...]] = {"BLOCK_M": up_to(rows, spec.m)}
    if not spec.reduces:
        space["BLOCK_N"] = up_to((128, 256, 512, 1024, 2048, 4096), spec.n)
    space["BLOCK_K"] = up_to((128, 256, 512, 1024, 2048), spec.k)
    # Rows of the tile multiplied and finished at a time: large tiles (fewer HBM re-reads) then need VMEM for the
    # accumulator only, not for a tile-sized f32 product and epilogue temporaries besides.
    space["SUB_M"] = (128, 256, 512)
    space["VMEM_LIMIT_BYTES"] = tuple(m * 2**20 for m in (16, 32, 64, 100, 120))
    space["BUFFERS"] = (1, 2)  # Mosaic pipelines a pallas_call's inputs with one or two buffers
    space["FUSE_EPILOGUE"] = (True, False)
    # Where the running sum is kept: f32, or (for bf16 operands) bf16, half the VMEM and less accurate.
    space["ACC_DTYPE"] = ("float32", "bfloat16") if spec.lhs.value.dtype == "bfloat16" == spec.rhs.value.dtype \
        else ("float32",)
    space["ELEMENTWISE_DTYPES"] = _dtypes([spec.dot_out] + [op.out for op in spec.epilogue]
                                          + [o.value for o in spec.operands])
    return space


def _epilogue_code(spec: Matmul, acc: str, operand: str, cols: str, chunked: bool = False
                   ) -> tuple[BlockCode, str]:
    """The epilogue's lines; `chunked`: on the tile's `rows` slice (per-row and full operands sliced alike)."""
    code = BlockCode(main=spec.main, names={}, kinds={}, lines=[], cols=cols, typed=True)
    code.bind(spec.dot_out, as_typed(acc, spec.dot_out.dtype), FULL)
    for o in spec.operands:
        ref = operand.format(i=o.index)
        code.bind(o.value, _load(o, ref, "rows, :" if chunked and o.kind in (FULL, ROW) else "..."), o.kind)
    for op in spec.epilogue:
        code.emit(op)
    return code, code.ref(spec.output)


def _finish(spec: Matmul, crop: str, final: str) -> str:
    """The wrapper's last lines: the kernel's value in the reference's shape, then the reference's tail, if any."""
    if not spec.tail:
        return f"    return {crop}.reshape({final})"
    # The output's m and n before k, then the inputs' sizes.
    lines, result = wrapper_tail(spec.tail, spec.output, spec.inputs, ((1, "1"), (spec.m, "m"), (spec.n, "n"),
                                                                       (spec.k, "k")))
    return "\n".join([f"    out = {crop}.reshape({final})", *(f"    {line}" for line in lines), f"    return {result}"])


def matmul_source(spec: Matmul, params: dict[str, Any]) -> str:
    space = matmul_space(spec)
    params = {"BUFFERS": 2, "FUSE_EPILOGUE": True, "ACC_DTYPE": "float32", "SUB_M": 256, **params}
    fused, fused_result = _epilogue_code(spec, "acc_ref[rows, :]", "e{i}_ref", "acc_ref.shape[-1]", chunked=True)
    outside, outside_result = _epilogue_code(spec, "out", "e{i}", "n")
    extra = [f"e{o.index}_ref" for o in spec.operands]
    b = "None, " if spec.batched else ""
    g = "bb, " if spec.batched else ""
    kk_axis = 3 if spec.batched else 2
    buffered = "pipeline_mode=pl.Buffered(BUFFERS)"
    lhs_spec = (f"pl.BlockSpec((bk, bm), lambda i, j, kk: (kk, i), {buffered})" if spec.lhs_transposed
                else f"pl.BlockSpec(({b}bm, bk), lambda {g}i, j, kk: ({g}i, kk), {buffered})")
    rhs_spec = (f"pl.BlockSpec(({b}bn, bk), lambda {g}i, j, kk: ({g}j, kk), {buffered})" if spec.rhs_transposed
                else f"pl.BlockSpec(({b}bk, bn), lambda {g}i, j, kk: ({g}kk, j), {buffered})")
    # The contraction: lhs's last axis, or its first when it is stored (K, M); rhs's first, or last when (N, K).
    dims = f"((({0 if spec.lhs_transposed else 1},), ({1 if spec.rhs_transposed else 0},)), ((), ()))"
    lhs_rows, row_align = ("lhs_ref[:, rows]", 128) if spec.lhs_transposed \
        else ("lhs_ref[rows, :]", _align(spec.lhs.value.dtype))
    lead = "bsz, " if spec.batched else ""
    shaped = {FULL: f"a{{i}}.reshape({lead}m, n)", ROW: f"a{{i}}.reshape({lead}m, 1)", COL: "a{i}.reshape(1, n)",
              SCALAR: "jnp.reshape(a{i}, (1, 1))"}
    ax = 1 if spec.batched else 0
    pads = {FULL: f"_padded(_padded({{x}}, {ax}, m_p), {ax + 1}, n_p)", ROW: f"_padded({{x}}, {ax}, m_p)",
            COL: "_padded({x}, 1, n_p)", SCALAR: "{x}"}
    specs = {FULL: f"pl.BlockSpec(({b}bm, bn), lambda {g}i, j, kk: ({g}i, j))",
             ROW: f"pl.BlockSpec(({b}bm, 1), lambda {g}i, j, kk: ({g}i, 0))",
             COL: f"pl.BlockSpec((1, bn), lambda {g}i, j, kk: (0, j))",
             SCALAR: f"pl.BlockSpec((1, 1), lambda {g}i, j, kk: (0, 0))"}
    args = ", ".join(_signature(spec.n_inputs, spec.n_static))
    prepared = "\n".join(f"    e{o.index} = {pads[o.kind].format(x=shaped[o.kind].format(i=o.index))}"
                         for o in spec.operands)
    extra_specs = ", ".join(specs[o.kind] for o in spec.operands)
    operands = "".join(f"e{o.index}, " for o in spec.operands)
    lhs_i, rhs_i = spec.lhs.index, spec.rhs.index
    dtypes = {spec.lhs.value.dtype, spec.rhs.value.dtype}
    # XLA on TPU multiplies f32 matrices with bf16 operands and f32 accumulation at JAX's default precision, and
    # so does this kernel; only a reference that asks for HIGHEST gets full f32 products.
    to_bf16 = not spec.highest and "float32" in dtypes and dtypes <= {"float32", "bfloat16"}
    cast = ".astype(jnp.bfloat16)" if to_bf16 else "" if len(dtypes) == 1 else ".astype(jnp.float32)"
    precision = "lax.Precision.HIGHEST" if spec.highest else "None"
    # Whole rows when a fused epilogue reduces over them; unfused, the plain matmul tiles N freely.
    n_choice = "n if FUSE_EPILOGUE else _block(n, 512, 128)" if spec.reduces else "_block(n, BLOCK_N, 128)"
    row_out = spec.out_kind == ROW
    full_spec = f"pl.BlockSpec(({b}bm, bn), lambda {g}i, j, kk: ({g}i, j))"
    row_spec = f"pl.BlockSpec(({b}bm, 1), lambda {g}i, j, kk: ({g}i, 0))"
    # Unfused, the kernel returns the f32 matmul result and the epilogue runs outside it.
    extra_in = f" + ([{extra_specs}] if fused else [])" if extra_specs else ""
    out_spec = f"{row_spec} if fused else {full_spec}" if row_out else full_spec
    out_cols = "1 if fused else n_p" if row_out else "n_p"
    out_dtype = ("jnp.float32" if spec.output.dtype == "float32"
                 else f"jnp.{spec.output.dtype} if fused else jnp.float32")
    extra_args = f", *(({operands}) if fused else ())" if operands else ""
    grid = "(bsz, m_p // bm, n_p // bn, k_p // bk)" if spec.batched else "(m_p // bm, n_p // bn, k_p // bk)"
    semantics = ('("parallel", "parallel", "parallel", "arbitrary")' if spec.batched
                 else '("parallel", "parallel", "arbitrary")')
    if spec.batched:
        setup = (f"    bsz, m, k = a{lhs_i}.shape\n    n = a{rhs_i}.shape[{1 if spec.rhs_transposed else 2}]\n"
                 f"    lhs = a{lhs_i}\n")
        lhs_pad = "_padded(_padded(lhs, 1, m_p), 2, k_p)"
        rhs_pad = (f"_padded(_padded(a{rhs_i}, 1, n_p), 2, k_p)" if spec.rhs_transposed
                   else f"_padded(_padded(a{rhs_i}, 1, k_p), 2, n_p)")
        out_rows = "bsz, m_p"
        crop = f"out[:, :m, :{'1' if row_out else 'n'}]"
    else:
        n_line = f"    n = a{rhs_i}.shape[{0 if spec.rhs_transposed else 1}]\n"
        if spec.lhs_transposed:  # (K, M) as stored
            setup = f"    k, m = a{lhs_i}.shape\n{n_line}    lhs = a{lhs_i}\n"
            lhs_pad = "_padded(_padded(lhs, 0, k_p), 1, m_p)"
        else:
            setup = f"    k = a{lhs_i}.shape[-1]\n{n_line}    lhs = a{lhs_i}.reshape(-1, k)\n    m = lhs.shape[0]\n"
            lhs_pad = "_padded(_padded(lhs, 0, m_p), 1, k_p)"
        rhs_pad = (f"_padded(_padded(a{rhs_i}, 0, n_p), 1, k_p)" if spec.rhs_transposed
                   else f"_padded(_padded(a{rhs_i}, 0, k_p), 1, n_p)")
        out_rows = "m_p"
        crop = f"out[:m, :{'1' if row_out else 'n'}]"
    kept = len(spec.output.shape) - (len(spec.main) - 1)  # sum(..., keepdims=True): the row axis stays, as 1
    rows_shape = "(m,)" if spec.lhs_transposed else f"a{lhs_i}.shape[:-1]"
    final = (rows_shape + (f" + (1,) * {kept}" if kept > 0 else "")) if row_out else f"{rows_shape} + (n,)"
    ops_per_element, transcendental = _flops(spec.epilogue)
    batch = "bsz * " if spec.batched else ""
    unpack = f"        {', '.join(extra)}, = refs[:-2]\n" if extra else ""
    return (_header("a matmul with its epilogue", spec).replace("import jax\n", "import functools\n\nimport jax\n", 1)
            + _tunable(space, params) + "\n"
            + 'ACC_TYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}\n' + source_helpers() + to_helper()
            + (segment_helpers() if fused.segments or outside.segments else "") + f'''

def _kernel(lhs_ref, rhs_ref, *refs, sub):
    # refs: the epilogue's inputs (when it is fused), the output, the accumulator.
    o_ref, acc_ref = refs[-2], refs[-1]
    kk = pl.program_id({kk_axis})
    chunks = acc_ref.shape[0] // sub

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    # `sub` rows at a time, so the f32 product of a large tile never needs a tile-sized temporary.
    # The MXU accumulates in f32; a bf16 accumulator (ACC_DTYPE) rounds the running sum at every K step.
    def _accumulate(c, carry):
        rows = pl.ds(pl.multiple_of(c * sub, {row_align}), sub)
        acc_ref[rows, :] += lax.dot_general({lhs_rows}{cast}, rhs_ref[...]{cast}, {dims},
                                            precision={precision},
                                            preferred_element_type=jnp.float32).astype(acc_ref.dtype)
        return carry

    lax.fori_loop(0, chunks, _accumulate, 0)

    @pl.when(kk == pl.num_programs({kk_axis}) - 1)
    def _store():
        if not FUSE_EPILOGUE:
            o_ref[...] = acc_ref[...].astype(o_ref.dtype)
            return
{unpack}
        def _finish(c, carry):
            rows = pl.ds(pl.multiple_of(c * sub, {_align(spec.lhs.value.dtype)}), sub)
{_body(fused, "            ")}
            o_ref[rows, :] = jnp.broadcast_to({fused_result}, (sub, o_ref.shape[-1])).astype(o_ref.dtype)
            return carry

        lax.fori_loop(0, chunks, _finish, 0)


def computation({args}):
{setup}    bm = _block(m, BLOCK_M, {row_align})
    bn = {n_choice}
    bk = _block(k, BLOCK_K, 128)
    m_p, n_p, k_p = _round_up(m, bm), _round_up(n, bn), _round_up(k, bk)
{prepared}
    fused = FUSE_EPILOGUE
    sub = SUB_M if bm % SUB_M == 0 else bm
    out = pl.pallas_call(
        functools.partial(_kernel, sub=sub),
        grid={grid},
        in_specs=[{lhs_spec}, {rhs_spec}]{extra_in},
        out_specs={out_spec},
        out_shape=jax.ShapeDtypeStruct(({out_rows}, {out_cols}), {out_dtype}),
        scratch_shapes=[pltpu.VMEM((bm, bn), ACC_TYPES[ACC_DTYPE])],
        compiler_params=pltpu.CompilerParams(dimension_semantics={semantics},
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
        cost_estimate=pl.CostEstimate(
            flops={batch}(2 * m * n * k + {ops_per_element} * m * n), transcendentals={batch}{transcendental} * m * n,
            bytes_accessed=lhs.size * lhs.dtype.itemsize * (n_p // bn) + a{rhs_i}.size * a{rhs_i}.dtype.itemsize
            * (m_p // bm) + {batch}m * n * {itemsize(spec.output.dtype)}),
    )({lhs_pad}, {rhs_pad}{extra_args})
    if not fused:
        # The epilogue as XLA ops on the whole matmul result (what "no epilogue fusion" asks for).
{_body(outside, "        ")}
        out = jnp.broadcast_to({outside_result}, {outside_result}.shape).astype(jnp.{spec.output.dtype})
{_finish(spec, crop, final)}
''')


def _drawn_body(program: Program) -> list[str]:
    """The lines of a function returning the reference's own arrays for one configuration: drawn again with
    jax.random and the reference's ops on the draws where it can, else carried (bytes as hex)."""
    lines = [f"d{i} = jax.random.{d.fn}(jax.random.wrap_key_data(jnp.asarray({list(d.key_data)}, jnp.uint32)), "
             f"{d.shape}, jnp.{d.dtype}{''.join(f', {x!r}' for x in d.extra)})" for i, d in program.draws.items()]
    names = {i: f"d{i}" for i in program.draws}
    if program.prologue:
        lines += tail_lines(tuple(program.prologue), names, {})[0]
        names |= {op.out.id: f"t{op.out.id}" for op in program.prologue}
    arrays = [names[a.id] if isinstance(a, Value) else f"_carried({np.asarray(a).dtype.name!r}, "
              f"{tuple(np.shape(a))}, {np.ascontiguousarray(a).tobytes().hex()!r})" for a in program.drawn]
    return lines + [f"return [{', '.join(arrays)}]"]


def with_drawn(kernel: str, programs: list[Program]) -> str:
    """The kernel of a reference that makes arrays itself (`Program.drawn`): the family's code takes them as inputs
    after the reference's own; a wrapper with the reference's signature makes them. When they differ between the
    configurations the reference was read at (they depend on its input shapes), the wrapper knows each and takes
    those configurations only; else it makes one set, for whatever shapes the kernel's code accepts."""
    first = programs[0]
    if first.given is None or first.given == len(first.inputs):
        return kernel
    given, n_static = first.given, len(first.static)
    bodies: dict[str, list[str]] = {}
    for p in programs:
        key = repr((tuple(tuple(v.shape) for v in p.inputs[:p.given]), tuple(p.static)))
        bodies.setdefault(key, _drawn_body(p))
    kinds = list(dict.fromkeys("\n".join(b) for b in bodies.values()))
    functions = "\n\n\n".join(f"def _drawn_{i}():\n" + "\n".join(f"    {line}" for line in text.splitlines())
                               for i, text in enumerate(kinds))
    call = ", ".join([f"a{i}" for i in range(given)] + ["*drawn"] + [f"s{i}" for i in range(n_static)])
    if len(kinds) == 1:
        table, choose = "", "    drawn = _drawn_0()"
    else:
        shapes = "".join(f"a{i}.shape, " for i in range(given))
        statics = "".join(f"s{i}, " for i in range(n_static))
        entries = "\n".join(f"    {key!r}: _drawn_{kinds.index(chr(10).join(b))}," for key, b in bodies.items())
        table = f"\n\n_DRAWN = {{\n{entries}\n}}\n"
        choose = f"""    key = repr((({shapes}), ({statics})))
    if key not in _DRAWN:
        raise ValueError(f"this kernel makes the reference's own arrays for {{list(_DRAWN)}} only, not {{key}}")
    drawn = _DRAWN[key]()"""
    carried = '''

import numpy as np  # noqa: E402 - for the arrays carried below


def _carried(dtype, shape, data):
    return jnp.asarray(np.frombuffer(bytes.fromhex(data), dtype=np.dtype(dtype)).reshape(shape))
''' if "_carried(" in functions else ""
    return kernel.replace("\ndef computation(", "\ndef _computation_taking_drawn(", 1) + f'''

# The arrays the reference makes itself (its own weights, the same on every call), made as it makes them where a
# wrapper can, else carried. The kernel above takes them as inputs after the reference's own.{carried}


{functions}
{table}

def computation({", ".join(_signature(given, n_static))}):
{choose}
    return _computation_taking_drawn({call})
'''


def source(spec: Spec, params: dict[str, Any]) -> str:
    if isinstance(spec, FamilySpec):
        return spec.source(params, _header(spec.family, spec), _tunable(spec.space(), params) + "\n")
    return matmul_source(spec, params) if isinstance(spec, Matmul) else rowwise_source(spec, params)


def space_of(spec: Spec) -> dict[str, tuple[Any, ...]]:
    if isinstance(spec, FamilySpec):
        return spec.space()
    return matmul_space(spec) if isinstance(spec, Matmul) else rowwise_space(spec)
