"""HBM traffic of every `pallas_call` in a traced computation, from its grid and BlockSpecs alone.

The Pallas TPU pipeline walks the grid in row-major order (last axis fastest). It fetches an input block at
the first step and whenever the block index differs from the previous step's, and writes an output block back
when its index changes and at the end. So an operand's DMA count is the number of runs of equal consecutive
block indices over the grid. The candidate's own `pl.CostEstimate` is read only for reporting: it could
understate.

How each operand is counted, by memory space:
- VMEM (the default): runs of its block index; `block_bytes * buffer_count` of VMEM (2 buffers unless
  `pipeline_mode=pl.Buffered(n)`).
- SMEM: runs of its block index as well (a whole-array SMEM operand has a constant index: read once); no VMEM.
- ANY / HBM: the kernel moves the data itself, so the grid says nothing; the whole array once is counted as a
  lower bound and the call is marked inexact.
- Scalar-prefetch operands: read once into SMEM. When an index map reads them, its block indices are unknown
  before run time: every grid step is counted as a DMA (an upper bound) and the call is marked inexact.

Block bytes are whole blocks: a ragged edge block is counted at full size (a slight overestimate).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import jax
import jax.extend as jex

from tpu_runner.analysis.grid_walk import (
    MANUAL_SPACES,
    block_dim,
    block_runs,
    call_name,
    space_name,
    static_grid,
)
from tpu_runner.analysis.jaxpr_walk import eqn_flops

DEFAULT_BUFFER_COUNT = 2  # the Pallas TPU pipeline double-buffers every blocked operand
_VMEM_SPACES = frozenset({"vmem", "default"})
_SEMAPHORE_SPACE = "semaphore_mem"
_MESH_KERNEL = "mpmd_map"  # what `pl.kernel(..., mesh=...)` and `pl.core_map` trace to in jax 0.12


@dataclass(frozen=True)
class OperandTraffic:
    role: str  # "input" | "output"
    shape: tuple[int, ...]  # full array shape
    dtype: str
    block_shape: tuple[int | None, ...]  # None for squeezed dims
    block_bytes: int  # bytes of one block (the whole array for SMEM-resident and manual operands)
    transfers: int  # block DMAs over the whole grid
    bytes: int  # transfers * block_bytes
    buffer_count: int  # VMEM pipeline buffers; 0 when the operand takes no VMEM (SMEM, ANY, HBM)
    in_hbm_manual: bool  # memory space ANY/HBM: the kernel moves the data itself
    memory_space: str = "vmem"  # "vmem" | "smem" | "any" | "hbm" | ...


@dataclass(frozen=True)
class PallasCallTraffic:
    name: str
    grid: tuple[int, ...]
    grid_steps: int
    operands: tuple[OperandTraffic, ...]
    scratch_bytes: int  # VMEM scratch
    vmem_bytes: int  # sum(block_bytes * buffer_count) + scratch_bytes
    hbm_bytes: int  # sum of operand bytes (manual operands: the whole array once, a lower bound)
    io_bytes: int  # full input and output array sizes, what XLA counts for the custom call
    claimed_bytes: float | None  # the candidate's cost_estimate, for reporting only
    claimed_flops: float | None
    exact: bool
    multiplicity: int  # runs per computation (scan trip counts multiplied); 1 normally
    mxu_passes: int = 1  # bf16 MXU passes per product of its widest dot (`mxu_passes`)
    # The most dot FLOPs one grid step can do, read from its body (every pl.when taken); None where a loop's trip
    # count is a run-time value. Times the steps, the most work the call can do: what the IR says, not a claim.
    step_flops: float | None = None

    @property
    def most_flops(self) -> float | None:
        return None if self.step_flops is None else self.step_flops * self.grid_steps * self.multiplicity


@dataclass(frozen=True)
class TrafficReport:
    calls: tuple[PallasCallTraffic, ...]

    @property
    def total_hbm_bytes(self) -> int:
        return sum(call.hbm_bytes * call.multiplicity for call in self.calls)

    @property
    def total_io_bytes(self) -> int:
        return sum(call.io_bytes * call.multiplicity for call in self.calls)

    @property
    def exact(self) -> bool:
        return all(call.exact for call in self.calls)

    @property
    def max_vmem_bytes(self) -> int:
        return max((call.vmem_bytes for call in self.calls), default=0)

    @property
    def mxu_passes(self) -> int:
        return max((call.mxu_passes for call in self.calls), default=1)

    @property
    def most_flops(self) -> float | None:
        """The most dot FLOPs the kernels can do, from their bodies and grids; None where one's is not known."""
        each = [call.most_flops for call in self.calls]
        return None if any(f is None for f in each) else float(sum(each))  # type: ignore[misc]


def pallas_traffic(closed_jaxpr: Any) -> TrafficReport:
    """The traffic of every pallas_call in `jax.make_jaxpr(fn)(*args)`, at any depth of nesting."""
    return TrafficReport(calls=tuple(_walk(closed_jaxpr, multiplicity=1, exact=True)))


# --- walking the jaxpr ------------------------------------------------------------------------------------


def _walk(jaxpr: Any, *, multiplicity: int, exact: bool) -> list[PallasCallTraffic]:
    calls: list[PallasCallTraffic] = []
    for eqn in _eqns(jaxpr):
        prim = eqn.primitive.name
        if prim in ("pallas_call", _MESH_KERNEL):
            call = _pallas_call_traffic(eqn) if prim == "pallas_call" else _mesh_kernel_traffic(eqn)
            calls.append(replace(call, multiplicity=multiplicity, exact=call.exact and exact))
        elif prim == "cond":
            # One branch runs; count the heaviest so the estimate is not optimistic.
            branches = [_walk(b, multiplicity=multiplicity, exact=exact) for b in eqn.params["branches"]]
            calls.extend(max(branches, key=_weighted_hbm_bytes, default=[]))
        elif prim == "scan":
            for sub in _sub_jaxprs(eqn.params):
                calls.extend(_walk(sub, multiplicity=multiplicity * int(eqn.params["length"]), exact=exact))
        elif prim == "while":
            # The trip count is a run-time value: count one trip and say the figure is not exact.
            for sub in _sub_jaxprs(eqn.params):
                calls.extend(_walk(sub, multiplicity=multiplicity, exact=False))
        else:  # jit, custom_jvp_call, custom_vjp_call, remat, shard_map, closed_call, ...
            for sub in _sub_jaxprs(eqn.params):
                calls.extend(_walk(sub, multiplicity=multiplicity, exact=exact))
    return calls


def _eqns(jaxpr: Any) -> list[Any]:
    # In jax 0.12 ClosedJaxpr is Jaxpr and `.jaxpr` returns itself; older versions wrap a Jaxpr.
    return getattr(jaxpr, "jaxpr", jaxpr).eqns


def _sub_jaxprs(params: dict[str, Any]) -> Iterator[Any]:
    for value in params.values():
        items = value if isinstance(value, tuple | list) else (value,)
        for item in items:
            if isinstance(item, jex.core.Jaxpr | jex.core.ClosedJaxpr):
                yield item


# An f32 product on a TPU's bf16 MXU: Precision.HIGHEST splits each operand in three bf16 parts and takes six
# products of them, HIGH three; DEFAULT one (seen on a v5e: XLA's and a kernel's f32 HIGHEST matmul of 275 GFLOP
# took 9.1 and 8.6 ms, against 1.4 ms for one pass at the bf16 peak).
_PASSES = {"HIGHEST": 6, "HIGH": 3}


def mxu_passes(jaxpr: Any) -> int:
    """The bf16 MXU passes per product of the widest dot in a kernel's body (nested loops and branches too)."""
    passes = 1
    for eqn in _eqns(jaxpr):
        if eqn.primitive.name == "dot_general" and all(
                jax.numpy.issubdtype(v.aval.dtype, jax.numpy.floating) and v.aval.dtype.itemsize >= 4
                for v in eqn.invars[:2]):
            precision = eqn.params.get("precision")
            names = [getattr(p, "name", str(p)) for p in (precision if isinstance(precision, tuple) else
                                                           (precision,)) if p is not None]
            passes = max([passes] + [_PASSES.get(n, 1) for n in names])
        for sub in _sub_jaxprs(eqn.params):
            passes = max(passes, mxu_passes(sub))
    return passes


def step_flops(jaxpr: Any) -> float | None:
    """The most dot FLOPs one run of a kernel's body can do: each dot's, loops' by their trip counts, a branch's
    heaviest (a pl.when as taken); None when a loop with dots has a run-time trip count."""
    total = 0.0
    for eqn in _eqns(jaxpr):
        prim = eqn.primitive.name
        total += eqn_flops(eqn)
        subs = [step_flops(sub) for sub in _sub_jaxprs(eqn.params)]
        if any(f is None for f in subs):
            return None
        inner = [f for f in subs if f is not None]
        if prim == "cond":
            total += max(inner, default=0.0)
        elif prim == "scan":
            total += int(eqn.params["length"]) * sum(inner)
        elif prim == "while":
            if sum(inner):
                return None
        else:
            total += sum(inner)
    return total


def _weighted_hbm_bytes(calls: Sequence[PallasCallTraffic]) -> int:
    return sum(call.hbm_bytes * call.multiplicity for call in calls)


# --- one pallas_call --------------------------------------------------------------------------------------


def _pallas_call_traffic(eqn: Any) -> PallasCallTraffic:
    gm = eqn.params["grid_mapping"]
    grid, grid_known = static_grid(gm.grid)
    steps = math.prod(grid)
    n_grid = len(grid)
    index_operands = eqn.invars[gm.num_dynamic_grid_bounds:][: gm.num_index_operands]

    spaces = [space_name(bm.transformed_block_aval.memory_space) for bm in gm.block_mappings]
    gridded = [i for i, space in enumerate(spaces) if space not in MANUAL_SPACES | {_SEMAPHORE_SPACE}]
    runs, runs_exact = block_runs([gm.block_mappings[i].index_map_jaxpr for i in gridded], grid, n_grid)
    runs_of = dict(zip(gridded, runs, strict=True))

    operands = [_scalar_prefetch_operand(v.aval) for v in index_operands]
    for i, (bm, space) in enumerate(zip(gm.block_mappings, spaces, strict=True)):
        role = "input" if i < gm.num_inputs else "output"
        operands.append(_block_operand(bm, role=role, space=space, transfers=runs_of.get(i, 0)))

    scratch_bytes = sum(
        _nbytes(aval.shape, aval.dtype)
        for aval in gm.scratch_avals
        if space_name(getattr(aval, "memory_space", None)) in _VMEM_SPACES
    )
    io_avals = [v.aval for v in eqn.invars[gm.num_dynamic_grid_bounds:]] + [v.aval for v in eqn.outvars]
    claimed = eqn.params.get("cost_estimate")
    return PallasCallTraffic(
        name=call_name(eqn),
        grid=grid,
        grid_steps=steps,
        operands=tuple(operands),
        scratch_bytes=scratch_bytes,
        vmem_bytes=sum(op.block_bytes * op.buffer_count for op in operands) + scratch_bytes,
        hbm_bytes=sum(op.bytes for op in operands),
        io_bytes=sum(_nbytes(aval.shape, aval.dtype) for aval in io_avals),
        claimed_bytes=_claimed(claimed, "bytes_accessed"),
        claimed_flops=_claimed(claimed, "flops"),
        exact=grid_known and runs_exact and not any(op.in_hbm_manual for op in operands),
        multiplicity=1,
        mxu_passes=mxu_passes(eqn.params["jaxpr"]),
        step_flops=step_flops(eqn.params["jaxpr"]) if grid_known else None,
    )


def _mesh_kernel_traffic(eqn: Any) -> PallasCallTraffic:
    """A mesh kernel (`pl.kernel`, `pl.core_map`) has no grid or BlockSpecs: every operand is moved by the
    kernel itself, so each array once is a lower bound."""
    operands = tuple(
        _manual_operand(v.aval, role=role)
        for role, avals in (("input", eqn.invars), ("output", eqn.outvars))
        for v in avals
    )
    claimed = eqn.params.get("cost_estimate")
    total = sum(op.bytes for op in operands)
    return PallasCallTraffic(
        name=call_name(eqn),
        grid=(),
        grid_steps=1,
        operands=operands,
        scratch_bytes=0,  # its scratch is allocated inside the body (run_scoped), not seen here
        vmem_bytes=0,
        hbm_bytes=total,
        io_bytes=total,
        claimed_bytes=_claimed(claimed, "bytes_accessed"),
        claimed_flops=_claimed(claimed, "flops"),
        exact=False,
        multiplicity=1,
        mxu_passes=max((mxu_passes(body) for body in _sub_jaxprs(eqn.params)), default=1),
    )


def _manual_operand(aval: Any, *, role: str) -> OperandTraffic:
    shape = tuple(int(d) for d in aval.shape)
    nbytes = _nbytes(shape, aval.dtype)
    return OperandTraffic(
        role=role, shape=shape, dtype=str(aval.dtype), block_shape=shape, block_bytes=nbytes,
        transfers=1, bytes=nbytes, buffer_count=0, in_hbm_manual=True, memory_space="any",
    )


def _block_operand(bm: Any, *, role: str, space: str, transfers: int) -> OperandTraffic:
    shape = tuple(int(d) for d in bm.array_aval.shape)
    dtype = bm.array_aval.dtype
    block_shape = tuple(block_dim(d) for d in bm.block_shape)
    manual = space in MANUAL_SPACES
    if space == _SEMAPHORE_SPACE:  # semaphores passed in as operands carry no data
        block_bytes, transfers = 0, 0
    elif manual:  # a lower bound: the kernel's own DMAs are not visible here
        block_bytes, transfers = _nbytes(shape, dtype), 1
    else:
        block_bytes = _nbytes(tuple(1 if d is None else d for d in block_shape), dtype)
    in_vmem = space in _VMEM_SPACES
    return OperandTraffic(
        role=role,
        shape=shape,
        dtype=str(dtype),
        block_shape=block_shape,
        block_bytes=block_bytes,
        transfers=transfers,
        bytes=transfers * block_bytes,
        buffer_count=_buffer_count(bm.pipeline_mode) if in_vmem else 0,
        in_hbm_manual=manual,
        memory_space=space,
    )


def _scalar_prefetch_operand(aval: Any) -> OperandTraffic:
    shape = tuple(int(d) for d in aval.shape)
    nbytes = _nbytes(shape, aval.dtype)
    return OperandTraffic(
        role="input", shape=shape, dtype=str(aval.dtype), block_shape=shape, block_bytes=nbytes,
        transfers=1, bytes=nbytes, buffer_count=0, in_hbm_manual=False, memory_space="smem",
    )


def _buffer_count(pipeline_mode: Any) -> int:
    count = getattr(pipeline_mode, "buffer_count", None)
    if count is None:
        return DEFAULT_BUFFER_COUNT
    if isinstance(count, tuple):  # (in, out) buffers of an input_output ref: in + out - 1 slots
        return int(count[0]) + int(count[1]) - 1
    return int(count)


def _nbytes(shape: Sequence[int], dtype: Any) -> int:
    try:
        bits = jax.dtypes.itemsize_bits(dtype)
    except ValueError:  # extended dtypes: PRNG keys have an itemsize, semaphores none
        bits = 8 * (getattr(dtype, "itemsize", None) or 0)
    return (math.prod(int(d) for d in shape) * bits + 7) // 8


def _claimed(cost_estimate: Any, field: str) -> float | None:
    value = getattr(cost_estimate, field, None)
    return None if value is None else float(value)


# --- as JSON, between processes --------------------------------------------------------------------------------


def traffic_to_json(report: TrafficReport) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(report)


def traffic_from_json(data: dict[str, Any]) -> TrafficReport:
    calls = []
    for call in data["calls"]:
        operands = tuple(OperandTraffic(**{**op, "shape": tuple(op["shape"]), "block_shape": tuple(op["block_shape"])})
                         for op in call["operands"])
        calls.append(PallasCallTraffic(**{**call, "grid": tuple(call["grid"]), "operands": operands}))
    return TrafficReport(calls=tuple(calls))
