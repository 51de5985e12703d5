"""What runs the evaluator on a TPU host, checked without one: finding the host's chip, one holder at a time,
children's environments, the wall limit that does not count the wait for the chip, the one-chip compile whatever
the host's runtime says, and reading the device lane of a TPU trace."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from bot.cli.checks.chip import chip_verdict
from bot.cli.checks.compile import check_compile
from storage.settings import EvalLimits, host_target, load_settings, target_of_accelerator
from tpu_runner.evaluation import headline
from tpu_runner.hardware import FAST_FORWARD_FLAG, STATIC_PROFILE_FLAG, chip, get_chip, knows_flag
from tpu_runner.sandbox import child_environment, import_path, run_child
from tpu_runner.timing import band_text, device_ops, measured_band, per_call_durations

# The TPU runtime's variables as a v5e host sets them.
HOST_TPU_ENV = {"TPU_ACCELERATOR_TYPE": "v5litepod-4", "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1", "TPU_HOST_BOUNDS": "1,1,1",
                "TPU_TOPOLOGY": "2x2", "TPU_WORKER_ID": "0", "TPU_SKIP_MDS_QUERY": "true",
                "TPU_WORKER_HOSTNAMES": "localhost"}


def _dev(tmp_path: Path, *files: str) -> Path:
    dev = tmp_path / "dev"
    for name in files:
        (dev / name).parent.mkdir(parents=True, exist_ok=True)
        (dev / name).touch()
    dev.mkdir(parents=True, exist_ok=True)
    return dev


def test_the_host_chip_is_its_device_files_and_the_runtimes_accelerator_type(tmp_path: Path) -> None:
    assert target_of_accelerator("v5litepod-4") == "v5e" and target_of_accelerator("v6e-8") == "v6e"
    assert target_of_accelerator("v5p-8") == "v5p" and target_of_accelerator("v4-8") is None
    assert host_target(HOST_TPU_ENV, _dev(tmp_path, "vfio/2")) == "v5e"
    assert host_target(HOST_TPU_ENV, _dev(tmp_path / "a", "accel0")) == "v5e"
    assert host_target(HOST_TPU_ENV, _dev(tmp_path / "none")) is None  # a variable alone is no chip
    assert host_target({}, _dev(tmp_path / "b", "vfio/0")) is None
    here = load_settings({"KERNELBOT_HOME": str(tmp_path / "home")})
    assert here.host_target is None and here.default_target == "v6e" and not here.on_chip("v6e")


def test_the_chip_has_one_holder_at_a_time_and_the_lock_goes_with_its_process(tmp_path: Path) -> None:
    lock = tmp_path / "tpu.lock"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(chip.__file__).parent.parent)!r})
        from tpu_runner.hardware import chip
        fd = chip.try_hold(__import__("pathlib").Path({str(lock)!r}))
        print("held" if fd is not None else "busy", flush=True)
        time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert chip.try_hold(lock) is None
        waited: list[bool] = []
        with pytest.raises(chip.ChipBusy, match="more than 0 s"):
            chip.hold(on_wait=lambda: waited.append(True), timeout=0.3, path=lock)
        assert waited == [True]
    finally:
        holder.kill()  # as an abort or a kill would end it
        holder.wait()
    fd = chip.hold(timeout=5, path=lock)
    chip.release(fd)


def test_a_busy_chip_is_said_with_who_holds_it_and_what_to_do() -> None:
    named = chip.busy_message([chip.Holder(4242, "python3 notebook.py")])
    assert "pid 4242 (python3 notebook.py)" in named and "kill 4242" in named
    assert "another user" in chip.busy_message([])
    assert chip.holders() == []  # no process holds a TPU device file here
    verdict = chip_verdict(get_chip("v5e"), returncode=0, stdout="kernelbot-doctor-chip: " + json.dumps(
        {"busy": "kernelbot", "holders": ["pid 7 (python -m tpu_runner.sandbox.entry ...)"]}), stderr="", timeout=1)
    assert verdict.status == "warn" and "pid 7" in verdict.detail and not verdict.needed


def test_children_on_the_chip_keep_the_runtime_and_others_compile_for_the_target_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in HOST_TPU_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PYTHONPATH", "/opt/host-jax")
    on = child_environment(workdir=tmp_path, llo_dump_dir=None, on_tpu=True, target_accelerator="v5e-1")
    assert on["JAX_PLATFORMS"] == "tpu,cpu" and on["TPU_CHIPS_PER_HOST_BOUNDS"] == "2,2,1"
    assert "ALLOW_MULTIPLE_LIBTPU_LOAD" not in on  # libtpu's own lock stays on for the chip's holder
    off = child_environment(workdir=tmp_path, llo_dump_dir=None, on_tpu=False, target_accelerator="v5e-1")
    assert off["JAX_PLATFORMS"] == "cpu" and off["TPU_ACCELERATOR_TYPE"] == "v5e-1"
    assert "TPU_CHIPS_PER_HOST_BOUNDS" not in off
    assert import_path().split(os.pathsep)[-1] == "/opt/host-jax"  # a TPU host's JAX on its PYTHONPATH


def test_the_one_chip_compile_is_not_disturbed_by_a_tpu_hosts_runtime_variables() -> None:
    check = check_compile("v5e", timeout=180, env={**os.environ, **HOST_TPU_ENV})
    assert check.status == "ok", check


def test_static_profiler_flags_are_looked_up_in_the_installed_libtpu() -> None:
    assert knows_flag(STATIC_PROFILE_FLAG) and knows_flag(FAST_FORWARD_FLAG)  # jax 0.12's libtpu has both
    assert not knows_flag("xla_no_such_flag_kernelbot")


def test_the_wait_for_the_chip_is_not_counted_against_the_wall_limit(tmp_path: Path) -> None:
    script = tmp_path / "queued.py"
    script.write_text(textwrap.dedent(f"""
        import time, pathlib
        pathlib.Path("stage").write_text({chip.QUEUED_STAGE!r})
        time.sleep(4)
        pathlib.Path("stage").write_text("load")
        time.sleep(1)
        pathlib.Path("done").write_text("yes")
        """))
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = child_environment(workdir=workdir, llo_dump_dir=None, on_tpu=False, target_accelerator="v6e-1")
    started = time.monotonic()
    outcome = run_child(module=str(script), args=[], workdir=workdir, env=env, limits=EvalLimits(wall_seconds=3))
    assert not outcome.timed_out and (workdir / "done").is_file(), outcome
    assert time.monotonic() - started > 4.5 and outcome.wall_seconds < 3.5


def _trace(path: Path, events: list[dict]) -> Path:
    meta = [{"ph": "M", "name": "process_name", "pid": 3, "args": {"name": "/device:TPU:0"}},
            {"ph": "M", "name": "process_name", "pid": 701, "args": {"name": "/host:CPU"}}]
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": meta + events}).encode()))
    return path


def test_times_and_ops_come_from_the_device_lane_of_a_tpu_trace(tmp_path: Path) -> None:
    events = []
    for call in range(3):
        t = 1000.0 * call
        events += [{"ph": "X", "pid": 3, "tid": 1, "name": "jit__kb_candidate(81324)", "ts": t, "dur": 400.0},
                   {"ph": "X", "pid": 3, "tid": 2, "name": "_softmax.1", "ts": t + 5, "dur": 380.0},
                   {"ph": "X", "pid": 3, "tid": 2, "name": "copy.2", "ts": t + 386, "dur": 10.0 + call},
                   {"ph": "X", "pid": 701, "tid": 9, "name": "PjitFunction(_kb_candidate)", "ts": t, "dur": 900.0},
                   {"ph": "C", "pid": 3, "name": "VDD Core FW Throttle(%)", "ts": t}]
    trace = _trace(tmp_path / "t.trace.json.gz", events)
    samples, source = per_call_durations(trace, "_kb_candidate")
    assert source == "trace:device" and samples == [0.4, 0.4, 0.4]
    assert device_ops(trace, "_kb_candidate") == [("_softmax.1", 380000.0), ("copy.2", 11000.0)]
    assert per_call_durations(trace, "_kb_reference") == ([], "trace:host")


def test_a_measured_result_says_where_with_its_spread_and_the_estimate_beside_it() -> None:
    band = measured_band(2.0, (1.5, 0.015), (0.75, 0.0))
    assert band[0] < 2.0 < band[1] and band_text(SimpleNamespace(method="measured", band=band)) == "±1%"
    assert band_text(SimpleNamespace(method="measured", band=measured_band(1.01, (1.0, 0.05), (0.99, 0.0)))) \
        .endswith("no clear gain")
    perf = SimpleNamespace(method="measured", speedup=2.0, candidate=0.75, reference=1.5, band=band,
                           roofline_fraction=0.61, detail={"device": "TPU v5 lite", "iterations": 20,
                                                           "estimate": {"speedup": 1.9}})
    assert headline(perf, "v5e") == ("x2.00 vs reference (measured on TPU v5 lite: 0.75 ms vs 1.5 ms, 20 "
                                     "iterations, ±1%; estimated x1.90), 61% of roofline")
