"""Cross-entropy as references write it: from logits with a gather (tasks/cross_entropy's form), and a language
model's head - the logits a matmul's, a bf16 log_softmax, the label's log-probability picked by a one-hot from an
iota, the mean over the tokens (benchmarks/measured/13p's form). Each is recognised op by op, what follows the
per-row values is checked by numbers, and the kernel streams the vocabulary; a label outside the vocabulary gives
what the reference's way of picking gives; what is not a cross-entropy loss is refused with what it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.offline.brain import analyse
from agents.offline.crossentropy import CrossEntropy
from agents.offline.emit import source
from agents.offline.expr import NotRecognised
from agents.offline.params import choose
from agents.offline.reading import read_tasks
from storage.settings import Settings
from tests.support.reference_tasks import reference_task
from tpu_runner.evaluation import EvalRequest, evaluate_many
from tpu_runner.hardware import get_chip
from tpu_runner.tasks import Task

V5E = get_chip("v5e")

LM_HEAD = """import jax
import jax.numpy as jnp


def computation(hidden, w, labels):
    logp = jax.nn.log_softmax(hidden @ w, axis=-1)
    nll = -jnp.sum(jax.nn.one_hot(labels, w.shape[1], dtype=jnp.float32) * logp, axis=-1)
    return jnp.mean(nll)


def get_inputs():
    kh, kw, kl = jax.random.split(jax.random.PRNGKey(0), 3)
    hidden = jax.random.normal(kh, (512, 256), dtype=jnp.bfloat16)
    w = (jax.random.normal(kw, (256, 2304), dtype=jnp.float32) / 16.0).astype(jnp.bfloat16)
    labels = jax.random.randint(kl, (512,), 0, 2304, dtype=jnp.int32)
    return [hidden, w, labels], []
"""

PER_ROW = """import jax
import jax.numpy as jnp


def computation(logits, labels):
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return lse - picked


def get_inputs():
    kl, ky = jax.random.split(jax.random.PRNGKey(0))
    logits = 2.0 * jax.random.normal(kl, (256, 4096), dtype=jnp.float32)
    labels = jax.random.randint(ky, (256,), 0, 4096, dtype=jnp.int32)
    return [logits, labels], []
"""


def _task(root: Path, name: str, code: str) -> Task:
    return reference_task(root, name, code, description="cross-entropy as references write it", atol=1e-3,
                          rtol=1e-3)


@pytest.mark.slow
def test_cross_entropy_from_a_head_and_from_logits_gets_ok_kernels(tmp_path: Path, settings: Settings,
                                                                  verdict_settings: Settings) -> None:
    tasks = [_task(tmp_path, "lm_head", LM_HEAD), _task(tmp_path, "per_row", PER_ROW)]
    readings = read_tasks(tasks, settings)
    head, per_row = (analyse(readings[t.digest], V5E) for t in tasks)
    assert isinstance(head, CrossEntropy) and isinstance(per_row, CrossEntropy)
    assert (head.matmul, head.model, head.vocab, head.reduce, head.by, head.picked) == \
        (True, 256, 2304, "mean", "one_hot", "logp")
    assert (per_row.matmul, per_row.vocab, per_row.reduce, per_row.by, per_row.picked) == \
        (False, 4096, "none", "gather", "x")
    requests = []
    for task, spec in zip(tasks, (head, per_row), strict=True):
        kernel = tmp_path / f"{task.path.name}_kernel.py"
        params = choose(spec, V5E)[0]
        text = source(spec, params)
        assert "jnp.mean(loss)" in text if spec.reduce == "mean" else "return loss.astype" in text
        kernel.write_text(text)
        requests.append(EvalRequest(task.path, kernel, "v5e"))
    for result in evaluate_many(requests, verdict_settings):
        assert result.verdict == "ok", result.message
        # Several vocabulary blocks, so the online log-sum-exp crossed blocks (2304 = 9 x 256 for the head).
        assert result.correctness is not None and result.correctness.status == "passed"


def test_a_label_outside_the_vocabulary_gives_what_the_reference_gives(tmp_path: Path, settings: Settings) -> None:
    """Derived check shapes draw labels from the task's own range, which may pass a smaller vocabulary: a one-hot
    of the log-probability then picks nothing (a loss of 0), a gather NaN. Written as the reference's own ops."""
    tasks = [_task(tmp_path, "lm_head", LM_HEAD), _task(tmp_path, "per_row", PER_ROW)]
    readings = read_tasks(tasks, settings)
    head, per_row = (analyse(readings[t.digest], V5E) for t in tasks)
    head_text, row_text = (source(s, choose(s, V5E)[0]) for s in (head, per_row))
    assert "hit * lse - p_ref[...]" in head_text and "jnp.where(labels < 0, labels + vocab" not in head_text
    assert "jnp.where(hit > 0, lse - p_ref[...], jnp.nan)" in row_text
    assert "labels = jnp.where(labels < 0, labels + vocab, labels)" in row_text


def test_what_is_not_a_cross_entropy_loss_is_refused(tmp_path: Path, settings: Settings) -> None:
    smoothed = PER_ROW.replace("return lse - picked", "return lse - 0.9 * picked - 0.1 * jnp.mean(logits, axis=-1)")
    doubled = PER_ROW.replace("return lse - picked", "return lse - picked * picked")
    tasks = [_task(tmp_path, "smoothed", smoothed), _task(tmp_path, "doubled", doubled)]
    readings = read_tasks(tasks, settings)
    with pytest.raises(NotRecognised):
        analyse(readings[tasks[0].digest], V5E)
    with pytest.raises(NotRecognised, match="not the cross-entropy per row"):
        analyse(readings[tasks[1].digest], V5E)
