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
