"""Random epilogue-chain tasks: a matmul followed by a chain of the ops public kernel suites are made of
(bias, scaling, activations, residual add, clamp, softmax, log-sum-exp, row norms), in any order and length.
Used by the offline brain's property test and its benchmark."""

from __future__ import annotations

from pathlib import Path

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


def chain_task(root: Path, name: str, chain: list[str], dtype: str, m: int, k: int, n: int,
               test: tuple[int, int, int] | None = None) -> Path:
    """A task directory: production inputs (m, k, n), evaluator test inputs `test` (default the same)."""
    tm, tk, tn = test or (m, k, n)
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
        f"def get_test_inputs():\n    return _inputs({tm}, {tk}, {tn}, 1)",
    ]
    reference = "\n".join(lines) + "\n"
    task_dir = root / name
    task_dir.mkdir()
    (task_dir / "reference.py").write_text(reference)
    tol = "2.0e-2" if dtype == "bfloat16" else "2.0e-3"
    (task_dir / "kernel_task.yaml").write_text(f"task_id: {name}\ndescription: matmul then {', '.join(chain)}\n"
                                               f"atol: {tol}\nrtol: {tol}\nfamily: matmul_epilogue\n")
    return task_dir
