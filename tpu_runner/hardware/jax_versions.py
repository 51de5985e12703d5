"""The JAX versions kernelbot runs on, and what differs between them, in one place.

- 0.12.0.1 (with libtpu 0.0.50.x): what a host without a TPU installs (pyproject.toml pins it) to compile for TPU
  topologies ahead of time;
- 0.10.2 (with libtpu 0.0.42.x): what TPU hosts of today come with, used as installed, never replaced.
Between them: libtpu 0.0.42 has no fast-forward static profiler (`libtpu.knows_flag`) and needs a one-chip
topology's chips-per-host said outright (`compile.target_sharding`); the Pallas TPU API kernelbot and its
kernels use (`pltpu.CompilerParams`, `pl.ANY`, `pltpu.InterpretParams`, `pltpu.get_tpu_info`) is the same.
"""

from __future__ import annotations

SUPPORTED = ("0.10.2", "0.12.0.1")
PINNED = "0.12.0.1"  # pyproject.toml's jax[tpu] for hosts without a TPU


def supported(version: str) -> bool:
    return version in SUPPORTED


def bind_equation(eqn: object, args: list[object]) -> list[object]:
    """Run one jaxpr equation on concrete values (as `jax.core.eval_jaxpr` does), returning its results as a list.
    `Primitive.get_bind_params` gave (subfuns, params) before JAX 0.12 and only the params since."""
    primitive, params = eqn.primitive, eqn.params  # type: ignore[attr-defined]
    bound = primitive.get_bind_params(params)
    subfuns, bind_params = bound if isinstance(bound, tuple) else ([], bound)
    result = primitive.bind(*subfuns, *args, **bind_params)
    return list(result) if primitive.multiple_results else [result]
