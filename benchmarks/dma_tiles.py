"""How fast a Pallas kernel's blocks move between HBM and VMEM on this host's chip when their last two dimensions
are not whole tiles, against whole tiles and against XLA moving the same array.

A Pallas TPU block may end in dimensions that are not multiples of the (sublane, lane) tile - (16, 128) for bf16,
(8, 128) for f32 - when they are the array's own (a 3x3 convolution's [.., 126, 126] output planes). This writes
such an array block by block (a grid over the leading axis, one block a step, nothing computed but a fill) and
reads one, beside the same with whole tiles and beside XLA's own fill of the same array; each line says the time
(the fastest of --repeat rounds of --calls back-to-back calls, wall clock) and the valid bytes per second.

Measured on a v5e (2026-12-07; 128 planes of 128 x 126 x 126 bf16, 520 MB), this script: the kernel wrote them in
3.50 ms (149 GB/s) and read them in 3.39; 126 x 128 planes 2.57, 128 x 126 2.52, 128 x 128 0.93 (read 0.84); f32
126 x 126 5.48; XLA filled the 126 x 126 array in 0.87 ms. Probes beside it: blocks of 16 channels as slow as 128,
a manual DMA from VMEM (memory space ANY) 3.73, 112 x 128 planes 0.83, and 128 x 128 planes with XLA's crop
after the kernel 3.54 in all. So a kernel whose output ends
in such dimensions pays ~4x XLA's time for its writes (22k's convolution: 3.9 of its 6.9 ms with its compute taken
out), with no layout of the same array that avoids it.

    .venv/bin/python benchmarks/dma_tiles.py [--planes 128] [--channels 128] [--calls 5] [--repeat 3]

With --interpret (a host without a TPU, for trying the script itself) the kernels run in Pallas interpret mode on
4 planes: the times then say nothing of a chip.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402
from kernel_variants import fastest_ms  # noqa: E402 - benchmarks/, this script's own folder

from tpu_runner.checking.correctness import interpret_mode  # noqa: E402

_SEED = (8, 128)  # a whole f32 tile the fill depends on, so XLA cannot fold it into a constant
_VMEM_LIMIT = 100 * 2**20


def kernel_write(shape: tuple[int, ...], dtype: Any) -> Callable[[jax.Array], jax.Array]:
    """A kernel that fills `shape` one leading index per grid step (its block the rest of the array)."""
    def fill(seed_ref, o_ref):
        o_ref[...] = jnp.full(o_ref.shape, 1.0, o_ref.dtype) + seed_ref[0, 0].astype(o_ref.dtype)

    tail = (0,) * (len(shape) - 1)
    return lambda seed: pl.pallas_call(
        fill, grid=(shape[0],), in_specs=[pl.BlockSpec(_SEED, lambda n: (0, 0))],
        out_specs=pl.BlockSpec((None,) + shape[1:], lambda n: (n,) + tail),
        out_shape=jax.ShapeDtypeStruct(shape, dtype),
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=_VMEM_LIMIT))(seed)


def kernel_read(shape: tuple[int, ...]) -> Callable[[jax.Array], jax.Array]:
    """A kernel that reads `shape` one leading index per grid step and writes one f32 row per step."""
    def first_row(x_ref, o_ref):
        o_ref[...] = x_ref[0, 0:1, :].astype(jnp.float32)

    tail = (0,) * (len(shape) - 1)
    return lambda x: pl.pallas_call(
        first_row, grid=(shape[0],), in_specs=[pl.BlockSpec((None,) + shape[1:], lambda n: (n,) + tail)],
        out_specs=pl.BlockSpec((None, 1, shape[-1]), lambda n: (n, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((shape[0], 1, shape[-1]), jnp.float32),
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=_VMEM_LIMIT))(x)


def xla_write(shape: tuple[int, ...], dtype: Any) -> Callable[[jax.Array], jax.Array]:
    return lambda seed: jnp.full(shape, 1.0, dtype) + seed[0, 0].astype(dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--planes", type=int, default=128, help="the leading axis: one block per plane")
    parser.add_argument("--channels", type=int, default=128, help="rows of each plane's block")
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--interpret", action="store_true", help="no TPU: interpret mode on 4 planes")
    args = parser.parse_args()

    n, c = (4 if args.interpret else args.planes), args.channels
    bf16, f32 = jnp.bfloat16, jnp.float32
    seed = jnp.ones(_SEED, f32)
    base = n * c * 126 * 126 * 2  # the valid bytes of the misaligned bf16 array, the basis of every rate
    print(f"{jax.devices()[0].device_kind}: {n} planes of {c} channels; rates are {base / 1e6:.0f} MB (bf16 "
          f"{c} x 126 x 126 per plane) over the time", flush=True)
    rows: list[tuple[str, Callable[..., Any], list[Any]]] = [
        ("kernel writes bf16 126 x 126", kernel_write((n, c, 126, 126), bf16), [seed]),
        ("kernel writes bf16 126 x 128", kernel_write((n, c, 126, 128), bf16), [seed]),
        ("kernel writes bf16 128 x 126", kernel_write((n, c, 128, 126), bf16), [seed]),
        ("kernel writes bf16 128 x 128", kernel_write((n, c, 128, 128), bf16), [seed]),
        ("kernel writes f32 126 x 126 (2x the bytes)", kernel_write((n, c, 126, 126), f32), [seed]),
        ("XLA writes bf16 126 x 126", xla_write((n, c, 126, 126), bf16), [seed]),
        ("kernel reads bf16 126 x 126", kernel_read((n, c, 126, 126)), [jnp.ones((n, c, 126, 126), bf16)]),
        ("kernel reads bf16 128 x 128", kernel_read((n, c, 128, 128)), [jnp.ones((n, c, 128, 128), bf16)]),
    ]
    for name, fn, inputs in rows:
        try:
            with interpret_mode(args.interpret):
                ms = fastest_ms(jax.jit(fn), inputs, args.calls, args.repeat)[0]
            print(f"  {name:44s} {ms:8.3f} ms  {base / ms / 1e6:6.0f} GB/s", flush=True)
        except Exception as exc:  # noqa: BLE001 - a shape this chip refuses is a row saying why
            print(f"  {name:44s} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}", flush=True)


if __name__ == "__main__":
    main()
