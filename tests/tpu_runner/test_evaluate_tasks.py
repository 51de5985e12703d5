"""Evaluations whose answer is known: derived test configurations, the estimate on HBM-bound copies,
and tasks that are broken in the ways people break them."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from storage.settings import Settings
from tests.conftest import CORPUS, TASKS
from tpu_runner.candidate import SparePool
from tpu_runner.evaluation import EvalRequest, KernelFileError, evaluate_many
from tpu_runner.evaluation.evaluate import evaluate
from tpu_runner.hardware import UnknownTarget
from tpu_runner.reference import reference_store
from tpu_runner.tasks import TaskError, load_task
from tpu_runner.timing import HBM_EFFICIENCY

ADD_REFERENCE = """
import jax
import jax.numpy as jnp


def computation(x, y):
    return x + y


def get_inputs(dtype=jnp.float32):
    kx, ky = jax.random.split(jax.random.PRNGKey(0))
    return [jax.random.normal(kx, ({rows}, 8192), dtype), jax.random.normal(ky, ({rows}, 8192), dtype)], []
"""

PALLAS_ADD = """
import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_ROWS = {block_rows}


def computation(x, y):
    rows, cols = x.shape
    bm = min(BLOCK_ROWS, rows)
    spec = pl.BlockSpec((bm, cols), lambda i: (i, 0))
    return pl.pallas_call(
        _add_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(rows // bm,),
        in_specs=[spec, spec],
        out_specs=spec,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",), vmem_limit_bytes=96 * 2**20),
    )(x, y)


def _add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + y_ref[...]  # [block_rows, cols]
"""


def _task(root: Path, name: str, reference: str, yaml: str = "atol: 1.0e-6\nrtol: 1.0e-6\n") -> Path:
    path = root / name
    path.mkdir()
    (path / "reference.py").write_text(textwrap.dedent(reference))
    (path / "kernel_task.yaml").write_text(f"task_id: {name}\ndescription: test task\n{yaml}")
    return path


def _kernel(root: Path, source: str) -> Path:
    path = root / "kernel.py"
    path.write_text(textwrap.dedent(source))
    return path


@pytest.mark.slow
def test_task_without_test_inputs_is_checked_on_derived_shapes(tmp_path: Path, settings: Settings,
                                                               spares: SparePool) -> None:
    task = _task(tmp_path, "add_large", ADD_REFERENCE.format(rows=8192))
    result = evaluate(EvalRequest(task, _kernel(tmp_path, PALLAS_ADD.format(block_rows=256)), "v6e"), settings,
                      spares=spares)
    assert result.verdict == "ok", result.message
    assert result.correctness and result.correctness.status == "passed"
    assert all(c.name.startswith("derived[0]") for c in result.correctness.cases)
    assert any("derived" in note and "get_test_inputs" in note for note in result.notes)


@pytest.mark.slow
def test_estimate_of_a_pallas_add_matches_xla_near_the_hbm_bound(tmp_path: Path, settings: Settings,
                                                                 spares: SparePool) -> None:
    # Both move the same 805 MB; on hardware they take the same time, bound by HBM (the toolchain note).
    task = _task(tmp_path, "add", ADD_REFERENCE.format(rows=8192) + """
def get_test_inputs(dtype=jnp.float32):
    return [jnp.ones((64, 8192), dtype), jnp.ones((64, 8192), dtype)], []
""")
    result = evaluate(EvalRequest(task, _kernel(tmp_path, PALLAS_ADD.format(block_rows=512)), "v6e"), settings,
                      spares=spares)
    perf = result.performance
    assert result.verdict == "ok", result.message
    assert perf is not None and perf.method == "estimated" and perf.bound == "memory"
    assert perf.bytes == pytest.approx(3 * 8192 * 8192 * 4)
    assert perf.speedup == pytest.approx(1.0, rel=0.1)
    # Streaming ops reach the measured share of the HBM's peak, Pallas DMAs and XLA fusions alike.
    assert perf.roofline_fraction == pytest.approx(HBM_EFFICIENCY, rel=0.1)


@pytest.mark.slow
def test_reference_that_is_not_exact_about_shapes_gives_unverified_not_ok(tmp_path: Path, settings: Settings,
                                                                          spares: SparePool) -> None:
    task = _task(tmp_path, "add_fixed", ADD_REFERENCE.format(rows=8192).replace(
        "    return x + y", "    assert x.shape == (8192, 8192), 'this reference only takes its own shape'\n"
                            "    return x + y"))
    result = evaluate(EvalRequest(task, _kernel(tmp_path, PALLAS_ADD.format(block_rows=512)), "v6e"), settings,
                      spares=spares)
    assert result.verdict == "unverified", result.message
    assert result.correctness and result.correctness.status == "not_checked"
    assert "correctness not checked" in " ".join(result.correctness.notes)
    assert result.performance is not None  # still estimated, and labelled so


def test_missing_task_directory(tmp_path: Path, settings: Settings, spares: SparePool) -> None:
    with pytest.raises(TaskError, match="does not exist"):
        evaluate(EvalRequest(tmp_path / "nope", TASKS / "softmax/solutions/pallas.py", "v6e"), settings, spares=spares)


def test_missing_kernel_file(settings: Settings, spares: SparePool) -> None:
    with pytest.raises(KernelFileError, match="cannot read the kernel file"):
        evaluate(EvalRequest(TASKS / "softmax", Path("/nonexistent/kernel.py"), "v6e"), settings, spares=spares)


def test_yaml_without_tolerances(tmp_path: Path, settings: Settings, spares: SparePool) -> None:
    task = _task(tmp_path, "no_tol", ADD_REFERENCE.format(rows=64), yaml="")
    with pytest.raises(TaskError, match="missing 'atol'"):
        evaluate(EvalRequest(task, _kernel(tmp_path, PALLAS_ADD.format(block_rows=8)), "v6e"), settings, spares=spares)


@pytest.mark.slow
def test_reference_that_raises(tmp_path: Path, settings: Settings, spares: SparePool) -> None:
    task = _task(tmp_path, "raises", "import jax\nraise RuntimeError('the reference is broken')\n"
                 "def computation(x, y):\n    return x + y\n")
    with pytest.raises(TaskError, match="RuntimeError: the reference is broken"):
        evaluate(EvalRequest(task, _kernel(tmp_path, PALLAS_ADD.format(block_rows=8)), "v6e"), settings, spares=spares)


@pytest.mark.slow
def test_reference_that_produces_nan(tmp_path: Path, settings: Settings, spares: SparePool) -> None:
    task = _task(tmp_path, "nan_ref", ADD_REFERENCE.format(rows=64).replace(
        "return x + y", "return (x + y) * jnp.nan") + """
def get_test_inputs(dtype=jnp.float32):
    return [jnp.ones((64, 8192), dtype), jnp.ones((64, 8192), dtype)], []
""")
    with pytest.raises(TaskError, match="reference produces NaN or inf"):
        evaluate(EvalRequest(task, _kernel(tmp_path, PALLAS_ADD.format(block_rows=8)), "v6e"), settings, spares=spares)



ATTENTION_BF16 = """
import jax
import jax.numpy as jnp


def computation(q, k, v):
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(128.0).astype(q.dtype)
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)


def get_inputs():
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    return [jax.random.normal(key, (1, 8, 1024, 128), jnp.bfloat16) for key in keys], []
"""


@pytest.mark.slow
def test_a_reference_the_static_profiler_aborts_on_is_still_evaluated(tmp_path: Path, settings: Settings,
                                                                      spares: SparePool) -> None:
    """libtpu's static profiler aborts on XLA's bf16 attention for v6e (as on the public suite's attention
    tasks), while libtpu compiles it: the evaluation goes on, both programs estimated the same other way."""
    task = _task(tmp_path, "attention_bf16", ATTENTION_BF16, yaml="atol: 2.0e-2\nrtol: 4.0e-2\n")
    result = evaluate(EvalRequest(task, TASKS / "gqa_attention" / "solutions" / "pallas.py", "v6e"), settings,
                      spares=spares)
    assert result.verdict == "ok", result.message
    perf = result.performance
    assert perf is not None and perf.method == "estimated"
    # XLA's ops are timed from XLA's own cost model, which needs no profile; the band is there as always.
    assert "from XLA's cost model" in perf.detail["cycle_model"].split("; ")[1]
    assert perf.reference > 0 and perf.band is not None and perf.band[0] < perf.speedup < perf.band[1]
    note = next(n for n in perf.detail["notes"] if "reference's program" in n)
    assert "static profiler aborted" in note and ("LLO_CHECK" in note or "Check failed" in note)


PURE_JAX_ADD = """
import jax.numpy as jnp


def computation(x, y):
    return jnp.add(x, y)
"""



@pytest.mark.slow
def test_measured_path_runs_end_to_end_on_the_cpu_backend(tmp_path: Path, settings: Settings,
                                                          spares: SparePool) -> None:
    task = _task(tmp_path, "add_small", ADD_REFERENCE.format(rows=256))
    request = EvalRequest(task, _kernel(tmp_path, PURE_JAX_ADD), "v6e", allow_pure_jax=True, measure=True)
    result = evaluate(request, settings, spares=spares)
    perf = result.performance
    assert result.verdict == "ok", result.message
    assert perf is not None and perf.method == "measured" and perf.roofline_fraction is None
    assert perf.detail["source"] in ("trace:host", "trace:device") and perf.detail["iterations"] == 20
    assert perf.candidate > 0 and perf.reference > 0
    assert any("not TPU times" in note for note in result.notes)
    assert Path(result.artifacts["profile_chart"]).is_file()
    assert list((Path(result.artifacts["result"]).parent / "trace").glob("**/*.trace.json.gz"))


CANCELLING_REFERENCE = """
import jax
import jax.numpy as jnp


def computation(x):
    return (x + 1e4) - 1e4  # in float32 the reference's own rounding error is ~1e-3


def get_inputs():
    return [jax.random.normal(jax.random.PRNGKey(0), (64, 256), jnp.float32)], []
"""


@pytest.mark.slow
def test_outputs_that_differ_while_timing_are_judged_by_the_evaluator_against_a_float64_run(
        tmp_path: Path, settings: Settings, spares: SparePool) -> None:
    """The exact answer differs from the reference by the reference's own error on every input, the timing's too.
    The candidate's child keeps those outputs (it runs no float64 reference: at production shapes on a chip it has
    no memory left for one); the evaluator judges them against a float64 run on the timing's own inputs."""
    from tpu_runner.reference import reference_store
    from tpu_runner.tasks import TIMING_CASES

    task = _task(tmp_path, "cancels", CANCELLING_REFERENCE)
    exact = _kernel(tmp_path, "def computation(x):\n    return x * 1.0\n")
    result = evaluate(EvalRequest(task, exact, "v6e", allow_pure_jax=True, measure=True), settings, spares=spares)
    assert result.verdict == "ok", result.message
    accepted = [n for n in result.notes if n.startswith("while timing")]
    assert accepted and "within the reference's own error" in accepted[0], result.notes
    made = list((reference_store(settings).cache_dir / "reference_outputs").glob(f"*.{TIMING_CASES[0].name}.truth.npz"))
    assert made, "no float64 run of the reference on the timing's inputs"


SCALED_REFERENCE = """
import jax
import jax.numpy as jnp


def computation(x):
    return x * 3.0


def get_inputs():
    return [0.01 * jax.random.normal(jax.random.PRNGKey(0), (64, 256), jnp.float32)], []  # its own scale: 1/100
"""


@pytest.mark.slow
def test_the_timings_unscaled_inputs_get_the_atol_the_normal_case_gets(
        tmp_path: Path, settings: Settings, spares: SparePool) -> None:
    """A task whose own inputs are small: its atol is for outputs of that size. The "normal" correctness case and
    the timing draw unscaled values (100x here); the correctness case scales atol with the output, and outputs that
    differ while timing are judged with the same scaled atol (a 10p mixture of experts was refused there at 1.7% of
    its elements, |diff| 2940 against 428, after passing all four correctness cases). A candidate off by 0.2% of the
    inputs' magnitude passes both; off by far more, it fails the correctness case first."""
    task = _task(tmp_path, "scaled", SCALED_REFERENCE, "atol: 1.0e-3\nrtol: 0.0\n")
    near = _kernel(tmp_path, "import jax.numpy as jnp\n\n\ndef computation(x):\n"
                   "    return x * 3.0 + 2e-3 * jnp.mean(jnp.abs(x))\n")
    result = evaluate(EvalRequest(task, near, "v6e", allow_pure_jax=True, measure=True), settings, spares=spares)
    assert result.verdict == "ok", result.message
    normal = next(c for c in result.correctness.cases if c.name.endswith("/normal"))
    assert "atol scaled" in normal.note
    far = tmp_path / "far.py"
    far.write_text(near.read_text().replace("2e-3", "0.5"))
    result = evaluate(EvalRequest(task, far, "v6e", allow_pure_jax=True, measure=True), settings, spares=spares)
    assert result.verdict == "incorrect" and result.stage == "correctness", result.message


UNSEEDED_REFERENCE = """
import jax.numpy as jnp
import numpy as np


def computation(x):
    return (x > 0).astype(jnp.int32)  # exact: no float64 truth or sensitivity to judge other values by


def get_inputs():
    return [np.random.default_rng().standard_normal((64, 256)).astype(np.float32)], []  # other values each call
"""


@pytest.mark.slow
def test_the_candidate_is_checked_on_the_values_the_reference_outputs_were_computed_on(
        tmp_path: Path, settings: Settings, spares: SparePool) -> None:
    """Where the reference's outputs are made already, the candidate's child reads the task's own values they were
    computed on instead of calling get_inputs() again (17-37 s on a chip for the large workloads): with a
    get_inputs() that draws other values each call, the "task" case then compares like with like."""
    task_dir = _task(tmp_path, "unseeded", UNSEEDED_REFERENCE)
    store = reference_store(settings)
    assert store.prefetch_outputs([load_task(task_dir)]) == {}
    kernel = _kernel(tmp_path, "import jax.numpy as jnp\n\n\ndef computation(x):\n    return jnp.sign(x).clip(0)"
                     ".astype(jnp.int32)\n")
    result = evaluate(EvalRequest(task_dir, kernel, "v6e", allow_pure_jax=True), settings, spares=spares)
    assert result.verdict == "ok", result.message
    assert result.correctness is not None
    names = [c.name for c in result.correctness.cases if c.status == "passed"]
    assert "production[0]/task" in names, names
    assert not list(Path(result.artifacts["result"]).parent.glob("work/task_values*"))  # the copy is not kept


@pytest.mark.slow
def test_a_kernel_made_for_its_production_shape_is_unverified_and_sent_to_the_fleets_chip(tmp_path: Path,
                                                                                       settings: Settings) -> None:
    """At derived shapes its mean is off (it divides by the production width); at the production shape it is right.
    The check at derived shapes proves nothing either way: the verdict says so and what would decide it, and a CPU
    runner sends it to the fleet's runner on a TPU v6e for a production check (which it does not take itself)."""
    from sqlmodel import Session, select

    from storage import queue
    from storage.engine import make_engine
    from storage.migrate import upgrade
    from storage.models import Evaluation, Job
    from storage.runners import register_runner
    from tpu_runner.runner import RunnerConfig, RunnerDaemon

    task = CORPUS / "third_party" / "center_task"
    kernel = CORPUS / "third_party" / "center_production_width.py"
    engine = make_engine(f"sqlite:///{tmp_path / 'kernelbot.db'}")
    upgrade(engine)
    with Session(engine) as s, s.begin():
        register_runner(s, name="v6e-host", host="tpu-1", pid=1, hardware={"tpu": "v6e", "measures": True},
                        targets=["v6e"], kinds=["evaluate", "production_check"], concurrency=1)
        first = queue.enqueue(s, kind="evaluate", target="v6e", payload={
            "task_dir": str(task), "kernel_path": str(kernel), "target": "v6e"}).id
    cpu_runner = RunnerDaemon(engine=engine, settings=settings, config=RunnerConfig(
        name="cpu", targets=("v6e",), exit_when_idle=True, poll_seconds=0.05))
    assert "production_check" not in cpu_runner.kinds()
    assert cpu_runner.run() == 0 and cpu_runner.completed == 1
    with Session(engine) as s:
        (evaluation,) = s.exec(select(Evaluation)).all()
        done = s.get(Job, first)
        (check,) = s.exec(select(Job).where(Job.kind == "production_check")).all()
    result = evaluation.result
    assert evaluation.verdict == "unverified" and evaluation.stage == "correctness", result["message"]
    assert "only at shapes derived from the production ones" in result["error"]["detail"]
    assert "TPU runner of v6e" in result["error"]["detail"]
    assert "KERNELBOT_FULL_CHECK_ELEMENTS" in result["error"]["detail"]
    assert done is not None and done.result["follow_ups"] == [
        "production_check queued for the TPU v6e runners (v6e-host)"]
    assert check.status == "queued" and check.target == "v6e" and check.payload["after_job"] == first
    assert check.payload["kernel_path"] == str(kernel)


def test_a_request_for_an_unknown_target_fails_alone_in_a_batch(settings: Settings) -> None:
    """The reference's work made ahead for a batch (`describe_tasks`) goes by target: one nobody knows is that
    request's own error, and the others are evaluated."""
    kernel = CORPUS / "bad" / "not_a_kernel.py"
    unknown, known = evaluate_many([EvalRequest(TASKS / "softmax", kernel, "v9"),
                                    EvalRequest(TASKS / "softmax", kernel, "v6e")], settings)
    assert isinstance(unknown, UnknownTarget) and "unknown target 'v9'" in str(unknown)
    assert not isinstance(known, Exception) and known.error is not None and known.error.kind == "no_pallas_call"
