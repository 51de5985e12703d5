"""Children started ahead of need, and the compile servers, shared by a process's evaluations."""

from __future__ import annotations

import contextlib
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from storage.settings import EvalLimits, Settings
from tpu_runner.compiler import CompileService
from tpu_runner.sandbox import SandboxProcess, spawn


class SparePool:
    """Children started ahead of need, one set per environment, so an evaluation does not wait for Python and
    JAX to start. Each child still serves exactly one evaluation. The pool also owns the compile servers its
    evaluations share (`compilers`), which outlive evaluations since they never run candidate code."""

    def __init__(self, *, root: Path, limits: EvalLimits, keep: int, target: str = "tpu_runner.candidate.child"):
        self.root, self.limits, self.keep, self.target = root, limits, keep, target
        self._spares: dict[str, list[SandboxProcess]] = {}
        self._compilers: dict[str, CompileService] = {}
        self._lock = threading.Lock()

    def compilers(self, static_profile: str) -> CompileService:
        with self._lock:
            if static_profile not in self._compilers:
                self._compilers[static_profile] = CompileService(root=self.root, limits=self.limits,
                                                                 static_profile=static_profile)
            return self._compilers[static_profile]

    def _spawn(self, key: str, env_for: Callable[[Path], dict[str, str]]) -> SandboxProcess:
        scratch = self.root / f"{key}-{uuid.uuid4().hex[:10]}"
        return spawn(target=self.target, scratch=scratch, env=env_for(scratch), limits=self.limits)

    def acquire(self, key: str, env_for: Callable[[Path], dict[str, str]]) -> SandboxProcess:
        """A started child for this environment, and a replacement started in its place."""
        with self._lock:
            children = self._spares.get(key, [])
            for dead in [c for c in children if not c.alive]:
                shutil.rmtree(dead.scratch, ignore_errors=True)
            ready = [c for c in children if c.alive]
            child = ready.pop(0) if ready else None
            while len(ready) < self.keep:
                ready.append(self._spawn(key, env_for))
            self._spares[key] = ready
        return child or self._spawn(key, env_for)

    def close(self) -> None:
        with self._lock:
            for children in self._spares.values():
                for child in children:
                    child.discard()
                    shutil.rmtree(child.scratch, ignore_errors=True)
            self._spares.clear()
            compilers, self._compilers = list(self._compilers.values()), {}
        for service in compilers:
            service.close()


@contextlib.contextmanager
def spare_pool(settings: Settings, keep: int = 1) -> Iterator[SparePool]:
    """A pool for one stretch of work (a terminal session): children started ahead, compile servers kept."""
    pool = SparePool(root=settings.sandbox_dir, limits=settings.limits, keep=keep)
    try:
        yield pool
    finally:
        pool.close()
