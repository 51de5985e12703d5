"""Compiles exported programs on long-lived compile servers (`tpu_runner.compiler.server`), one request each.

Every compile first goes to a server started with libtpu's static profiler, whose cycle counts the estimate
uses. libtpu's profiler aborts the process on some ordinary programs (bf16 elementwise code for v6e), so an
abort, or an error that names the profiler, is retried on a server without it: a program libtpu compiles is
never a compile error, its estimate just goes on without cycles (`CompileAnswer.profile_failure` says why).
Only what fails without the profiler too is the program's: an exception is a compile error, an abort a
compiler crash. Servers never run candidate or task code, so they outlive evaluations: the start-up of Python,
JAX and libtpu is paid once, not per candidate.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from storage.settings import EvalLimits
from tpu_runner.analysis import HloOp, parsed_hlo
from tpu_runner.hardware import FAST_FORWARD_FLAG, knows_flag
from tpu_runner.reports import ChildStart, CompileReply, CompileRequest, EvalError, classify_text
from tpu_runner.sandbox import SandboxProcess, child_environment, rss_mib, spawn

# libtpu's fatal log lines: a failed internal check, or the static profiler refusing the program.
LIBTPU_ABORT_SIGNS = ("Check failed", "LLO_CHECK", "Static LLO profiling of")
PROFILER_SIGNS = ("static llo profil", "llo_check", "static_llo")
SERVER_CPU_SECONDS = 6 * 3600
# The static profiler can take far more than the compile itself (20 GB and minutes on a grouped matmul whose
# plain compile takes 0.6 GB and 2 s); beyond these it is given up and the estimate goes on without cycles.
PROFILE_MEMORY_MIB = 3072
PROFILE_SECONDS = 120
REQUESTS_PER_SERVER = 200  # then it is replaced, so caches and fragmentation do not pile up
# A server that kept more than this after a compile is replaced too: the allocator does not give back what a
# large program took, and the next large one would start from there (two 6 GB compiles need 8 GB more than one).
RETIRE_RSS_MIB = 2048
_POLL = 0.02


@dataclass
class CompileAnswer:
    ok: bool
    cost: dict[str, float] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)
    ops: list[tuple[str, int]] = field(default_factory=list)  # (op, estimated cycles) from the static profile
    hlo_text: str = ""  # the optimised program, as XLA prints it
    compile_seconds: float = 0.0
    profiled: bool = False  # the cycles come from the static profiler
    profile_failure: str | None = None  # why there are no cycles though the program compiled
    error: EvalError | None = None  # why it did not compile (stage "compile")
    peak_rss_mib: float = 0.0

    @property
    def hlo_ops(self) -> tuple[HloOp, ...]:
        """The optimised program's top-level ops (parsed here, where the candidate never ran)."""
        return parsed_hlo(self.hlo_text)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CompileAnswer:
        """An answer cached as JSON (asdict) back as itself."""
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{**{k: v for k, v in data.items() if k in known},
                      "ops": [(str(n), int(c)) for n, c in data.get("ops", [])]})


def libtpu_checks(stderr: str) -> list[str]:
    return list(dict.fromkeys(line.strip() for line in stderr.splitlines()
                              if any(sign in line for sign in LIBTPU_ABORT_SIGNS)))


@dataclass
class _Server:
    child: SandboxProcess
    profiled: bool
    served: int = 0

    @property
    def stderr(self) -> Path:
        return self.child.scratch / "stderr.txt"


def profiler_unavailable(static_profile: str) -> str | None:
    """Why this host's libtpu cannot give the static profile asked for, or None when it can."""
    if static_profile == "off":
        return "the static profile is off (KERNELBOT_STATIC_PROFILE=off)"
    if static_profile == "fast" and not knows_flag(FAST_FORWARD_FLAG):
        return ("this libtpu has no fast-forward static profiler (it came with jax 0.12's libtpu); "
                "KERNELBOT_STATIC_PROFILE=exact gives cycles at a much higher compile cost")
    return None


class CompileService:
    def __init__(self, *, root: Path, limits: EvalLimits, static_profile: str = "fast"):
        self.root, self.limits, self.static_profile = root, limits, static_profile
        self.no_profile = profiler_unavailable(static_profile)
        self._idle: dict[tuple[str, bool], list[_Server]] = {}
        self._lock = threading.Lock()
        self._closed = False

    # -- servers ---------------------------------------------------------------------------------------------
    def _spawn(self, target: str, profiled: bool) -> _Server:
        scratch = self.root / f"compile-{target}-{'profiled' if profiled else 'plain'}-{uuid.uuid4().hex[:8]}"
        scratch.mkdir(parents=True, exist_ok=True)
        env = child_environment(workdir=scratch, llo_dump_dir=scratch / "llo_dump" if profiled else None,
                                on_tpu=False, target_accelerator=f"{target}-1", static_profile=self.static_profile)
        limits = replace(self.limits, cpu_seconds=SERVER_CPU_SECONDS)
        child = spawn(target="tpu_runner.compiler.server", scratch=scratch, env=env, limits=limits)
        assert child.proc.stdin is not None
        child.proc.stdin.write((ChildStart(argv=[], writable=[]).to_json() + "\n").encode())
        child.proc.stdin.flush()
        return _Server(child, profiled)

    def _acquire(self, target: str, profiled: bool) -> _Server:
        with self._lock:
            idle = self._idle.setdefault((target, profiled), [])
            while idle:
                server = idle.pop()
                if server.child.alive:
                    return server
                self._discard(server)
        return self._spawn(target, profiled)

    def _release(self, target: str, server: _Server) -> None:
        bloated = server.child.alive and rss_mib(server.child.proc.pid) > RETIRE_RSS_MIB
        with self._lock:
            if self._closed or not server.child.alive or server.served >= REQUESTS_PER_SERVER or bloated:
                self._discard(server)
                return
            self._idle.setdefault((target, server.profiled), []).append(server)

    @staticmethod
    def _discard(server: _Server) -> None:
        server.child.discard()
        shutil.rmtree(server.child.scratch, ignore_errors=True)

    def warm(self, target: str) -> None:
        """Start a profiled server for `target` now, so the first compile does not wait for it."""
        profiled = self.no_profile is None
        with self._lock:
            idle = self._idle.setdefault((target, profiled), [])
            if not idle:
                idle.append(self._spawn(target, profiled))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            servers = [s for group in self._idle.values() for s in group]
            self._idle.clear()
        for server in servers:
            self._discard(server)

    # -- one request -----------------------------------------------------------------------------------------
    def _request(self, server: _Server, exported: Path, target: str, keep_in: Path | None,
                 label: str) -> tuple[CompileReply | None, str, float, str | None]:
        memory_mib, seconds = self.limits.memory_mib, self.limits.wall_seconds
        if server.profiled:
            memory_mib, seconds = min(memory_mib, PROFILE_MEMORY_MIB), min(seconds, PROFILE_SECONDS)
        """(answer or None if the server died or was stopped, the stderr it wrote meanwhile, peak RSS, why
        it was stopped: 'timeout' / 'memory' / None)."""
        rid = uuid.uuid4().hex[:12]
        offset = server.stderr.stat().st_size if server.stderr.is_file() else 0
        proc = server.child.proc
        assert proc.stdin is not None
        try:
            proc.stdin.write((CompileRequest(id=rid, exported=str(exported), target=target).to_json() + "\n").encode())
            proc.stdin.flush()
        except BrokenPipeError:
            pass
        server.served += 1
        result = server.child.scratch / "out" / rid / "result.json"
        start, peak, stopped = time.monotonic(), 0.0, None
        while not result.is_file():
            if proc.poll() is not None:
                break
            rss = rss_mib(proc.pid)
            peak = max(peak, rss)
            if rss > memory_mib:
                stopped = "memory"
            elif time.monotonic() - start > seconds:
                stopped = "timeout"
            if stopped:
                server.child.discard()
                break
            time.sleep(_POLL)
        stderr = ""
        if server.stderr.is_file():
            with open(server.stderr, "rb") as f:
                f.seek(offset)
                stderr = f.read().decode("utf-8", "replace")[-self.limits.output_bytes:]
        if not result.is_file():
            return None, stderr, peak, stopped
        answer = CompileReply.read(result)
        llo = result.parent / "llo"
        if keep_in is not None and llo.is_dir():
            keep_in.mkdir(parents=True, exist_ok=True)
            for path in llo.iterdir():
                shutil.move(path, keep_in / f"{label}.{path.name.replace(' ', '_')}")
        shutil.rmtree(result.parent, ignore_errors=True)
        return answer, stderr, peak, None

    def _once(self, exported: Path, target: str, profiled: bool, keep_in: Path | None,
              label: str) -> tuple[CompileReply | None, str, float, str | None]:
        server = self._acquire(target, profiled)
        try:
            return self._request(server, exported, target, keep_in, label)
        finally:
            self._release(target, server)

    def compile(self, exported: Path, *, target: str, keep_in: Path | None = None, label: str = "program",
                profile: bool = True) -> CompileAnswer:
        """Compile for `target`; with `profile`, also libtpu's static cycle profile when it can be had."""
        if not profile or self.no_profile:
            return self._plain(exported, target, label, 0.0, self.no_profile if profile else None)
        answer, stderr, peak, stopped = self._once(exported, target, True, keep_in, label)
        if answer is not None and answer.ok:
            return self._answer(answer, peak)
        profiler_trouble = answer is None or any(s in answer.error.lower() for s in PROFILER_SIGNS)
        if answer is not None and not profiler_trouble:
            return self._refused(answer, peak)
        return self._plain(exported, target, label, peak, self._profile_failure(answer, stderr, stopped))

    def _plain(self, exported: Path, target: str, label: str, peak: float, why: str | None) -> CompileAnswer:
        plain, plain_stderr, plain_peak, plain_stopped = self._once(exported, target, False, None, label)
        peak = max(peak, plain_peak)
        if plain is not None and plain.ok:
            result = self._answer(plain, peak)
            result.profile_failure = why
            return result
        if plain is not None:
            return self._refused(plain, peak)
        if plain_stopped == "timeout":
            return CompileAnswer(False, peak_rss_mib=peak, error=EvalError(
                "timeout", f"compiling did not finish within {self.limits.wall_seconds} s", stage="compile"))
        if plain_stopped == "memory":
            return CompileAnswer(False, peak_rss_mib=peak, error=EvalError(
                "memory_limit", f"compiling used more than {self.limits.memory_mib} MiB of memory (set "
                "KERNELBOT_EVAL_MEMORY_MIB to allow more)", stage="compile"))
        checks = libtpu_checks(plain_stderr)
        tail = "\n".join(checks) if checks else "\n".join(plain_stderr.strip().splitlines()[-12:])
        return CompileAnswer(False, peak_rss_mib=peak, error=EvalError(
            "compiler_crash", "libtpu aborted while compiling this program (an internal check failed), with or "
            "without its static profiler; rewrite the construct it names:\n" + tail[-2000:], stage="compile"))

    @staticmethod
    def _profile_failure(answer: CompileReply | None, stderr: str, stopped: str | None) -> str:
        if stopped == "memory":
            return f"the static profiler needed more than {PROFILE_MEMORY_MIB} MiB"
        if stopped == "timeout":
            return f"the static profiler took more than {PROFILE_SECONDS} s"
        if answer is not None:
            return "the static profiler refused the program: " + answer.error.strip().splitlines()[0][:300]
        checks = libtpu_checks(stderr)
        first = checks[0] if checks else (stderr.strip().splitlines() or ["no message"])[-1]
        return f"libtpu's static profiler aborted on this program ({first[:300]})"

    @staticmethod
    def _answer(answer: CompileReply, peak: float) -> CompileAnswer:
        return CompileAnswer(True, cost=answer.cost, memory=answer.memory, ops=answer.ops, hlo_text=answer.hlo_text,
                             compile_seconds=answer.compile_seconds, profiled=answer.profiled, peak_rss_mib=peak)

    @staticmethod
    def _refused(answer: CompileReply, peak: float) -> CompileAnswer:
        text = f"{answer.error_type}: {answer.error}".strip()
        if len(text) > 4000:
            text = text[:2500] + "\n...\n" + text[-1400:]
        return CompileAnswer(False, peak_rss_mib=peak, error=EvalError(classify_text(text, "compile_error"), text,
                                                                       stage="compile"))


@contextlib.contextmanager
def compile_service(*, root: Path, limits: EvalLimits, static_profile: str) -> Any:
    service = CompileService(root=root, limits=limits, static_profile=static_profile)
    try:
        yield service
    finally:
        service.close()
