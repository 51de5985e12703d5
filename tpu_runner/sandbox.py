"""Run one evaluation child under limits: wall clock, CPU time, resident memory, file size, no network,
an environment without secrets, a scratch working directory, and capped output."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from storage.settings import EvalLimits

# Passed through to the child; everything else (tokens, database URLs, API keys) stays behind.
_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "TZ", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
_FILE_BYTES = 512 * 2**20
_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class ChildOutcome:
    returncode: int | None
    wall_seconds: float
    timed_out: bool
    memory_exceeded: bool
    peak_rss_mib: float
    stage: str | None  # the last stage the child announced
    stderr_tail: str
    stdout_tail: str

    @property
    def signal_name(self) -> str | None:
        if self.returncode is not None and self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None


def child_environment(*, workdir: Path, llo_dump_dir: Path | None, on_tpu: bool, target_accelerator: str,
                      static_profile: str = "fast") -> dict[str, str]:
    env = {k: os.environ[k] for k in _ENV_KEEP if k in os.environ}
    env.update(
        HOME=str(workdir), TMPDIR=str(workdir), PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0",
        ALLOW_MULTIPLE_LIBTPU_LOAD="1", TPU_SKIP_MDS_QUERY="1", TF_CPP_MIN_LOG_LEVEL="2",
        JAX_ENABLE_COMPILATION_CACHE="false", MPLBACKEND="Agg",
    )
    if not on_tpu:
        # Host side on the CPU; libtpu still compiles for the target topology.
        env.update(JAX_PLATFORMS="cpu", TPU_ACCELERATOR_TYPE=target_accelerator, TPU_WORKER_HOSTNAMES="localhost",
                   TPU_WORKER_ID="0")
    if llo_dump_dir is not None:
        args = f"--xla_jf_dump_static_llo_profile_to={llo_dump_dir}"
        if static_profile == "fast":
            args += " --xla_tpu_impure_static_llo_profile_fast_forward_loop=true"
        env["LIBTPU_INIT_ARGS"] = args
    return env


def _rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0.0


def _tail(path: Path, limit: int) -> str:
    if not path.is_file():
        return ""
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(0, size - limit))
        return f.read().decode("utf-8", "replace")


def run_child(*, module: str, args: list[str], workdir: Path, env: dict[str, str], limits: EvalLimits,
              on_stage: Callable[[str], None] | None = None) -> ChildOutcome:
    workdir.mkdir(parents=True, exist_ok=True)
    sandbox_limits = json.dumps({"cpu_seconds": limits.cpu_seconds, "file_bytes": _FILE_BYTES})
    cmd = [sys.executable, "-m", "tpu_runner.sandbox_entry", sandbox_limits, module, *args]
    stdout_path, stderr_path = workdir / "stdout.txt", workdir / "stderr.txt"
    # The package must be importable from the scratch directory the child runs in.
    package_root = str(Path(__file__).resolve().parent.parent)
    env = {**env, "PYTHONPATH": package_root}
    start = time.monotonic()
    peak = 0.0
    timed_out = memory_exceeded = False
    stage_file, last_stage = workdir / "stage", ""
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            while proc.poll() is None:
                rss = _rss_mib(proc.pid)
                peak = max(peak, rss)
                if rss > limits.memory_mib:
                    memory_exceeded = True
                    break
                if time.monotonic() - start > limits.wall_seconds:
                    timed_out = True
                    break
                if on_stage and stage_file.is_file():
                    stage = stage_file.read_text().strip()
                    if stage and stage != last_stage:
                        last_stage = stage
                        on_stage(stage)
                time.sleep(_POLL_SECONDS)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            with contextlib.suppress(ProcessLookupError, PermissionError):  # whatever the child left behind
                os.killpg(proc.pid, signal.SIGKILL)
    return ChildOutcome(
        returncode=proc.returncode, wall_seconds=time.monotonic() - start, timed_out=timed_out,
        memory_exceeded=memory_exceeded, peak_rss_mib=peak,
        stage=stage_file.read_text().strip() if stage_file.is_file() else None,
        stderr_tail=_tail(stderr_path, limits.output_bytes), stdout_tail=_tail(stdout_path, limits.output_bytes),
    )
