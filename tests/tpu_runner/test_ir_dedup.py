"""Identical programs are recognised by their normalised lowered IR and evaluated once."""

from __future__ import annotations

from pathlib import Path

from storage.settings import Settings
from tests.conftest import TASKS
from tpu_runner.analysis import ir_digest, normalise
from tpu_runner.evaluation import EvalRequest
from tpu_runner.evaluation.evaluate import evaluate

SOFTMAX = TASKS / "softmax"
SOLUTION = (SOFTMAX / "solutions" / "pallas.py").read_text()


def test_normalise_drops_names_and_locations() -> None:
    a = ('module @jit_computation {\n  func.func private @_softmax(%a) loc(#loc3) {\n  kernel_name = "_k"\n}\n'
         '#loc3 = loc("x.py":3:1)\n')
    b = 'module @jit_computation {\n  func.func private @renamed(%a) loc(#loc9) {\n  kernel_name = "other"\n}\n'
    assert normalise(a) == normalise(b)
    assert ir_digest([a]) == ir_digest([b])
    assert ir_digest([a]) != ir_digest([a.replace("%a", "%b")])


def test_renamed_copy_stops_at_the_gate_and_a_real_change_does_not(tmp_path: Path, settings: Settings) -> None:
    seen: dict[str, str] = {}

    def gate(name: str):
        def answer(digest: str) -> str | None:
            if digest in seen:
                return seen[digest]
            seen[digest] = name
            return None
        return answer

    def run(name: str, source: str):
        path = tmp_path / f"{name}.py"
        path.write_text(source)
        return evaluate(EvalRequest(SOFTMAX, path, "v6e"), settings, ir_gate=gate(name))

    first = run("first", SOLUTION)
    assert first.verdict == "ok" and first.ir_hash
    renamed = SOLUTION.replace("_softmax_kernel", "_renamed_kernel").replace('"""', '"""Reformatted copy. ', 1)
    copy = run("copy", "# a comment that changes nothing\n" + renamed)
    assert copy.verdict == "duplicate" and copy.stage == "lower"
    assert copy.ir_hash == first.ir_hash and "first" in copy.message
    assert "compile" not in copy.timings
    assert "TARGET_BLOCK_BYTES = 4 * 1024 * 1024" in SOLUTION
    changed = run("changed", SOLUTION.replace("TARGET_BLOCK_BYTES = 4 * 1024 * 1024",
                                              "TARGET_BLOCK_BYTES = 2 * 1024 * 1024"))
    assert changed.verdict == "ok" and changed.ir_hash != first.ir_hash
