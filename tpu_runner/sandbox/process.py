"""Run one evaluation child under limits: wall clock, CPU time, resident memory, file size, no network,
an environment without secrets, a scratch working directory, and capped output."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from storage.settings import EvalLimits
from tpu_runner.hardware import FAST_FORWARD_FLAG, QUEUED_STAGE, STATIC_PROFILE_FLAG
from tpu_runner.reports import ChildStart, SandboxLimits

# Passed through to the child; everything else (tokens, database URLs, API keys) stays behind.
_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "TZ", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
_TPU_RUNTIME = ("TPU_", "LIBTPU", "CLOUD_TPU")  # a TPU host's runtime variables, for children on its chip
SOURCE_ROOT = Path(__file__).resolve().parents[2]
# No file a child writes may pass this: outputs at production shapes (and their float64 truth) are saved whole.
_FILE_BYTES = 4 * 2**30
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
    stopped: bool = False  # the supervisor stopped it (should_stop): its work was no longer needed

    @property
    def signal_name(self) -> str | None:
        return signal_name(self.returncode)

    def why_stopped(self, *, wall_seconds: int, memory_mib: int, doing: str = "starting",
                    tail_lines: int = 10) -> ChildStop:
        """Why the child ended without a report, in parts each caller words its own message from."""
        if self.timed_out:
            kind, how = "timeout", f"did not finish within {wall_seconds} s"
        elif self.memory_exceeded:
            kind, how = "memory_limit", f"used more than {memory_mib} MiB of memory"
        else:
            kind = {"SIGXCPU": "cpu_time_limit", "SIGXFSZ": "output_limit"}.get(self.signal_name or "", "crashed")
            how = exit_words(self.returncode)
        tail = "\n".join(self.stderr_tail.strip().splitlines()[-tail_lines:])
        return ChildStop(kind, how, self.stage or doing, tail)


@dataclass(frozen=True)
class ChildStop:
    kind: str  # timeout, memory_limit, cpu_time_limit, output_limit or crashed: an EvalError's kind
    how: str  # "did not finish within 60 s", "used more than 4096 MiB of memory", "was killed by SIGKILL", ...
    doing: str  # the last stage the child announced
    tail: str  # the end of its stderr


def signal_name(returncode: int | None) -> str | None:
    """The signal that ended a process, from its (negative) return code; None when it exited."""
    if returncode is not None and returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return None


def exit_words(returncode: int | None) -> str:
    """How a process ended, as words: 'was killed by SIGKILL' or 'exited with status 3'."""
    sig = signal_name(returncode)
    return f"was killed by {sig}" if sig else f"exited with status {returncode}"


def child_environment(*, workdir: Path, llo_dump_dir: Path | None, on_tpu: bool, target_accelerator: str,
                      static_profile: str = "fast") -> dict[str, str]:
    """A child's environment. On the chip (`on_tpu`): the TPU runtime's own variables as this host set them, JAX on
    the TPU. Elsewhere: JAX on the CPU, and libtpu told it compiles for `target_accelerator` alone - whatever this
    host's TPU runtime says, which would change the topology an ahead-of-time compile is for."""
    env = {k: os.environ[k] for k in _ENV_KEEP if k in os.environ}
    env.update(
        HOME=str(workdir), TMPDIR=str(workdir), PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0",
        TF_CPP_MIN_LOG_LEVEL="2", JAX_ENABLE_COMPILATION_CACHE="false", MPLBACKEND="Agg",
    )
    if on_tpu:
        env.update({k: v for k, v in os.environ.items() if k.startswith(_TPU_RUNTIME) and k != "LIBTPU_INIT_ARGS"})
        env["JAX_PLATFORMS"] = "tpu,cpu"  # the chip, and the CPU for what must not run on it
    else:
        env.update(JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1", TPU_SKIP_MDS_QUERY="1",
                   TPU_ACCELERATOR_TYPE=target_accelerator, TPU_WORKER_HOSTNAMES="localhost", TPU_WORKER_ID="0")
    if llo_dump_dir is not None:
        args = f"--{STATIC_PROFILE_FLAG}={llo_dump_dir}"
        if static_profile == "fast":
            args += f" --{FAST_FORWARD_FLAG}=true"
        env["LIBTPU_INIT_ARGS"] = args
    return env


def import_path() -> str:
    """The children's PYTHONPATH: this source tree, then this process's own (a TPU host's JAX may be there)."""
    return os.pathsep.join(p for p in (str(SOURCE_ROOT), os.environ.get("PYTHONPATH", "")) if p)


# The system's libraries and the few files of /etc that loading Python, numpy and JAX reads; not /etc as a whole
# (a runner's environment file with its tokens may be there), nor /tmp, /home, /root or /opt.
SYSTEM_READS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/dev", "/proc", "/sys", "/etc/ld.so.cache",
                "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/passwd", "/etc/group",
                "/etc/nsswitch.conf", "/etc/os-release", "/etc/ssl", "/etc/alternatives", "/etc/mime.types")
PACKAGES = ("tpu_runner", "storage", "agents", "bot", "tasks")  # of the source tree, what a child imports or reads


@dataclass(frozen=True)
class Reads:
    """What a child running a candidate's or a task's code may read (besides what it may write)."""

    readable: list[str]
    listable: list[str]


def untrusted_reads(*paths: Path, private: tuple[Path, ...] = ()) -> Reads:
    """Reads for a child running untrusted code: the interpreter and its import path (this process's, which the
    child is given), kernelbot's packages and built-in tasks, the system's libraries, and `paths` (the task, the
    kernel). An import-path entry that holds one of `private` (the runner's home, its caches) is left out - the
    source root is only listed, so that imports find its packages while a data directory beside them stays shut."""
    root = SOURCE_ROOT.resolve()
    shut = [p.resolve() for p in private]
    entries = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sys.path,
               *os.environ.get("PYTHONPATH", "").split(os.pathsep)}
    readable = []
    for entry in sorted(e for e in entries if e and os.path.isabs(e)):
        where = Path(entry).resolve()
        if where == root or any(p == where or where in p.parents for p in shut):
            continue
        readable.append(str(where))
    readable += [str(root / name) for name in PACKAGES] + list(SYSTEM_READS) + [str(p) for p in paths]
    return Reads(readable=readable, listable=[str(root)])


# Mappings of an accelerator's own memory into a process: a TPU host's runtime maps 8 GiB of the chip through vfio
# (seen on a v5e host), which VmRSS counts as resident though no host memory backs it.
DEVICE_MAPPINGS = ("anon_inode:[vfio-device]", "/dev/vfio/", "/dev/accel")
# Below this much VmRSS no process holds a chip (the runtime alone is larger), so smaps is not read while polling.
_DEVICE_FLOOR_MIB = 4096


def device_resident_kib(smaps: Iterable[str]) -> int:
    """The resident KiB of an accelerator's memory mapped into a process, from the lines of its /proc/PID/smaps."""
    total, device = 0, False
    for line in smaps:
        if line[:1] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:  # a mapping's header line
            fields = line.split(maxsplit=5)
            device = len(fields) > 5 and fields[5].strip().startswith(DEVICE_MAPPINGS)
        elif device and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def rss_mib(pid: int) -> float:
    """A process's resident host memory now, in MiB (0 where it is gone or unreadable): VmRSS less an accelerator's
    memory mapped into it (`DEVICE_MAPPINGS`), which would count a chip's own memory against the host's limit."""
    try:
        with open(f"/proc/{pid}/status") as f:
            kib = next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
        if kib > _DEVICE_FLOOR_MIB * 1024:
            with open(f"/proc/{pid}/smaps") as f:
                kib -= device_resident_kib(f)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return 0.0
    return kib / 1024


def _tail(path: Path, limit: int) -> str:
    if not path.is_file():
        return ""
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(0, size - limit))
        return f.read().decode("utf-8", "replace")


_running: set[subprocess.Popen[bytes]] = set()  # children being supervised, for a runner's shutdown
_running_lock = threading.Lock()


def kill_running_children() -> int:
    """Stop every child this process is supervising (a runner shutting down); returns how many."""
    with _running_lock:
        procs = list(_running)
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    return len(procs)


@dataclass
class SandboxProcess:
    """A sandboxed process that has applied its limits and imported its code, waiting for its arguments."""

    proc: subprocess.Popen[bytes]
    scratch: Path
    spawned_at: float

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def llo_dump_dir(self) -> Path:
        return self.scratch / "llo_dump"

    def discard(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def run(self, args: list[str], *, stage_file: Path, limits: EvalLimits,
            on_stage: Callable[[str], None] | None = None, gate: Gate | None = None,
            writable: tuple[Path, ...] = (), should_stop: Callable[[], bool] | None = None,
            reads: Reads | None = None) -> ChildOutcome:
        """Hand the child its arguments and supervise it until it ends, a limit stops it or `should_stop` says so.

        The child may write only beneath its scratch directory and `writable` (Landlock, see `entry`); with
        `reads` (a child running untrusted code), read only what they allow besides those.
        With a gate, stdin stays open: when the child writes the gate's file, the gate's answer (one line) is
        sent back and the child goes on or stops."""
        start = time.monotonic()
        peak = 0.0
        timed_out = memory_exceeded = stopped = False
        last_stage = ""
        proc = self.proc
        stdin = proc.stdin
        assert stdin is not None
        with _running_lock:
            _running.add(proc)
        try:
            hello = ChildStart(argv=args, writable=[str(p) for p in writable],
                               readable=reads.readable if reads else None, listable=reads.listable if reads else [],
                               memory_mib=limits.memory_mib)
            stdin.write((hello.to_json() + "\n").encode())
            stdin.flush()
            if gate is None:
                stdin.close()
        except BrokenPipeError:
            pass  # it died while waiting; its exit status says how
        queued = 0.0  # time spent waiting for the chip, which the wall limit does not count
        last_poll = start
        try:
            while proc.poll() is None:
                now = time.monotonic()
                if last_stage == QUEUED_STAGE:
                    queued += now - last_poll
                last_poll = now
                rss = rss_mib(proc.pid)
                peak = max(peak, rss)
                if rss > limits.memory_mib:
                    memory_exceeded = True
                    break
                if now - start - queued > limits.wall_seconds:
                    timed_out = True
                    break
                if should_stop is not None and should_stop():
                    stopped = True
                    break
                if gate is not None and not stdin.closed and gate.file.is_file():
                    _answer(proc, gate.answer(gate.file.read_text().strip()))
                stage = _read_stage(stage_file)
                if stage and stage != last_stage:
                    last_stage = stage
                    if on_stage:
                        on_stage(stage)
                time.sleep(_POLL_SECONDS)
        finally:
            self.discard()  # also whatever the child left in its session
            with _running_lock:
                _running.discard(proc)
        out, err = self.scratch / "stdout.txt", self.scratch / "stderr.txt"
        return ChildOutcome(
            returncode=proc.returncode, wall_seconds=time.monotonic() - start - queued, timed_out=timed_out,
            memory_exceeded=memory_exceeded, stopped=stopped, peak_rss_mib=peak,
            stage=stage_file.read_text().strip() if stage_file.is_file() else None,
            stderr_tail=_tail(err, limits.output_bytes), stdout_tail=_tail(out, limits.output_bytes),
        )


def _read_stage(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Gate:
    """A question the child asks once, by writing `file`; `answer` gets its content and returns the reply line."""

    file: Path
    answer: Callable[[str], str]


def _answer(proc: subprocess.Popen[bytes], reply: str) -> None:
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.write((reply.replace("\n", " ") + "\n").encode())
        proc.stdin.close()


def spawn(*, target: str, scratch: Path, env: dict[str, str], limits: EvalLimits) -> SandboxProcess:
    """Start a child running `target` (a module with main(argv), or a script path) that waits for its arguments."""
    (scratch / "llo_dump").mkdir(parents=True, exist_ok=True)
    sandbox_limits = SandboxLimits(cpu_seconds=limits.cpu_seconds, file_bytes=_FILE_BYTES,
                                   memory_mib=limits.memory_mib)
    cmd = [sys.executable, "-m", "tpu_runner.sandbox.entry", sandbox_limits.to_json(), target]
    # The package must be importable from the scratch directory the child runs in, and so must what this process
    # imports from its PYTHONPATH (a TPU host's own JAX).
    env = {**env, "PYTHONPATH": import_path()}
    with open(scratch / "stdout.txt", "wb") as out, open(scratch / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(cmd, cwd=scratch, env=env, stdout=out, stderr=err, stdin=subprocess.PIPE,
                                start_new_session=True)
    return SandboxProcess(proc=proc, scratch=scratch, spawned_at=time.monotonic())


def run_child(*, module: str, args: list[str], workdir: Path, env: dict[str, str], limits: EvalLimits,
              on_stage: Callable[[str], None] | None = None, writable: tuple[Path, ...] = (),
              reads: Reads | None = None) -> ChildOutcome:
    """Spawn a child in `workdir` and run it to the end: the cold path, without a spare."""
    child = spawn(target=module, scratch=workdir, env=env, limits=limits)
    return child.run(args, stage_file=workdir / "stage", limits=limits, on_stage=on_stage, writable=writable,
                     reads=reads)


def run_one_shot(*, module: str, root: Path, prefix: str, limits: EvalLimits,
                 request_for: Callable[[Path], dict], report_name: str) -> tuple[ChildOutcome, dict | None]:
    """A one-off check in a fresh sandboxed child on the CPU backend (it must not take a TPU a runner on this host
    may be using): `request_for(scratch)` writes what the child needs and returns its request; the child writes
    `report_name` beside it. Returns the outcome and the report (None when the child did not finish with one);
    the scratch directory is removed either way."""
    scratch = root / f"{prefix}-{uuid.uuid4().hex[:10]}"
    scratch.mkdir(parents=True)
    try:
        request_path = scratch / "request.json"
        request_path.write_text(json.dumps(request_for(scratch)))
        env = child_environment(workdir=scratch, llo_dump_dir=None, on_tpu=False, target_accelerator="v6e-1")
        outcome = run_child(module=module, args=[str(request_path)], workdir=scratch, env=env, limits=limits)
        report = scratch / report_name
        finished = not (outcome.timed_out or outcome.memory_exceeded or outcome.returncode != 0) and report.is_file()
        return outcome, json.loads(report.read_text()) if finished else None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
