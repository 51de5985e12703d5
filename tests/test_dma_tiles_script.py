"""benchmarks/dma_tiles.py on a host without a TPU (interpret mode): every block shape is written or read by its
kernel and XLA fills the same array, each row with a time and a rate."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_every_block_shape_is_timed_beside_xla() -> None:
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "dma_tiles.py"), "--interpret", "--channels", "16",
                          "--calls", "1", "--repeat", "1"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert run.returncode == 0, run.stderr[-2000:]
    rows = re.findall(r"^  (kernel (?:writes|reads) .+?|XLA writes .+?)\s+([\d.]+) ms\s+\d+ GB/s$", run.stdout, re.M)
    names = [name.strip() for name, _ in rows]
    assert "kernel writes bf16 126 x 126" in names and "XLA writes bf16 126 x 126" in names, run.stdout
    assert "kernel reads bf16 128 x 128" in names and len(rows) == 8, run.stdout
    assert all(float(ms) > 0 for _, ms in rows) and "failed" not in run.stdout, run.stdout
