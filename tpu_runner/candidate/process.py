"""The candidate's child seen from the parent: handing it its request, answering its IR gate, relaying the stages
it announces, compiling its programs as soon as it has exported them, and saying why it stopped without a report.

`evaluate` decides what to do with the report; this module only runs the child (`tpu_runner.candidate.child`) and reads
what it wrote.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from storage.settings import EvalLimits
from tpu_runner.candidate.spares import SparePool
from tpu_runner.compiler import CompileAnswer, CompileService
from tpu_runner.hardware import ChipSpec, chip
from tpu_runner.reports import CandidateReport, CandidateRequest, EvalError, Stage, write_json
from tpu_runner.sandbox import ChildOutcome, Gate, child_environment, untrusted_reads

IrGate = Callable[[str], str | None]  # normalised IR digest -> None to go on, or what it duplicates to stop
# The stages a child that stopped without a report can be said to have stopped in (others count as lowering).
_CHILD_STAGES: dict[str, Stage] = {"lower": "lower", "correctness": "correctness", "performance": "performance"}


class CandidateCompiles:
    """The candidate's programs compiled on a thread, started as soon as the child has exported them."""

    def __init__(self, compilers: CompileService, chip: ChipSpec, workdir: Path, artifacts: Path):
        self.compilers, self.chip, self.workdir, self.artifacts = compilers, chip, workdir, artifacts
        self.answers: list[CompileAnswer] | None = None
        self._thread: threading.Thread | None = None
        self.seconds = 0.0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        t0 = time.perf_counter()
        answers = []
        for i, path in enumerate(sorted(self.workdir.glob("candidate.config*.exported"))):
            answer = self.compilers.compile(path, target=self.chip.name, keep_in=self.artifacts / "llo",
                                            label=f"candidate.config{i}")
            answers.append(answer)
            if not answer.ok:
                break
        self.seconds = time.perf_counter() - t0
        self.answers = answers

    @property
    def failed(self) -> bool:
        return self.answers is not None and any(not a.ok for a in self.answers)

    def wait(self) -> list[CompileAnswer]:
        self.start()
        assert self._thread is not None
        self._thread.join()
        assert self.answers is not None
        return self.answers


def stopped_error(outcome: ChildOutcome, limits_wall: int, memory_mib: int) -> tuple[Stage, EvalError]:
    """The stage and error of a child that ended without a report: a limit, a signal or an exit status."""
    stage = _CHILD_STAGES.get(outcome.stage or "", "lower")
    stop = outcome.why_stopped(wall_seconds=limits_wall, memory_mib=memory_mib, tail_lines=25)
    if stop.kind == "timeout":
        return stage, EvalError("timeout", f"the evaluation {stop.how} (it was in the {stage} stage); a kernel "
                                "that hangs or a grid far too large for this check")
    if stop.kind == "memory_limit":
        return stage, EvalError("memory_limit", f"the evaluation {stop.how} in the {stage} stage and was stopped")
    return stage, EvalError(stop.kind, f"the evaluation process {stop.how} in the {stage} stage without a "
                            f"result.\n{stop.tail}")


def run_candidate(request: CandidateRequest, *, pool: SparePool, limits: EvalLimits, compiles: CandidateCompiles,
                  ir_gate: IrGate | None, on_stage: Callable[[str], None], private: tuple[Path, ...] = ()
                  ) -> tuple[ChildOutcome, CandidateReport | None]:
    """Run the candidate's child on `request` to its end; its logs are moved into the work directory. The report
    is None when the child did not finish (a limit, a crash, or stopped because a compile had already failed). The
    child reads only what importing Python, JAX, the task and the kernel needs: never `private` (the runner's home
    and caches)."""
    workdir, artifacts = Path(request.workdir), Path(request.artifacts_dir)

    def env_for(scratch: Path) -> dict[str, str]:
        return child_environment(workdir=scratch, llo_dump_dir=None, on_tpu=request.host == "tpu",
                                 target_accelerator=f"{request.target}-1")

    child = pool.acquire(f"{request.target}-{request.host}", env_for)
    request_path = workdir / "request.json"
    write_json(request_path, request)
    gate = None
    if ir_gate is not None:
        asked = ir_gate

        def answer(digest: str) -> str:
            duplicate_of = asked(digest)
            return "go" if duplicate_of is None else f"stop {duplicate_of}"
        gate = Gate(workdir / "ir_hash", answer)

    def heard(stage: str) -> None:
        if stage == "correctness":
            compiles.start()  # the programs are exported: compile them while the candidate is checked
            on_stage("compile")
        on_stage(stage)

    on_chip = chip.runtime_files() if request.host == "tpu" else ()
    if on_chip:
        limits = chip.with_chip_memory(limits)
    outcome = child.run([str(request_path)], stage_file=workdir / "stage", limits=limits, on_stage=heard,
                        gate=gate, writable=(artifacts, *on_chip), should_stop=lambda: compiles.failed,
                        reads=untrusted_reads(Path(request.task_dir), private=private))
    for log in ("stdout.txt", "stderr.txt"):
        if (child.scratch / log).is_file():
            shutil.move(child.scratch / log, workdir / log)
    shutil.rmtree(child.scratch, ignore_errors=True)
    report_path = workdir / "child_result.json"
    finished = outcome.returncode == 0 and not (outcome.timed_out or outcome.memory_exceeded or outcome.stopped)
    return outcome, CandidateReport.read(report_path) if finished and report_path.is_file() else None
