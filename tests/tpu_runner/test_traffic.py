"""pallas_traffic on real Pallas TPU kernels, traced only (make_jaxpr on shapes: nothing compiles or runs)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tpu_runner.analysis import OperandTraffic, PallasCallTraffic, TrafficReport, grid_walk, pallas_traffic

F32 = 4
KIB = 1024
MIB = 1024 * KIB


def _spec(shape: tuple[int, ...], dtype=jnp.float32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype)


def _only_call(report: TrafficReport) -> PallasCallTraffic:
    assert len(report.calls) == 1, report.calls
    return report.calls[0]


def _matmul_kernel(x_ref, y_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], y_ref[...])  # [bm, bn]


def _matmul(x, y, *, block: int = 128, x_index_map=None, y_pipeline_mode=None, scratch_shapes=(),
            cost_estimate=None):
    m, k = x.shape
    _, n = y.shape

    def kernel(x_ref, y_ref, o_ref, *scratch_refs):
        _matmul_kernel(x_ref, y_ref, o_ref)

    return pl.pallas_call(
        kernel,
        grid=(m // block, n // block, k // block),
        in_specs=[
            pl.BlockSpec((block, block), x_index_map or (lambda i, j, kk: (i, kk))),
            pl.BlockSpec((block, block), lambda i, j, kk: (kk, j), pipeline_mode=y_pipeline_mode),
        ],
        out_specs=pl.BlockSpec((block, block), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=list(scratch_shapes),
        cost_estimate=cost_estimate,
    )(x, y)


def _add_kernel(a_ref, b_ref, o_ref):
    o_ref[...] = a_ref[...] + b_ref[...]


def _add(a, b, *, block_rows: int = 256):
    rows, cols = a.shape
    spec = pl.BlockSpec((block_rows, cols), lambda i: (i, 0))
    return pl.pallas_call(
        _add_kernel, grid=(rows // block_rows,), in_specs=[spec, spec], out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
    )(a, b)


def test_blocked_matmul_4x4x4_counts_every_block_dma():
    x = _spec((512, 512))
    call = _only_call(pallas_traffic(jax.make_jaxpr(_matmul)(x, x)))

    block_bytes = 128 * 128 * F32
    x_op, y_op, out_op = call.operands
    assert call.grid == (4, 4, 4) and call.grid_steps == 64
    assert (x_op.role, x_op.transfers, x_op.bytes) == ("input", 64, 64 * block_bytes)
    assert (y_op.role, y_op.transfers, y_op.bytes) == ("input", 64, 64 * block_bytes)
    assert (out_op.role, out_op.transfers, out_op.bytes) == ("output", 16, 16 * block_bytes)
    assert x_op.block_shape == (128, 128) and x_op.block_bytes == block_bytes
    assert call.hbm_bytes == (64 + 64 + 16) * block_bytes
    assert call.io_bytes == 3 * 512 * 512 * F32
    assert call.exact and call.multiplicity == 1
    assert call.name == "kernel"


def test_elementwise_add_reads_each_input_once_and_writes_once():
    a = _spec((1024, 1024))
    call = _only_call(pallas_traffic(jax.make_jaxpr(_add)(a, a)))

    array_bytes = 1024 * 1024 * F32
    assert [op.transfers for op in call.operands] == [4, 4, 4]
    assert [op.block_bytes for op in call.operands] == [1 * MIB] * 3
    assert call.hbm_bytes == 3 * array_bytes == call.io_bytes
    assert call.name == "_add_kernel"


def test_unchanged_block_index_is_not_fetched_again():
    # K is a single block: x's block (i, 0) stays put while j moves, so x is fetched once per i.
    x, y = _spec((512, 128)), _spec((128, 512))
    call = _only_call(pallas_traffic(jax.make_jaxpr(_matmul)(x, y)))

    x_op, y_op, out_op = call.operands
    assert call.grid == (4, 4, 1)
    assert x_op.transfers == 4
    assert y_op.transfers == 16
    assert out_op.transfers == 16


def test_computed_index_maps_agree_with_the_closed_form():
    # `kk % 4` is computed, so the map goes through the vectorised evaluation instead of the closed form.
    x = _spec((512, 512))
    plain = _only_call(pallas_traffic(jax.make_jaxpr(_matmul)(x, x)))
    computed = _only_call(pallas_traffic(jax.make_jaxpr(
        lambda a, b: _matmul(a, b, x_index_map=lambda i, j, kk: (i, kk % 4)))(x, x)))
    assert computed.operands == plain.operands
    assert computed.exact

    # A map that really revisits: block i // 2 changes every other i.
    halved = _only_call(pallas_traffic(jax.make_jaxpr(
        lambda a, b: _matmul(a, b, x_index_map=lambda i, j, kk: (i // 2, 0)))(x, x)))
    assert halved.operands[0].transfers == 2


def test_kernel_inside_jit_is_found():
    a = _spec((1024, 1024))
    report = pallas_traffic(jax.make_jaxpr(lambda p, q: jax.jit(_add)(p, q) * 2)(a, a))
    call = _only_call(report)
    assert call.hbm_bytes == 3 * 4 * MIB and call.multiplicity == 1
    assert report.total_hbm_bytes == 3 * 4 * MIB


def test_kernel_inside_scan_counts_once_per_trip():
    a = _spec((1024, 1024))

    def body(carry, _):
        return _add(carry, carry), None

    report = pallas_traffic(jax.make_jaxpr(lambda p: jax.lax.scan(body, p, None, length=5)[0])(a))
    call = _only_call(report)
    assert call.multiplicity == 5
    assert report.total_hbm_bytes == 5 * call.hbm_bytes == 5 * 3 * 4 * MIB
    assert report.total_io_bytes == 5 * call.io_bytes
    assert report.exact


def test_nested_scans_multiply_and_while_loops_are_inexact():
    a = _spec((1024, 1024))

    def inner(carry, _):
        return _add(carry, carry), None

    def outer(carry, _):
        return jax.lax.scan(inner, carry, None, length=3)[0], None

    nested_jaxpr = jax.make_jaxpr(lambda p: jax.lax.scan(outer, p, None, length=4)[0])(a)
    nested = _only_call(pallas_traffic(nested_jaxpr))
    assert nested.multiplicity == 12 and nested.exact

    def loop(p, n):
        return jax.lax.while_loop(lambda c: c[1] < n, lambda c: (_add(c[0], c[0]), c[1] + 1), (p, 0))[0]

    looped = pallas_traffic(jax.make_jaxpr(loop)(a, 7))
    assert _only_call(looped).multiplicity == 1
    assert not looped.exact


def test_cond_counts_the_heaviest_branch():
    a = _spec((1024, 1024))
    report = pallas_traffic(jax.make_jaxpr(
        lambda flag, p: jax.lax.cond(flag, lambda q: _add(q, q), lambda q: q + 1, p))(True, a))
    assert _only_call(report).hbm_bytes == 3 * 4 * MIB


def test_custom_vjp_body_is_walked():
    a = _spec((1024, 1024))

    @jax.custom_vjp
    def f(p):
        return _add(p, p)

    f.defvjp(lambda p: (f(p), None), lambda _, g: (2 * g,))
    assert _only_call(pallas_traffic(jax.make_jaxpr(f)(a))).hbm_bytes == 3 * 4 * MIB


def _manual_copy_kernel(x_hbm_ref, o_ref, buf_ref, sem):
    copy = pltpu.make_async_copy(x_hbm_ref, buf_ref, sem)
    copy.start()
    copy.wait()
    o_ref[...] = buf_ref[...] * 2


def test_manual_dma_operand_is_a_lower_bound():
    x = _spec((256, 128))
    call = _only_call(pallas_traffic(jax.make_jaxpr(lambda p: pl.pallas_call(
        _manual_copy_kernel,
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        out_shape=jax.ShapeDtypeStruct(p.shape, p.dtype),
        scratch_shapes=[pltpu.VMEM((256, 128), jnp.float32), pltpu.SemaphoreType.DMA(())],
    )(p))(x)))

    x_op, out_op = call.operands
    array_bytes = 256 * 128 * F32
    assert x_op.in_hbm_manual and x_op.memory_space == "any"
    assert (x_op.transfers, x_op.bytes, x_op.buffer_count) == (1, array_bytes, 0)
    assert not out_op.in_hbm_manual and out_op.transfers == 1
    assert call.hbm_bytes == 2 * array_bytes
    assert not call.exact
    # VMEM: the output block double-buffered plus the VMEM scratch; the semaphore takes none.
    assert call.scratch_bytes == array_bytes
    assert call.vmem_bytes == 2 * array_bytes + array_bytes


def test_mesh_kernels_are_manual_lower_bounds():
    def body(x_hbm_ref, o_hbm_ref):
        pltpu.sync_copy(x_hbm_ref, o_hbm_ref)

    x = _spec((256, 128))
    copy = pl.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                     mesh=pltpu.TensorCoreMesh(axis_name="core", num_cores=1))
    call = _only_call(pallas_traffic(jax.make_jaxpr(copy)(x)))
    assert [(op.role, op.in_hbm_manual) for op in call.operands] == [("input", True), ("output", True)]
    assert call.hbm_bytes == 2 * 256 * 128 * F32
    assert call.name == "body"
    assert not call.exact


def test_vmem_counts_double_buffers_and_scratch():
    x = _spec((512, 512))
    block_bytes = 128 * 128 * F32
    scratch = [pltpu.VMEM((8, 128), jnp.float32)]

    call = _only_call(pallas_traffic(jax.make_jaxpr(
        lambda a, b: _matmul(a, b, scratch_shapes=scratch))(x, x)))
    assert [op.buffer_count for op in call.operands] == [2, 2, 2]
    assert call.scratch_bytes == 8 * 128 * F32
    assert call.vmem_bytes == 3 * 2 * block_bytes + 8 * 128 * F32

    triple = _only_call(pallas_traffic(jax.make_jaxpr(
        lambda a, b: _matmul(a, b, scratch_shapes=scratch, y_pipeline_mode=pl.Buffered(3)))(x, x)))
    assert [op.buffer_count for op in triple.operands] == [2, 3, 2]
    assert triple.vmem_bytes == (2 + 3 + 2) * block_bytes + 8 * 128 * F32
    assert pallas_traffic(jax.make_jaxpr(
        lambda a, b: _matmul(a, b, scratch_shapes=scratch, y_pipeline_mode=pl.Buffered(3)))(x, x)
    ).max_vmem_bytes == triple.vmem_bytes


def test_understated_cost_estimate_is_reported_not_believed():
    x = _spec((512, 512))
    lie = pl.CostEstimate(flops=1, transcendentals=0, bytes_accessed=1)
    call = _only_call(pallas_traffic(jax.make_jaxpr(lambda a, b: _matmul(a, b, cost_estimate=lie))(x, x)))
    assert call.claimed_bytes == 1 and call.claimed_flops == 1
    assert call.hbm_bytes == (64 + 64 + 16) * 128 * 128 * F32

    honest = _only_call(pallas_traffic(jax.make_jaxpr(_matmul)(x, x)))
    assert honest.claimed_bytes is None and honest.claimed_flops is None


def _gather_rows_kernel(idx_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _gather_rows(idx, x, *, index_map):
    return pl.pallas_call(
        _gather_rows_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1, grid=(8, 2),
            in_specs=[pl.BlockSpec((8, 128), index_map)],
            out_specs=pl.BlockSpec((8, 128), lambda i, j, idx_ref: (i, j)),
        ),
        out_shape=jax.ShapeDtypeStruct((64, 256), x.dtype),
    )(idx, x)


def test_scalar_prefetch_index_maps_are_an_upper_bound():
    idx, x = _spec((8,), jnp.int32), _spec((64, 256))
    call = _only_call(pallas_traffic(jax.make_jaxpr(
        lambda i, p: _gather_rows(i, p, index_map=lambda r, c, idx_ref: (idx_ref[r], c)))(idx, x)))

    prefetch, x_op, out_op = call.operands
    assert (prefetch.memory_space, prefetch.bytes, prefetch.buffer_count) == ("smem", 8 * 4, 0)
    assert x_op.transfers == call.grid_steps == 16  # every step, since idx is unknown before run time
    assert out_op.transfers == 16
    assert not call.exact
    assert call.io_bytes == 8 * 4 + 2 * 64 * 256 * F32

    # The same kernel whose index map ignores the prefetched scalars is exact.
    plain = _only_call(pallas_traffic(jax.make_jaxpr(
        lambda i, p: _gather_rows(i, p, index_map=lambda r, c, idx_ref: (r, 0)))(idx, x)))
    assert plain.operands[1].transfers == 8 and plain.exact

    # ... and so is one whose computed index map ignores them (evaluated with placeholder scalars).
    halved = _only_call(pallas_traffic(jax.make_jaxpr(
        lambda i, p: _gather_rows(i, p, index_map=lambda r, c, idx_ref: (r // 2, 0)))(idx, x)))
    assert halved.operands[1].transfers == 4 and halved.exact


def test_smem_operand_is_read_once_and_takes_no_vmem():
    def kernel(scale_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] * scale_ref[0]

    x, scale = _spec((1024, 128)), _spec((4,))
    call = _only_call(pallas_traffic(jax.make_jaxpr(lambda s, p: pl.pallas_call(
        kernel, grid=(8,),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec((128, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((128, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(p.shape, p.dtype),
    )(s, p))(scale, x)))

    scale_op = call.operands[0]
    assert (scale_op.memory_space, scale_op.transfers, scale_op.buffer_count) == ("smem", 1, 0)
    assert scale_op.bytes == 4 * F32
    assert call.vmem_bytes == 2 * 2 * 128 * 128 * F32
    assert call.exact


def test_squeezed_dims_and_bf16_blocks():
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]

    x = _spec((8, 16, 256), jnp.bfloat16)
    call = _only_call(pallas_traffic(jax.make_jaxpr(lambda p: pl.pallas_call(
        kernel, grid=(8, 2),
        in_specs=[pl.BlockSpec((None, 16, 128), lambda b, j: (b, 0, j))],
        out_specs=pl.BlockSpec((None, 16, 128), lambda b, j: (b, 0, j)),
        out_shape=jax.ShapeDtypeStruct(p.shape, p.dtype),
    )(p))(x)))

    x_op = call.operands[0]
    assert x_op.block_shape == (None, 16, 128)
    assert x_op.block_bytes == 16 * 128 * 2
    assert x_op.transfers == 16
    assert call.hbm_bytes == 2 * 8 * 16 * 256 * 2 == call.io_bytes


def test_vmapped_kernel_adds_a_grid_axis():
    a = _spec((3, 1024, 1024))
    call = _only_call(pallas_traffic(jax.make_jaxpr(jax.vmap(_add))(a, a)))
    assert call.grid_steps == 12
    assert call.hbm_bytes == 3 * 3 * 4 * MIB


@pytest.mark.parametrize("computed", [False, True], ids=["closed-form", "evaluated"])
def test_half_million_step_grid_is_counted_quickly(computed):
    # grid (256, 256, 8): 524288 steps; the evaluated variant runs the index map over every step.
    x, y = _spec((256 * 8, 8 * 128)), _spec((8 * 128, 256 * 128))

    def big(a, b):
        x_map = (lambda i, j, kk: (i, kk % 8)) if computed else (lambda i, j, kk: (i, kk))
        return pl.pallas_call(
            _matmul_kernel, grid=(256, 256, 8),
            in_specs=[pl.BlockSpec((8, 128), x_map), pl.BlockSpec((128, 128), lambda i, j, kk: (kk, j))],
            out_specs=pl.BlockSpec((8, 128), lambda i, j, kk: (i, j)),
            out_shape=jax.ShapeDtypeStruct((256 * 8, 256 * 128), jnp.float32),
        )(a, b)

    call = _only_call(pallas_traffic(jax.make_jaxpr(big)(x, y)))
    assert call.grid_steps == 256 * 256 * 8
    assert [op.transfers for op in call.operands] == [256 * 256 * 8, 256 * 256 * 8, 256 * 256]
    assert call.exact


def test_runs_are_counted_across_chunk_boundaries(monkeypatch):
    # Chunks of 7 steps split the 64-step grid mid-run; the counts must not change.
    x = _spec((512, 512))
    traced = jax.make_jaxpr(lambda a, b: _matmul(a, b, x_index_map=lambda i, j, kk: (i // 2, kk // 2)))(x, x)
    whole = _only_call(pallas_traffic(traced))
    monkeypatch.setattr(grid_walk, "MAX_CHUNK_STEPS", 7)
    chunked = _only_call(pallas_traffic(traced))
    assert chunked.operands == whole.operands
    assert whole.operands[0].transfers == 4 * 4 * 2  # (i // 2, kk // 2) changes every other kk and at each i


def test_no_kernels_no_traffic():
    report = pallas_traffic(jax.make_jaxpr(lambda p: p * 2)(_spec((8, 128))))
    assert report == TrafficReport(calls=())
    assert (report.total_hbm_bytes, report.max_vmem_bytes, report.exact) == (0, 0, True)


def test_operand_records_are_frozen():
    call = _only_call(pallas_traffic(jax.make_jaxpr(_add)(_spec((1024, 1024)), _spec((1024, 1024)))))
    assert isinstance(call.operands[0], OperandTraffic)
    with pytest.raises(AttributeError):
        call.operands[0].transfers = 0  # type: ignore[misc]


@pytest.mark.parametrize("precision, dtype, passes", [
    (jax.lax.Precision.HIGHEST, jnp.float32, 6),  # f32 in three bf16 parts, six products
    (jax.lax.Precision.HIGH, jnp.float32, 3),
    (None, jnp.float32, 1),
    (jax.lax.Precision.HIGHEST, jnp.bfloat16, 1),  # bf16 operands are one pass whatever the precision says
])
def test_a_kernels_dot_precision_is_counted_in_mxu_passes(precision, dtype, passes):
    # Without a static profile a kernel's compute is its FLOPs at the bf16 peak: an f32 dot at HIGHEST takes six
    # passes of the MXU (on a v5e a 275 GFLOP f32 HIGHEST matmul kernel took 8.6 ms, not 1.4).
    def kernel(a_ref, b_ref, o_ref):
        def body(i, carry):  # inside a loop: the walk goes into the kernel's nested jaxprs
            o_ref[...] = jax.lax.dot_general(a_ref[...], b_ref[...], (((1,), (0,)), ((), ())), precision=precision,
                                             preferred_element_type=jnp.float32).astype(o_ref.dtype)
            return carry

        jax.lax.fori_loop(0, 2, body, 0)

    def fn(a, b):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((128, 128), dtype))(a, b)

    report = pallas_traffic(jax.make_jaxpr(fn)(_spec((128, 128), dtype), _spec((128, 128), dtype)))
    assert _only_call(report).mxu_passes == passes
    assert report.mxu_passes == passes


def _gated_kernel(x_ref, y_ref, o_ref):
    """Two dots behind a branch (the heavier counts) and one in a loop of 3, as a kernel body writes them."""

    @pl.when(pl.program_id(0) < 1)
    def taken():
        o_ref[...] = jnp.dot(x_ref[...], y_ref[...]) + jnp.dot(x_ref[...], y_ref[...])

    def step(i, acc):
        return acc + jnp.dot(x_ref[...], y_ref[...])

    o_ref[...] += jax.lax.fori_loop(0, 3, step, jnp.zeros_like(o_ref))


def test_a_kernels_most_flops_come_from_its_body_and_grid() -> None:
    """What the evaluator bounds a candidate's work by where it is less than the reference's (a mixture of
    experts' chosen experts): dots in the body, a pl.when's as taken, a loop's by its trip count, times the grid
    steps. A loop with dots and a run-time trip count leaves it unknown."""
    x = _spec((256, 128))
    y = _spec((128, 128))

    def gated(x, y):
        return pl.pallas_call(_gated_kernel, grid=(2,), in_specs=[pl.BlockSpec((128, 128), lambda i: (i, 0)),
                                                                   pl.BlockSpec((128, 128), lambda i: (0, 0))],
                              out_specs=pl.BlockSpec((128, 128), lambda i: (i, 0)),
                              out_shape=jax.ShapeDtypeStruct((256, 128), jnp.float32))(x, y)

    call = _only_call(pallas_traffic(jax.make_jaxpr(gated)(x, y)))
    per_dot = 2 * 128 * 128 * 128
    assert call.step_flops == 5 * per_dot and call.most_flops == 2 * 5 * per_dot

    def unbounded(x, y):
        def kernel(x_ref, y_ref, o_ref):
            n = jnp.sum(x_ref[...]).astype(jnp.int32)
            o_ref[...] = jax.lax.fori_loop(0, n, lambda i, acc: acc + jnp.dot(x_ref[...], y_ref[...]),
                                           jnp.zeros_like(o_ref))
        return pl.pallas_call(kernel, grid=(2,), in_specs=[pl.BlockSpec((128, 128), lambda i: (i, 0)),
                                                           pl.BlockSpec((128, 128), lambda i: (0, 0))],
                              out_specs=pl.BlockSpec((128, 128), lambda i: (i, 0)),
                              out_shape=jax.ShapeDtypeStruct((256, 128), jnp.float32))(x, y)

    report = pallas_traffic(jax.make_jaxpr(unbounded)(x, y))
    assert _only_call(report).step_flops is None and report.most_flops is None
