"""`kernelbot port` as a person runs it: the task written and the next step, JSON, exit codes and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CORPUS, REPO
from tpu_runner.porting import EXTRA

KERNELBOT = [sys.executable, "-m", "bot.cli"]
SOURCES = CORPUS / "port_sources"
JSON_KEYS = {"ok", "name", "task_dir", "signature", "outputs", "max_abs_err", "verified_by", "error", "notes", "kind",
             "source", "torch_reference", "next"}


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "KERNELBOT_"))}
    return {**env, "KERNELBOT_HOME": str(home), **extra}


def _port(args: list[str], home: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KERNELBOT, "port", *args], capture_output=True, text=True, env=_env(home, **extra),
                          timeout=300, cwd=REPO)


def test_a_pytorch_module_becomes_a_task_and_the_next_step_is_printed(tmp_path: Path) -> None:
    proc = _port([str(SOURCES / "bias_relu.py")], tmp_path)
    assert proc.returncode == 0, proc.stderr
    task_dir = tmp_path / "tasks" / "bias_relu"
    assert (task_dir / "reference.py").is_file() and (task_dir / "kernel_task.yaml").is_file()
    out = proc.stdout
    assert f"ported bias_relu.py (PyTorch) to the task bias_relu at {task_dir}" in out
    assert "computation(x: float32[64,256] (input), bias: float32[256] (weight)) -> float32[64,256]" in out
    assert "matches PyTorch (bias_relu.py) through torchax: max |diff| 0" in out
    assert f"next: kernelbot optimize --task {task_dir}\n" in out and "next: /kernel new bias_relu\n" in out


def test_json_with_a_name_and_another_directory(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    proc = _port([str(SOURCES / "bias_relu.py"), "--name", "relu_after_bias", "--out", str(suite), "--json"],
                 tmp_path / "home")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert set(report) == JSON_KEYS
    assert report["ok"] is True and report["name"] == "relu_after_bias" and report["kind"] == "PyTorch"
    assert report["task_dir"] == str(suite / "relu_after_bias") and report["verified_by"] == "torchax"
    assert report["max_abs_err"] == 0.0 and report["error"] is None
    assert report["signature"] == ["x: float32[64,256] (input)", "bias: float32[256] (weight)"]
    assert report["next"][0] == f"kernelbot optimize --task {suite / 'relu_after_bias'}"
    assert "once" in report["next"][1] and "KERNELBOT_SUITES" in report["next"][1]  # not where /kernel new looks


@pytest.mark.slow
def test_bad_input_is_one_clear_line_and_exit_2(tmp_path: Path) -> None:
    missing = _port([str(tmp_path / "nope.py")], tmp_path)
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.startswith(f"error: {tmp_path / 'nope.py'} does not exist\nnext: ")
    no_model = _port([str(SOURCES / "no_model.py")], tmp_path)
    assert no_model.returncode == 2
    assert "no_model.py defines no `class Model(nn.Module)` (it has Net): rename the module to port to Model" \
        in no_model.stderr
    bad_name = _port([str(SOURCES / "bias_relu.py"), "--name", "Bias-ReLU"], tmp_path)
    assert bad_name.returncode == 2 and "'Bias-ReLU' is not a task name" in bad_name.stderr
    assert "Traceback" not in missing.stderr + no_model.stderr + bad_name.stderr
    assert not (tmp_path / "tasks").exists()


def test_a_port_that_fails_exits_1_naming_the_kind_and_line(tmp_path: Path) -> None:
    proc = _port([str(SOURCES / "forward_raises.py")], tmp_path)
    assert proc.returncode == 1, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: porting forward_raises.py failed (module_raised, line 13): the module's forward "
                           "raised in PyTorch (line 13: `return x @ self.weight")
    assert not (tmp_path / "tasks" / "forward_raises").exists()


def test_without_torch_the_message_names_the_extra(tmp_path: Path) -> None:
    # torch and torchax made unimportable for this child, as if they were not installed: `find_spec` and `import`
    # both treat a None entry in sys.modules as a module that is not there.
    blocked = ("import sys; sys.modules['torch'] = sys.modules['torchax'] = None; "
               f"sys.argv = ['kernelbot', 'port', {str(SOURCES / 'bias_relu.py')!r}]; "
               "from bot.cli.app import main; main()")
    proc = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, env=_env(tmp_path),
                          timeout=120, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    (error, hint) = proc.stderr.strip().splitlines()
    assert error == f"error: porting needs torch and torchax, which are not installed: {' '.join(EXTRA.split())}"
    assert "pip install 'kernelbot[port]'" in error and hint.startswith("next: install the extra")
    assert "Traceback" not in proc.stderr and not (tmp_path / "tasks").exists()


def test_cuda_needs_an_llm_brain(tmp_path: Path) -> None:
    for args in (["--brain", "offline"], []):  # [] and no ANTHROPIC_API_KEY: the offline brain is the default
        proc = _port([str(SOURCES / "bias_relu.cu"), *args], tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("error: porting CUDA or Triton source needs an LLM brain")
        assert "set ANTHROPIC_API_KEY" in proc.stderr and "cannot read CUDA or Triton" in proc.stderr


def test_a_triton_source_through_the_anthropic_brain_is_written_unverified(tmp_path: Path) -> None:
    from tests.agents.test_porter import RMS_NORM
    from tests.fakes.anthropic_api import API_KEY, fake_anthropic

    with fake_anthropic([{"text": f"```python\n{RMS_NORM}```"}]) as fake:
        proc = _port([str(SOURCES / "rms_norm_triton.py"), "--name", "rms_norm"], tmp_path,
                     ANTHROPIC_API_KEY=API_KEY, ANTHROPIC_BASE_URL=fake.base_url)
    assert proc.returncode == 0, proc.stderr
    task_dir = tmp_path / "tasks" / "rms_norm"
    assert f"ported rms_norm_triton.py (Triton) to the task rms_norm at {task_dir}" in proc.stdout
    assert "computation(x: float32[128,1024], w: float32[1024]) -> float32[128,1024]" in proc.stdout
    assert "  not verified by an oracle: nothing checked the JAX reference against the original" in proc.stdout
    assert "note: not verified by an oracle: no PyTorch reference was given" in proc.stdout
    assert f"next: kernelbot optimize --task {task_dir}" in proc.stdout and (task_dir / "reference.py").is_file()
    assert len(fake.requests) == 1
