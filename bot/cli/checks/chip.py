"""This host's TPU: opened in a child process (with the chip's lock, and a timeout), a small Pallas kernel compiled
by Mosaic on it, run, compared with XLA's result and timed from the profiler's device lane. A chip another
process holds is named, not waited for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bot.cli.checks.compile import error_summary
from bot.cli.checks.report import Check
from bot.task_suites import SOURCE_ROOT
from tpu_runner.hardware import ChipSpec

CHIP_TIMEOUT_S = 120.0
_MARKER = "kernelbot-doctor-chip: "
_CHILD = "import sys; from bot.cli.checks.chip import chip_probe; chip_probe(sys.argv[1])"
_ROWS, _COLS, _BLOCK_ROWS = 2048, 1024, 256


def _add_one_kernel(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref[...] + 1.0  # [_BLOCK_ROWS, _COLS] f32 per grid step


def _pallas_add_one(x: Any) -> Any:
    import jax
    from jax.experimental import pallas as pl

    spec = pl.BlockSpec((_BLOCK_ROWS, _COLS), lambda i: (i, 0))
    return pl.pallas_call(_add_one_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=(_ROWS // _BLOCK_ROWS,), in_specs=[spec], out_specs=spec)(x)


def _report(data: dict[str, Any]) -> None:
    print(_MARKER + json.dumps(data), flush=True)


def chip_probe(trace_root: str) -> None:
    """In the child: take the chip's lock without waiting, open the chip, run and time the kernel; one marked
    line says what happened."""
    import numpy as np

    from tpu_runner.hardware import chip

    fd = chip.try_hold()
    if fd is None:
        _report({"busy": "kernelbot", "holders": [h.describe() for h in chip.holders()]})
        return
    t0 = time.perf_counter()
    try:
        kind = chip.open_chip()
    except chip.ChipBusy as exc:
        _report({"busy": str(exc)})
        return
    opened = time.perf_counter() - t0
    from tpu_runner.timing import measure_pair

    rng = np.random.default_rng(0)
    inputs = [[rng.standard_normal((_ROWS, _COLS)).astype(np.float32)] for _ in range(2)]
    pair = measure_pair(reference=lambda x: x + 1.0, candidate=_pallas_add_one, input_sets=inputs, static=(),
                        trace_dir=Path(trace_root), atol=0.0, rtol=0.0, warmup=2, iterations=10)
    _report({"device_kind": kind, "opened_s": round(opened, 1), "kernel_ms": pair.candidate.median_ms,
             "xla_ms": pair.reference.median_ms, "source": pair.candidate.source, "mismatches": pair.mismatches,
             "iterations": len(pair.candidate.samples_ms)})


def chip_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: this host's TPU runtime variables as they are, JAX on the TPU."""
    env = {k: v for k, v in base.items() if k != "ALLOW_MULTIPLE_LIBTPU_LOAD"}  # libtpu's own lock stays on
    env.update(JAX_PLATFORMS="tpu,cpu", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.pathsep.join(
        p for p in (str(SOURCE_ROOT), base.get("PYTHONPATH", "")) if p))
    return env


def chip_verdict(chip: ChipSpec, *, returncode: int | None, stdout: str, stderr: str, timeout: float) -> Check:
    """What the child's ending says about the chip (returncode None: it was stopped at the timeout)."""
    if returncode is None:
        return Check("chip", "fail", f"opening the {chip.name} chip and running a kernel on it did not finish "
                     f"within {timeout:g} s", "look for a process stuck on the TPU (`ps`), end it, and run doctor "
                     "again")
    lines = [line.removeprefix(_MARKER) for line in stdout.splitlines() if line.startswith(_MARKER)]
    if not lines:
        tail = error_summary(stderr) or error_summary(stdout) or f"exit status {returncode}"
        return Check("chip", "fail", f"the {chip.name} chip could not be opened or run: {tail}",
                     "check that JAX sees the TPU (`python3 -c 'import jax; print(jax.devices())'`) and that no "
                     "other process holds it")
    report = json.loads(lines[-1])
    if report.get("busy") == "kernelbot":
        who = ", ".join(report.get("holders") or []) or "another kernelbot process"
        return Check("chip", "warn", f"the {chip.name} chip is in use by kernelbot ({who}): an evaluation on it; "
                     "runners on this host take turns on it", "run doctor again when it is idle to check the chip",
                     needed=False)
    if report.get("busy"):
        return Check("chip", "fail", report["busy"], "kernelbot's evaluations on this chip wait until it is free")
    if report["mismatches"]:
        return Check("chip", "fail", f"a Pallas kernel on {report['device_kind']} gave another result than XLA: "
                     f"{report['mismatches'][0]}", "reinstall the TPU host's JAX and libtpu")
    how = "device lane" if report["source"] == "trace:device" else report["source"]
    return Check("chip", "ok", f"{report['device_kind']} opened in {report['opened_s']:.1f} s; a Pallas kernel "
                 f"compiled by Mosaic on it gave XLA's result, {report['kernel_ms'] * 1e3:.1f} us per call vs XLA's "
                 f"{report['xla_ms'] * 1e3:.1f} us ({report['iterations']} calls, {how})")


def check_chip(chip: ChipSpec, *, timeout: float = CHIP_TIMEOUT_S, env: Mapping[str, str] | None = None) -> Check:
    with tempfile.TemporaryDirectory(prefix="kernelbot-doctor-") as tmp:
        try:
            proc = subprocess.run([sys.executable, "-c", _CHILD, tmp], capture_output=True, text=True,
                                  timeout=timeout, env=chip_environment(os.environ if env is None else env),
                                  cwd=SOURCE_ROOT)
        except subprocess.TimeoutExpired:
            return chip_verdict(chip, returncode=None, stdout="", stderr="", timeout=timeout)
    return chip_verdict(chip, returncode=proc.returncode, stdout=proc.stdout, stderr=proc.stderr, timeout=timeout)
