"""Checking a pasted reference in a sandboxed child: shapes from a good one, one clear message with the reference's
line from a bad one, a hang stopped by the wall clock, and task directories written whole or not at all."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

from storage.settings import Settings, load_settings
from tpu_runner.tasks import (
    TaskError,
    add_checked_task,
    check_reference,
    files_digest,
    load_task,
    read_task_files,
    write_task,
)

GOOD = '''\
"""Scaled tanh and row sums, two configurations."""
import os

import jax
import jax.numpy as jnp


def computation(x, scale):
    return jnp.tanh(x) * scale, jnp.sum(x, axis=-1)


def get_inputs():
    key = jax.random.PRNGKey(0)
    return [([jax.random.normal(key, (256, 512), jnp.float32)], [2.0]),
            ([jax.random.normal(key, (64, 1024), jnp.bfloat16)], [3.0])]


def get_test_inputs():
    # The sandbox hands the reference no secrets of the process that checks it.
    assert "SLACK_BOT_TOKEN" not in os.environ, "the reference can read the bot token"
    return [jax.random.normal(jax.random.PRNGKey(1), (8, 128), jnp.float32)], [2.0]
'''

RAISES = '''\
import jax.numpy as jnp


def computation(x):
    return x


def get_inputs():
    raise ValueError("no inputs today")
'''

SHAPE_ERROR = '''\
import jax


def computation(a, b):
    return a @ b


def get_inputs():
    key = jax.random.PRNGKey(0)
    return [jax.random.normal(key, (64, 32)), jax.random.normal(key, (64, 32))], []
'''

NO_OUTPUT = '''\
import jax


def computation(x):
    x.sum()


def get_inputs():
    return [jax.random.normal(jax.random.PRNGKey(0), (8, 128))], []
'''

HANG = '''\
import jax.numpy as jnp


def computation(x):
    return x


def get_inputs():
    while True:
        pass
'''


def _files(source: str, name: str = "pasted") -> dict[str, str]:
    return {"reference.py": textwrap.dedent(source), "kernel_task.yaml": f"task_id: {name}\natol: 0.001\nrtol: 0.001\n"}


def _task(root: Path, source: str, name: str = "pasted") -> Path:
    return write_task(_files(source, name), root / name)


def _line_of(source: str, text: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if text in line)


@pytest.fixture
def home_settings(tmp_path: Path) -> Settings:
    return load_settings({"KERNELBOT_HOME": str(tmp_path / "home")})


def test_a_good_reference_gives_its_shapes_without_running_in_this_process(
        tmp_path: Path, home_settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-secret")
    task_dir = _task(tmp_path, GOOD)
    check = check_reference(task_dir, home_settings)
    assert check.ok, check.error
    assert check.shapes == ("float32[256,512], 2.0", "bfloat16[64,1024], 3.0")
    assert check.outputs == ("(float32[256,512], float32[256])", "(bfloat16[64,1024], bfloat16[64])")
    assert check.tested == 1 and check.error is None and check.notes == ()
    assert f"kernelbot_reference_{load_task(task_dir).digest}" not in sys.modules
    assert list(home_settings.sandbox_dir.iterdir()) == []  # the child's scratch directory is gone


def test_get_inputs_raising_names_its_line_and_leaves_no_task_behind(tmp_path: Path, home_settings: Settings) -> None:
    dest = home_settings.home / "tasks" / "pasted"
    added = add_checked_task(_files(RAISES), dest=dest, settings=home_settings)
    assert added.task_dir is None and not added.check.ok
    line = _line_of(RAISES, "raise ValueError")
    assert added.check.error == f"Line {line}: get_inputs() raised ValueError: no inputs today"
    assert added.check.line == line
    assert not dest.exists()
    assert list((home_settings.home / "staging").iterdir()) == []


def test_a_shape_error_in_computation_names_the_shapes_and_its_line(tmp_path: Path, home_settings: Settings) -> None:
    check = check_reference(_task(tmp_path, SHAPE_ERROR), home_settings)
    assert not check.ok
    assert check.error is not None and check.error.startswith(f"Line {_line_of(SHAPE_ERROR, 'a @ b')}: computation")
    assert "float32[64,32], float32[64,32]" in check.error and "dot_general" in check.error
    assert check.shapes == ("float32[64,32], float32[64,32]",) and check.outputs == ()


def test_a_computation_that_returns_nothing_is_refused(tmp_path: Path, home_settings: Settings) -> None:
    check = check_reference(_task(tmp_path, NO_OUTPUT), home_settings)
    assert not check.ok
    assert check.error is not None and "computation returned None, not an array" in check.error


def test_a_hang_is_stopped_by_the_wall_clock(tmp_path: Path, home_settings: Settings) -> None:
    started = time.monotonic()
    check = check_reference(_task(tmp_path, HANG), home_settings, wall_seconds=8)
    assert not check.ok
    assert check.error is not None and check.error.startswith("The reference did not finish within 8 s")
    assert time.monotonic() - started < 25


def test_task_files_are_written_whole_and_never_over_another_task(tmp_path: Path) -> None:
    files = _files(GOOD)
    dest = tmp_path / "tasks" / "pasted"
    assert write_task(files, dest) == dest
    assert read_task_files(dest) == files
    assert load_task(dest).digest == files_digest(files)
    assert write_task(files, dest) == dest  # the same task again is kept
    with pytest.raises(TaskError, match="a different task already lives at"):
        write_task(_files(RAISES), dest)
    assert read_task_files(dest) == files
    assert [p.name for p in (tmp_path / "tasks").iterdir() if p.name != ".incoming"] == ["pasted"]
    assert list((tmp_path / "tasks" / ".incoming").iterdir()) == []
