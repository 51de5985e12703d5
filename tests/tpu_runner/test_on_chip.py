"""On this host's TPU (`-m tpu`; skipped, saying so, on a host without one): doctor names and runs the chip, a kernel
is checked and timed on it, and kernels that hang, exhaust HBM or die on it are ended with the chip free again for
the next one. Run them in one process (`./kb test -m tpu -n 0`): the chip has one holder at a time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bot.cli.checks.chip import check_chip
from bot.cli.checks.compile import check_compile
from storage.settings import Settings, load_settings
from tests.conftest import HOST_TPU, TASKS
from tpu_runner.evaluation import EvalRequest
from tpu_runner.evaluation.evaluate import evaluate
from tpu_runner.hardware import ChipBusy, get_chip
from tpu_runner.hardware import chip as host_chip
from tpu_runner.runner import RunnerConfig, RunnerDaemon, describe_host
from tpu_runner.sandbox import process as sandbox

pytestmark = pytest.mark.tpu
SOFTMAX = TASKS / "softmax"
FREE_AFTER_S = 10.0  # a child ended on the chip leaves it free within this (seen: ~2 s to reap a killed one)

HANGS = '''import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _spin_kernel(x_ref, o_ref):
    def body(c):
        return c + x_ref[0, 0] * 0.0 + 1.0

    o_ref[...] = x_ref[...] + jax.lax.while_loop(lambda c: c > -1.0, body, 0.0)  # never ends


def computation(x):
    spec = pl.BlockSpec((32, x.shape[1]), lambda i: (i, 0))  # 1 MiB blocks: within v5e's default scoped VMEM
    return pl.pallas_call(_spin_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // 32,),
                          in_specs=[spec], out_specs=spec)(x)
'''

# 64 copies of the input as one output: 17 GB, more than the chip's HBM.
EXHAUSTS_HBM = '''import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

COPIES = 64


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...][None]


def computation(x):
    rows, cols = x.shape
    wide = pl.pallas_call(
        _copy_kernel, out_shape=jax.ShapeDtypeStruct((COPIES, rows, cols), x.dtype), grid=(COPIES, rows // 32),
        in_specs=[pl.BlockSpec((32, cols), lambda c, i: (i, 0))],
        out_specs=pl.BlockSpec((1, 32, cols), lambda c, i: (c, i, 0)))(x)
    return jax.nn.softmax(jnp.sum(wide, axis=0) / COPIES, axis=-1)
'''


@pytest.fixture
def chip_settings(tmp_path: Path, shared_cache: Path) -> Settings:
    """This host's settings (its TPU found from the environment), with a wall limit short enough for the hang."""
    return load_settings({**os.environ, "KERNELBOT_HOME": str(tmp_path / "home"),
                          "KERNELBOT_CACHE_DIR": str(shared_cache), "KERNELBOT_EVAL_TIMEOUT": "90"})


def _kernel(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return path


def _chip_is_free_within(seconds: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        fd = host_chip.try_hold()
        if fd is not None and not host_chip.holders():
            host_chip.release(fd)
            return time.monotonic() - start
        if fd is not None:
            host_chip.release(fd)
        time.sleep(0.2)
    raise AssertionError(f"the chip was still held {seconds} s later: {host_chip.holders()}")


def _good_kernel_is_measured(settings: Settings) -> None:
    result = evaluate(EvalRequest(SOFTMAX, SOFTMAX / "solutions" / "pallas.py", settings.default_target), settings)
    perf = result.performance
    assert result.verdict == "ok" and result.host == "tpu", result.message
    assert perf is not None and perf.method == "measured" and perf.detail["source"] == "trace:device"
    assert perf.detail["device"] == get_chip(settings.default_target).device_kind
    assert perf.detail["iterations"] >= 10 and perf.band is not None and "estimate" in perf.detail
    assert result.correctness is not None and result.correctness.status == "passed"
    assert [c.name for c in result.correctness.cases][0].startswith("production[0]/")
    assert "measured on TPU" in result.message and "estimated x" in result.message
    assert Path(result.artifacts["trace"]).is_file()


def test_doctor_names_the_chip_makes_it_the_default_and_runs_a_kernel_on_it(chip_settings: Settings) -> None:
    assert chip_settings.host_target == HOST_TPU and chip_settings.default_target == HOST_TPU
    chip = get_chip(HOST_TPU)
    check = check_chip(chip)
    assert check.status == "ok", check
    assert chip.device_kind in check.detail and "gave XLA's result" in check.detail
    compiled = check_compile(chip.name)  # ahead of time for the one-chip topology, whatever this host's runtime says
    assert compiled.status == "ok", compiled
    assert describe_host(chip_settings)["device_kind"] == chip.device_kind


def test_a_kernel_is_checked_at_production_shapes_and_timed_on_the_chip(chip_settings: Settings) -> None:
    _good_kernel_is_measured(chip_settings)


def test_a_kernel_that_hangs_on_the_chip_is_stopped_and_the_next_one_runs(chip_settings: Settings,
                                                                          tmp_path: Path) -> None:
    started = time.monotonic()
    result = evaluate(EvalRequest(SOFTMAX, _kernel(tmp_path, "hangs", HANGS), chip_settings.default_target),
                      chip_settings)
    assert result.verdict == "timeout", result.message
    assert time.monotonic() - started < chip_settings.limits.wall_seconds + 60
    _chip_is_free_within(FREE_AFTER_S)
    _good_kernel_is_measured(chip_settings)


def test_a_kernel_that_exhausts_hbm_gets_a_verdict_and_the_next_one_runs(chip_settings: Settings,
                                                                         tmp_path: Path) -> None:
    result = evaluate(EvalRequest(SOFTMAX, _kernel(tmp_path, "hbm", EXHAUSTS_HBM), chip_settings.default_target),
                      chip_settings)
    assert result.verdict != "ok" and result.error is not None, result.message
    assert "hbm" in result.error.kind or "memory" in result.error.detail.lower(), result.error
    _chip_is_free_within(FREE_AFTER_S)
    _good_kernel_is_measured(chip_settings)


def test_a_child_that_aborts_on_the_chip_is_reported_and_the_next_one_runs(chip_settings: Settings) -> None:
    """A process that dies on the chip (libtpu aborts the process on a failed internal check) is stood in for by
    SIGABRT sent to the candidate's child while it runs on the chip."""
    aborted: list[int] = []

    def abort_when_on_chip() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            running = {proc.pid for proc in list(sandbox._running)}
            on_chip = [h.pid for h in host_chip.holders()
                       if h.pid in running and "tpu_runner.candidate.child" in h.command]
            if on_chip:
                os.kill(on_chip[0], signal.SIGABRT)
                aborted.append(on_chip[0])
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=abort_when_on_chip, daemon=True)
    watcher.start()
    result = evaluate(EvalRequest(SOFTMAX, SOFTMAX / "solutions" / "pallas.py", chip_settings.default_target),
                      chip_settings)
    watcher.join()
    assert aborted, "the child never held the chip"
    assert result.verdict == "crashed" and "SIGABRT" in result.message, result.message
    _chip_is_free_within(FREE_AFTER_S)
    _good_kernel_is_measured(chip_settings)


def test_a_chip_held_outside_kernelbot_is_named_not_waited_for(chip_settings: Settings) -> None:
    env = {**os.environ, "JAX_PLATFORMS": "tpu"}
    env.pop("ALLOW_MULTIPLE_LIBTPU_LOAD", None)
    holder = subprocess.Popen([sys.executable, "-c", "import jax, time; jax.devices(); print('held', flush=True); "
                               "time.sleep(300)"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        check = check_chip(get_chip(HOST_TPU))
        assert check.status == "fail" and f"pid {holder.pid}" in check.detail, check
        with pytest.raises(ChipBusy, match=f"pid {holder.pid}"):
            evaluate(EvalRequest(SOFTMAX, SOFTMAX / "solutions" / "pallas.py", chip_settings.default_target),
                     chip_settings)
    finally:
        holder.kill()
        holder.wait()
    _chip_is_free_within(FREE_AFTER_S)


def test_the_runner_daemon_evaluates_a_queued_kernel_on_the_chip(chip_settings: Settings) -> None:
    from sqlmodel import Session, select

    from storage import queue
    from storage.connect import open_database
    from storage.models import Evaluation, Job

    engine = open_database(chip_settings)
    with Session(engine) as s, s.begin():
        job = queue.enqueue(s, kind="evaluate", target=HOST_TPU, payload={
            "task_dir": str(SOFTMAX), "kernel_path": str(SOFTMAX / "solutions" / "pallas.py"), "target": HOST_TPU})
        job_id = job.id
    daemon = RunnerDaemon(engine=engine, settings=chip_settings, hardware=describe_host(chip_settings),
                          config=RunnerConfig(name="on-chip", targets=(HOST_TPU,), exit_when_idle=True,
                                              poll_seconds=0.2))
    assert daemon.run() == 0 and daemon.completed == 1
    with Session(engine) as s:
        done = s.get(Job, job_id)
        assert done is not None and done.status == "done" and done.result["verdict"] == "ok", done
        (evaluation,) = s.exec(select(Evaluation).where(Evaluation.verdict == "ok")).all()
        assert evaluation.method == "measured" and evaluation.result["host"] == "tpu"
