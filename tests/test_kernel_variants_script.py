"""benchmarks/kernel_variants.py on a host without a TPU (interpret mode): the brain's first kernel and its one-step
variants, each beside XLA's reference, with their difference from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import TASKS

REPO = Path(__file__).resolve().parent.parent


def test_the_first_kernel_and_one_step_variants_are_timed_beside_xla(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "kernel_variants.py"), "--task",
                          str(TASKS / "softmax"), "--interpret", "--max", "3", "--calls", "1", "--repeat", "1",
                          "--kernel-alone", "--json", str(out)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert run.returncode == 0, run.stderr[-2000:]
    data = json.loads(out.read_text())
    first, *others = data["rows"]
    assert first["variant"] == "first" and len(others) == 2
    for row in data["rows"]:
        assert row["ms"] > 0 and row["max_diff"] < 1e-3 and row["kernel_ms"] > 0, row
    # each variant changes exactly one parameter of the first kernel
    for row in others:
        changed = [k for k in first["params"] if row["params"][k] != first["params"][k]]
        assert len(changed) == 1 and row["variant"] == f"{changed[0]}={row['params'][changed[0]]}"
    assert "fastest:" in run.stdout and "XLA" in run.stdout


def test_a_kernel_alone_is_its_module_cut_after_its_last_pallas_call() -> None:
    """--kernel-alone times `computation` returning the last pallas_call's value: the XLA work after it is left out."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from kernel_variants import cut_after_kernel

    source = """def computation(x):
    y = pl.pallas_call(
        first, out_shape=x)(x)
    out = pl.pallas_call(second, out_shape=y)(
        y)
    out = out[:4]
    return jnp.tanh(out)
"""
    cut = cut_after_kernel(source)
    assert cut is not None
    assert cut.splitlines()[3:7] == ["    out = pl.pallas_call(second, out_shape=y)(", "        y)", "    return out",
                                     "    out = out[:4]"]
    assert cut_after_kernel("def computation(x):\n    return x\n") is None


def test_stages_cut_after_each_pallas_call_in_turn_tuples_included() -> None:
    """--stages times the module up to each call's output: the n-th cut returns the n-th call's value(s)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from kernel_variants import cut_after_kernel

    source = """def computation(x):
    left, right = pl.pallas_call(first, out_shape=[x, x])(x)
    t = pl.pallas_call(second, out_shape=x)(left, right)
    return t + 1
"""
    first, second = cut_after_kernel(source, 0), cut_after_kernel(source, 1)
    assert first is not None and second is not None
    assert first.splitlines()[2] == "    return (left, right)"
    assert second.splitlines()[3] == "    return t" and second == cut_after_kernel(source)
    assert cut_after_kernel(source, 2) is None
