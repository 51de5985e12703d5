"""Porting CUDA and Triton kernels: the real SDK against the fake Messages API writes the JAX reference, the torchax
oracle accepts or refuses it against the PyTorch reference, and the reference check runs what is written."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agents.brain import Budget
from agents.brains import BrainUnavailable
from agents.porter import SourceError, default_name, detect_kind, port_file, port_source, porter_brain
from storage.settings import Settings, load_settings
from tests.conftest import CORPUS
from tests.fakes.anthropic_api import API_KEY, fake_anthropic
from tpu_runner.tasks import load_task

SOURCES = CORPUS / "port_sources"

# What the fake LLM answers for bias_relu.cu: a correct translation.
BIAS_RELU = (SOURCES / "bias_relu_jax.py").read_text()

SOFTMAX = '''"""Row softmax over the last dimension of f32 x [32, 512]."""

import jax
import jax.numpy as jnp


def computation(x):
    m = jnp.max(x, axis=-1, keepdims=True)
    e = {exp}(x - m)
    return e / jnp.{reduce}(e, axis=-1, keepdims=True)


def get_inputs():
    return [jax.random.normal(jax.random.key(0), (32, 512), jnp.float32)], []
'''

RMS_NORM = '''"""RMSNorm over the last dimension: y = x * rsqrt(mean(x^2) + 1e-6) * w, f32 x [128, 1024], w [1024]."""

import jax
import jax.numpy as jnp


def computation(x, w):
    x32 = x.astype(jnp.float32)
    mean_sq = jnp.mean(x32 * x32, axis=-1, keepdims=True)
    return x32 * jax.lax.rsqrt(mean_sq + 1e-6) * w


def _inputs(rows, cols, seed):
    kx, kw = jax.random.split(jax.random.key(seed))
    return [jax.random.normal(kx, (rows, cols), jnp.float32), 1.0 + 0.1 * jax.random.normal(kw, (cols,))], []


def get_inputs():
    return _inputs(128, 1024, 0)


def get_test_inputs():
    return _inputs(16, 256, 1)
'''


def _answer(code: str) -> dict[str, str]:
    return {"text": f"Here is the reference.\n\n```python\n{code}```\n"}


@pytest.fixture
def llm_settings(tmp_path: Path) -> Settings:
    return load_settings({"KERNELBOT_HOME": str(tmp_path / "home"), "ANTHROPIC_API_KEY": API_KEY})


def _port(fake_url: str, monkeypatch: pytest.MonkeyPatch, settings: Settings, source: str, torch: str | None,
          dest: Path):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake_url)
    brain = porter_brain("anthropic", settings, Budget())
    return port_source(SOURCES / source, name=dest.name, dest=dest, settings=settings, brain=brain,
                       torch_reference=SOURCES / torch if torch else None)


def test_a_correct_cuda_translation_is_accepted_by_the_oracle(llm_settings: Settings, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    dest = tmp_path / "tasks" / "bias_relu"
    with fake_anthropic([_answer(BIAS_RELU)]) as fake:
        result = _port(fake.base_url, monkeypatch, llm_settings, "bias_relu.cu", "bias_relu.py", dest)
    assert result.ok, result.error
    assert result.task_dir == dest and result.verified_by == "torchax"
    assert result.max_abs_err is not None and result.max_abs_err < 1e-5
    assert result.signature == ("x: float32[64,256] (input)", "bias: float32[256] (weight)")
    assert result.outputs == ("float32[64,256]",)
    (request,) = fake.requests
    body = request["body"]
    assert "Role: porter." in body["system"][0]["text"]
    context = body["system"][1]["text"]
    assert "__global__ void bias_relu_kernel" in context and "class Model(nn.Module)" in context
    prompt = body["messages"][0]["content"]
    assert "  - x: float32[64,256] (input)\n  - bias: float32[256] (weight)" in prompt
    meta = yaml.safe_load((dest / "kernel_task.yaml").read_text())
    assert meta["ported_from"]["kind"] == "cuda" and meta["ported_from"]["oracle"] == "torchax"
    assert meta["ported_from"]["torch_reference"] == "bias_relu.py" and meta["ported_from"]["brain"] == "anthropic"
    assert meta["description"].startswith("Fused bias + ReLU")
    task = load_task(dest)
    assert task.task_id == "bias_relu" and task.reference_source.startswith(BIAS_RELU.rstrip())
    assert "#   int idx = blockIdx.x * blockDim.x + threadIdx.x;" in task.reference_source  # the original, as comments


def test_a_subtly_wrong_translation_is_refused_with_the_mismatch_shown(llm_settings: Settings, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    dest = tmp_path / "tasks" / "row_softmax"
    max_not_sum = SOFTMAX.format(exp="jnp.exp", reduce="max")  # normalised by the row's max instead of its sum
    exp2 = SOFTMAX.format(exp="jnp.exp2", reduce="sum")  # __expf read as a base-2 exponential
    with fake_anthropic([_answer(max_not_sum), _answer(exp2)]) as fake:
        result = _port(fake.base_url, monkeypatch, llm_settings, "row_softmax.cu", "row_softmax.py", dest)
    assert not result.ok and result.task_dir is None and not dest.exists()
    assert result.error is not None and result.error.kind == "mismatch"
    assert "after 2 answers" in result.error.message and "differs from PyTorch" in result.error.message
    assert "max |diff|" in result.error.message
    (first_refusal,) = result.notes
    assert first_refusal.startswith("answer 1 was refused (mismatch)") and "row_softmax.py" in first_refusal
    # The retry showed the brain its first answer and the oracle's mismatch.
    assert len(fake.requests) == 2
    retry = fake.requests[1]["body"]["messages"][0]["content"]
    assert "Answer 1 was refused (mismatch)" in retry and "differs from PyTorch" in retry
    assert "jnp.max(e, axis=-1, keepdims=True)" in retry


@pytest.mark.slow
def test_a_refused_answer_fixed_on_the_retry_is_accepted(llm_settings: Settings, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    dest = tmp_path / "tasks" / "row_softmax"
    wrong, right = SOFTMAX.format(exp="jnp.exp2", reduce="sum"), SOFTMAX.format(exp="jnp.exp", reduce="sum")
    with fake_anthropic([_answer(wrong), _answer(right)]) as fake:
        result = _port(fake.base_url, monkeypatch, llm_settings, "row_softmax.cu", "row_softmax.py", dest)
    assert result.ok and result.verified_by == "torchax" and result.task_dir == dest
    assert result.max_abs_err is not None and result.max_abs_err < 1e-5
    assert any(n.startswith("answer 1 was refused (mismatch)") for n in result.notes)
    assert "jnp.exp(x - m)" in (dest / "reference.py").read_text()


def test_a_triton_source_without_a_pytorch_reference_is_written_unverified(llm_settings: Settings, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    dest = tmp_path / "tasks" / "rms_norm_triton"
    with fake_anthropic([_answer(RMS_NORM)]) as fake:
        result = _port(fake.base_url, monkeypatch, llm_settings, "rms_norm_triton.py", None, dest)
    assert result.ok and result.task_dir == dest
    assert result.verified_by is None and result.max_abs_err is None
    assert result.signature == ("x: float32[128,1024]", "w: float32[1024]")
    assert any(n.startswith("not verified by an oracle") for n in result.notes)
    prompt = fake.requests[0]["body"]["messages"][0]["content"]
    assert "No PyTorch reference was given" in prompt
    assert "@triton.jit" in fake.requests[0]["body"]["system"][1]["text"]
    meta = yaml.safe_load((dest / "kernel_task.yaml").read_text())
    assert meta["ported_from"] == {"kind": "triton", "file": "rms_norm_triton.py", "brain": "anthropic",
                                   "oracle": "none"}
    assert "NOT verified by an oracle" in meta["description"]
    assert load_task(dest).task_id == "rms_norm_triton"


def test_a_reference_that_does_not_run_is_refused_by_the_reference_check(llm_settings: Settings, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    dest = tmp_path / "tasks" / "rms"
    broken = RMS_NORM.replace("x32 * x32, axis", "x32 * x32.T, axis")  # [128,1024] * [1024,128]: no broadcast
    with fake_anthropic([_answer(broken), {"text": "I cannot write this without seeing the launch."}]) as fake:
        result = _port(fake.base_url, monkeypatch, llm_settings, "rms_norm_triton.py", None, dest)
    assert not result.ok and not dest.exists()
    assert result.error is not None and result.error.kind == "no_answer"
    assert result.notes[0].startswith("answer 1 was refused (check_failed)") and "Line 9" in result.notes[0]
    assert "Answer 1 was refused (check_failed)" in fake.requests[1]["body"]["messages"][0]["content"]


def test_cuda_and_triton_need_an_llm_brain(settings: Settings, tmp_path: Path) -> None:
    for name in ("offline", None):  # None: the default, offline without ANTHROPIC_API_KEY
        with pytest.raises(BrainUnavailable, match="needs an LLM brain") as caught:
            porter_brain(name, settings, Budget())
        assert "ANTHROPIC_API_KEY" in str(caught.value) and "cannot read CUDA or Triton" in str(caught.value)
    with pytest.raises(BrainUnavailable, match="needs an LLM brain"):
        port_file(SOURCES / "bias_relu.cu", name="bias_relu", dest=tmp_path / "bias_relu", settings=settings)
    assert not (tmp_path / "bias_relu").exists()


def test_what_a_file_is_and_the_name_it_gets() -> None:
    assert detect_kind(SOURCES / "bias_relu.cu", (SOURCES / "bias_relu.cu").read_text()) == "cuda"
    assert detect_kind(Path("k.py"), "src = '__global__ void k(float* x) {}'\n") == "cuda"  # load_inline source
    assert detect_kind(SOURCES / "rms_norm_triton.py", (SOURCES / "rms_norm_triton.py").read_text()) == "triton"
    assert detect_kind(SOURCES / "bias_relu.py", (SOURCES / "bias_relu.py").read_text()) == "pytorch"
    with pytest.raises(SourceError, match=r"no `class Model\(nn.Module\)` \(it has Net\)"):
        detect_kind(SOURCES / "no_model.py", (SOURCES / "no_model.py").read_text())
    with pytest.raises(SourceError, match="none of what `kernelbot port` reads"):
        detect_kind(Path("notes.txt"), "just words")
    assert default_name(Path("Fused-BiasReLU.cu")) == "fused_biasrelu"
    assert default_name(Path("2_softmax.py")) == "port_2_softmax"
