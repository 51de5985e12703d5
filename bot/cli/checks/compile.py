"""The ahead-of-time compile: a one-kernel Pallas program compiled for the default target in a child process
with a timeout, so a broken libtpu can neither hang nor crash doctor."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

from bot.cli.checks.install import JAX_PIN, installed_version
from bot.cli.checks.report import Check
from bot.task_suites import SOURCE_ROOT
from tpu_runner.hardware import ChipSpec, get_chip
from tpu_runner.sandbox import exit_words

COMPILE_TIMEOUT_S = 180.0
_COMPILE_MARKER = "kernelbot-doctor-compile: "
_COMPILE_CHILD = "import sys; from bot.cli.checks.compile import compile_probe; compile_probe(sys.argv[1])"


def _add_one_kernel(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref[...] + 1.0  # [8, 128] f32: one (8, 128) tile in VMEM


def compile_probe(target: str) -> None:
    """In the child: lower and compile a tiny Pallas kernel for the target's topology; print one marked line."""
    from tpu_runner.evaluation import prepare_libtpu_env

    chip = get_chip(target)
    prepare_libtpu_env(chip)  # before libtpu starts
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the host side; libtpu still compiles for the topology
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    from tpu_runner.compiler import target_sharding

    t0 = time.perf_counter()
    sharding = target_sharding(chip)
    kernel = pl.pallas_call(_add_one_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    lowered = jax.jit(kernel).trace(jax.ShapeDtypeStruct((8, 128), jnp.float32, sharding=sharding)).lower()
    compiled = lowered.compile()
    memory = compiled.memory_analysis()
    report = {"target": target, "topology": chip.topology, "seconds": round(time.perf_counter() - t0, 2),
              "device_kind": sharding.mesh.devices.flat[0].device_kind,
              "mosaic": "tpu_custom_call" in lowered.as_text(), "argument_bytes": memory.argument_size_in_bytes}
    print(_COMPILE_MARKER + json.dumps(report), flush=True)


def compile_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: the host side on the CPU, libtpu loadable beside other compiling processes, and
    told it compiles for the target alone, whatever this host's TPU runtime says."""
    # A TPU host's runtime variables describe its chips, not the target (TPU_LIBRARY_PATH names libtpu: kept).
    env = {k: v for k, v in base.items() if not k.startswith("TPU_") or k == "TPU_LIBRARY_PATH"}
    env.update(ALLOW_MULTIPLE_LIBTPU_LOAD="1", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
               JAX_ENABLE_COMPILATION_CACHE="false", PYTHONPATH=os.pathsep.join(
                   p for p in (str(SOURCE_ROOT), base.get("PYTHONPATH", "")) if p))
    return env


def compile_command(target: str) -> list[str]:
    return [sys.executable, "-c", _COMPILE_CHILD, target]


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b.*")


def error_summary(text: str, count: int = 3, limit: int = 600) -> str:
    """The child's own error: the last exception line of a traceback, else its last few meaningful lines."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip().strip("~^ ")]
    exceptions = [line for line in lines if _EXCEPTION_LINE.match(line)]
    return (exceptions[-1] if exceptions else " | ".join(lines[-count:]))[-limit:]


def compile_verdict(chip: ChipSpec, *, returncode: int | None, stdout: str, stderr: str, seconds: float,
                    timeout: float) -> Check:
    """What the child's ending says about libtpu (returncode None: it was stopped at the timeout)."""
    import shlex

    by_hand = f"`{shlex.join(compile_command(chip.name))}`"
    reinstall = f"`pip install --force-reinstall 'jax[tpu]=={installed_version('jax') or JAX_PIN}'`"
    if returncode is None:
        return Check("compile", "fail", f"the {chip.name} ({chip.topology}) compile did not finish within "
                     f"{timeout:g} s and was stopped", f"run it by hand to see where it stops: {by_hand}; a host "
                     "this slow or busy needs a longer --compile-timeout (or --skip-compile)")
    reports = [line.removeprefix(_COMPILE_MARKER) for line in stdout.splitlines() if line.startswith(_COMPILE_MARKER)]
    if returncode == 0 and reports:
        report = json.loads(reports[-1])
        if not report["mosaic"]:
            return Check("compile", "fail", f"the Pallas kernel compiled for {chip.name} without a Mosaic call: "
                         "kernels would not be checked as the TPU compiles them", reinstall)
        done = (f"a Pallas kernel compiled ahead of time for {chip.name} ({chip.topology}) with libtpu in "
                f"{report['seconds']:.1f} s ({seconds:.1f} s with start-up)")
        if report["device_kind"] != chip.device_kind:
            return Check("compile", "warn", f"{done}, but libtpu calls the chip {report['device_kind']!r} where "
                         f"kernelbot expects {chip.device_kind!r}",
                         f"check that libtpu {installed_version('libtpu')} is the one jax pins; {reinstall}")
        return Check("compile", "ok", done)
    how = exit_words(returncode)
    tail = error_summary(stderr) or error_summary(stdout) or "no output"
    return Check("compile", "fail", f"the {chip.name} ({chip.topology}) compile {how}: {tail}",
                 f"see the whole error with {by_hand}; a broken or mismatched libtpu is fixed by {reinstall}")


def check_compile(target: str, *, timeout: float = COMPILE_TIMEOUT_S,
                  env: Mapping[str, str] | None = None) -> Check:
    """A tiny Pallas kernel lowered and compiled for the target topology, in a child with a timeout."""
    chip = get_chip(target)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(compile_command(target), capture_output=True, text=True, timeout=timeout,
                              env=compile_environment(os.environ if env is None else env), cwd=SOURCE_ROOT)
    except subprocess.TimeoutExpired:
        return compile_verdict(chip, returncode=None, stdout="", stderr="", seconds=time.perf_counter() - t0,
                               timeout=timeout)
    return compile_verdict(chip, returncode=proc.returncode, stdout=proc.stdout, stderr=proc.stderr,
                           seconds=time.perf_counter() - t0, timeout=timeout)
