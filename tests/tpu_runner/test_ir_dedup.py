"""Identical programs are recognised by their normalised lowered IR and evaluated once; a program's form at the
checked shapes is compared with the timed one's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp

from storage.settings import Settings
from tests.conftest import TASKS
from tpu_runner.analysis import ProgramForm, differences, ir_digest, normalise, program_form
from tpu_runner.candidate import SparePool
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


def test_renamed_copy_stops_at_the_gate_and_a_real_change_does_not(tmp_path: Path, settings: Settings,
                                                                   spares: SparePool) -> None:
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
        return evaluate(EvalRequest(SOFTMAX, path, "v6e"), settings, ir_gate=gate(name), spares=spares)

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


def test_a_nan_constant_is_the_same_constant_at_the_checked_and_the_timed_shapes() -> None:
    """A gather's NaN fill value (jnp.take_along_axis) is in the program at every shape; NaN != NaN must not make
    the checked program another than the timed one. A constant that really differs still does."""
    def form(fill: float, n: int) -> ProgramForm:
        return program_form(jax.make_jaxpr(lambda x: jnp.where(x > 0, x, fill))(jnp.zeros((8, n), jnp.float32)))

    assert differences(form(float("nan"), 128), form(float("nan"), 4096)) == []
    assert differences(form(0.5, 128), form(0.25, 4096)) == [
        "a constant differs: 0.5 at the checked shapes, 0.25 at the timed shapes"]


def test_a_loop_unrolled_by_its_trip_count_is_the_same_program_at_both_shapes() -> None:
    """The convolution kernels unroll their chunk loop by min(chunks, 8): at the checked shapes fewer chunks give
    another unroll factor, and the same body. That is the program timed; a body that differs is not."""
    from jax import lax

    def form(n: int, body: Callable[[jax.Array], jax.Array] = lambda row: row) -> ProgramForm:
        def f(x: jax.Array) -> jax.Array:
            chunks = x.shape[0] // 8
            return lax.fori_loop(0, chunks, lambda i, acc: acc + body(x[i]), jnp.zeros(x.shape[1:]),
                                 unroll=min(chunks, 8))
        return program_form(jax.make_jaxpr(f)(jnp.zeros((n, 128), jnp.float32)))

    assert differences(form(16), form(1024)) == []
    assert differences(form(16), form(1024, body=jnp.exp)) != []
