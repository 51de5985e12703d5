"""The offline brain: families recognised by structure, kernels the evaluator calls ok, plans with reasons,
redirects in its vocabulary, and a clear refusal for what it does not know."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agents import subagents, tunable
from agents.brain import Budget
from agents.brains import BrainUnavailable, make_brain
from agents.context import task_context
from agents.offline.brain import OfflineBrain, analyse, parse_redirect
from agents.offline.emit import source
from agents.offline.expr import NotRecognised
from agents.offline.params import choose
from storage.settings import Settings
from tests.conftest import TASKS
from tpu_runner.evaluate import EvalRequest, evaluate_many
from tpu_runner.hardware import get_chip
from tpu_runner.tasks import load_task

V6E = get_chip("v6e")
RECOGNISED = ["fused_elementwise", "softmax", "layer_norm", "rms_norm", "matmul_bf16", "matmul_bias_gelu",
              "matmul_softmax", "batched_matmul"]


def _write(tmp: Path, name: str, code: str) -> Path:
    path = tmp / f"{name}.py"
    path.write_text(code)
    return path


@pytest.mark.slow
def test_every_recognised_suite_task_gets_an_ok_kernel(tmp_path: Path, settings: Settings) -> None:
    requests = []
    for name in RECOGNISED:
        task = load_task(TASKS / name)
        spec = analyse(task, V6E)
        requests.append(EvalRequest(task.path, _write(tmp_path, name, source(spec, choose(spec, V6E)[0])), "v6e"))
    results = evaluate_many(requests, settings)
    verdicts = {name: getattr(r, "message", repr(r)) for name, r in zip(RECOGNISED, results, strict=True)}
    assert all(getattr(r, "verdict", None) == "ok" for r in results), verdicts


@pytest.mark.parametrize("name, what", [("cumsum_rows", "a scan (cumsum)"), ("causal_attention", "2 matmuls"),
                                        ("conv1d_depthwise", "neither per element"),
                                        ("cross_entropy", "a gather")])
def test_a_reference_outside_the_families_gets_a_clear_message(name: str, what: str) -> None:
    with pytest.raises(NotRecognised) as raised:
        analyse(load_task(TASKS / name), V6E)
    assert what in str(raised.value)


def test_make_brain_says_which_families_it_writes(settings: Settings) -> None:
    task = load_task(TASKS / "cumsum_rows")
    with pytest.raises(BrainUnavailable, match="cannot write a kernel for cumsum_rows.*scan.*matmul"):
        make_brain("offline", settings, Budget(), task=task, chip=V6E)


def test_plans_have_the_fixed_sections_reasons_and_revisions() -> None:
    task = load_task(TASKS / "matmul_bias_gelu")
    brain = OfflineBrain(task=task, chip=V6E)
    ctx = task_context(task, V6E)
    plan = subagents.plan(brain, ctx)  # parsed strictly: every section present
    assert "arithmetic intensity" in plan.sections["analysis"] and "ridge point" in plan.sections["analysis"]
    assert "Parameters:" in plan.sections["tiling and memory"]
    code = subagents.implement(brain, ctx, plan)
    assert tunable.current(code)["BLOCK_M"] == choose(brain.spec, V6E)[0]["BLOCK_M"]  # type: ignore[arg-type]
    revised = subagents.plan(brain, ctx, previous="ok: x0.9 vs reference")
    assert revised.sections["tiling and memory"] != plan.sections["tiling and memory"]


def test_a_redirect_is_applied_and_what_was_not_understood_is_said() -> None:
    task = load_task(TASKS / "softmax")
    brain = OfflineBrain(task=task, chip=V6E)
    ctx = task_context(task, V6E)
    plan = subagents.plan(brain, ctx, redirect="rows 64, vmem 32 MiB, make it sing")
    impact = plan.sections["expected impact"]
    assert "BLOCK_ROWS = 64" in impact and "VMEM_LIMIT_BYTES = 33554432" in impact
    assert "Not understood: 'make it sing'" in impact
    code = subagents.implement(brain, ctx, plan)
    assert tunable.current(code)["BLOCK_ROWS"] == 64


def test_redirect_vocabulary() -> None:
    space = {"BLOCK_M": (128, 256, 512), "BLOCK_N": (128, 256, 512), "BLOCK_K": (256, 512),
             "VMEM_LIMIT_BYTES": (2**25, 2**26)}
    params = {"BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 512, "VMEM_LIMIT_BYTES": 2**26}
    out, done, unknown = parse_redirect("block 512x128; block_k 256 and smaller blocks, use cuda", params, space)
    assert out["BLOCK_N"] == 128 and out["BLOCK_M"] == 256 and out["BLOCK_K"] == 256  # 512 -> 256 after "smaller"
    assert unknown == ["use cuda"] and len(done) == 4


# --- property test: random epilogue chains after a matmul ------------------------------------------------------

EPILOGUE = {
    "bias": "y = y + b[None, :].astype(jnp.float32)",
    "scale": "y = y * 0.5",
    "relu": "y = jax.nn.relu(y)",
    "gelu": "y = jax.nn.gelu(y, approximate=True)",
    "swish": "y = y * jax.nn.sigmoid(y)",
    "mish": "y = y * jnp.tanh(jax.nn.softplus(y))",
    "hardtanh": "y = jnp.clip(y, -1.0, 1.0)",
    "sigmoid": "y = jax.nn.sigmoid(y)",
    "tanh": "y = jnp.tanh(y)",
    "residual": "y = y + r.astype(jnp.float32)",
    "softmax": "y = jax.nn.softmax(y, axis=-1)",
    "logsumexp": "y = y - jax.nn.logsumexp(y, axis=-1, keepdims=True)",
    "rownorm": "y = (y - y.mean(axis=-1, keepdims=True)) * jax.lax.rsqrt(y.var(axis=-1, keepdims=True) + 1e-5)",
    "rowmax": "y = y - jnp.max(y, axis=-1, keepdims=True)",
}


def _chain_task(root: Path, name: str, chain: list[str], dtype: str, m: int, k: int, n: int) -> Path:
    lines = [
        "import jax", "import jax.numpy as jnp", "", "",
        "def computation(x, w, b, r):",
        "    y = jnp.dot(x, w, preferred_element_type=jnp.float32)",
        *(f"    {EPILOGUE[step]}" for step in chain),
        "    return y.astype(x.dtype)", "", "",
        "def _inputs(m, k, n, seed):",
        "    kx, kw, kb, kr = jax.random.split(jax.random.PRNGKey(seed), 4)",
        f"    x = jax.random.normal(kx, (m, k), jnp.float32).astype(jnp.{dtype})",
        f"    w = (jax.random.normal(kw, (k, n), jnp.float32) / jnp.sqrt(k)).astype(jnp.{dtype})",
        f"    b = jax.random.normal(kb, (n,), jnp.float32).astype(jnp.{dtype})",
        f"    r = jax.random.normal(kr, (m, n), jnp.float32).astype(jnp.{dtype})",
        "    return [x, w, b, r], []", "", "",
        f"def get_inputs():\n    return _inputs({m}, {k}, {n}, 0)", "", "",
        f"def get_test_inputs():\n    return _inputs({m}, {k}, {n}, 1)",
    ]
    reference = "\n".join(lines) + "\n"
    task_dir = root / name
    task_dir.mkdir()
    (task_dir / "reference.py").write_text(reference)
    tol = "2.0e-2" if dtype == "bfloat16" else "2.0e-3"
    (task_dir / "kernel_task.yaml").write_text(f"task_id: {name}\ndescription: matmul then {', '.join(chain)}\n"
                                               f"atol: {tol}\nrtol: {tol}\nfamily: matmul_epilogue\n")
    return task_dir


@pytest.mark.slow
def test_random_epilogue_chains_get_ok_or_a_clear_refusal(tmp_path: Path, settings: Settings) -> None:
    rng = random.Random(20261130)
    shapes = [(256, 512, 384), (200, 384, 640), (512, 256, 1000), (136, 128, 256)]  # multiples and not
    requests, chains = [], []
    for i, (m, k, n) in enumerate(shapes):
        chain = rng.sample(sorted(EPILOGUE), rng.randint(1, 5))
        dtype = "bfloat16" if i % 2 else "float32"
        task = load_task(_chain_task(tmp_path, f"chain{i}", chain, dtype, m, k, n))
        spec = analyse(task, V6E)
        requests.append(EvalRequest(task.path, _write(tmp_path, f"k{i}", source(spec, choose(spec, V6E)[0])), "v6e"))
        chains.append((chain, dtype, (m, k, n)))
    results = evaluate_many(requests, settings)
    failures = [(c, getattr(r, "message", repr(r))) for c, r in zip(chains, results, strict=True)
                if getattr(r, "verdict", None) != "ok"]
    assert not failures, failures
