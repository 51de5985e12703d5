"""The sandbox as a candidate meets it: no secrets, no network, limits that stop runaways."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from storage.settings import EvalLimits
from tpu_runner.sandbox import SparePool, child_environment, run_child

PROBE = """
import json, os, socket
result = {"env": sorted(os.environ)}
try:
    socket.create_connection(("127.0.0.1", 5432), timeout=3).close()
    result["network"] = "connected"
except OSError as exc:
    result["network"] = f"refused: {exc}"
open("probe.json", "w").write(json.dumps(result))
"""


def _script(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "probe_script.py"
    path.write_text(textwrap.dedent(source))
    return path


def test_child_gets_no_secrets_and_no_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for secret in ("SLACK_BOT_TOKEN", "ANTHROPIC_API_KEY", "KERNELBOT_DATABASE_URL", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(secret, "s3cr3t")
    workdir = tmp_path / "work"
    env = child_environment(workdir=workdir, llo_dump_dir=None, on_tpu=False, target_accelerator="v6e-1")
    outcome = run_child(module=str(_script(tmp_path, PROBE)), args=[], workdir=workdir, env=env,
                        limits=EvalLimits(wall_seconds=30))
    assert outcome.returncode == 0, outcome.stderr_tail
    seen = json.loads((workdir / "probe.json").read_text())
    assert not {"SLACK_BOT_TOKEN", "ANTHROPIC_API_KEY", "KERNELBOT_DATABASE_URL", "AWS_SECRET_ACCESS_KEY"} & set(
        seen["env"])
    assert seen["network"].startswith("refused"), seen["network"]
    assert os.environ["SLACK_BOT_TOKEN"] == "s3cr3t"  # the parent keeps its own


def test_wall_clock_limit_stops_a_sleeper(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    script = _script(tmp_path, "import time\nopen('stage', 'w').write('correctness')\ntime.sleep(60)\n")
    env = child_environment(workdir=workdir, llo_dump_dir=None, on_tpu=False, target_accelerator="v6e-1")
    outcome = run_child(module=str(script), args=[], workdir=workdir, env=env, limits=EvalLimits(wall_seconds=2))
    assert outcome.timed_out and not outcome.memory_exceeded
    assert outcome.stage == "correctness"
    assert outcome.wall_seconds < 30


def test_memory_limit_stops_a_hog(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    script = _script(tmp_path, "blocks = []\nwhile True:\n    blocks.append(bytearray(64 * 2**20))\n")
    env = child_environment(workdir=workdir, llo_dump_dir=None, on_tpu=False, target_accelerator="v6e-1")
    outcome = run_child(module=str(script), args=[], workdir=workdir, env=env,
                        limits=EvalLimits(wall_seconds=60, memory_mib=600))
    assert outcome.memory_exceeded
    assert outcome.peak_rss_mib > 600


def test_output_is_capped(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    script = _script(tmp_path, "import sys\nfor _ in range(2000):\n    sys.stderr.write('x' * 10000 + '\\n')\n")
    env = child_environment(workdir=workdir, llo_dump_dir=None, on_tpu=False, target_accelerator="v6e-1")
    outcome = run_child(module=str(script), args=[], workdir=workdir, env=env,
                        limits=EvalLimits(wall_seconds=30, output_bytes=5000))
    assert len(outcome.stderr_tail) <= 5000


def test_spare_pool_keeps_children_started_ahead_and_cleans_up(tmp_path: Path) -> None:
    script = _script(tmp_path, "import os, sys\nopen(sys.argv[1], 'w').write(str(os.getpid()))\n")
    pool = SparePool(root=tmp_path / "spares", limits=EvalLimits(wall_seconds=30), keep=1, target=str(script))

    def env_for(scratch: Path) -> dict[str, str]:
        return child_environment(workdir=scratch, llo_dump_dir=None, on_tpu=False, target_accelerator="v6e-1")

    first = pool.acquire("k", env_for)
    spare = pool._spares["k"][0]
    assert spare.alive and spare is not first  # started before anyone asked for it
    out = tmp_path / "first.txt"
    outcome = first.run([str(out)], stage_file=tmp_path / "stage", limits=EvalLimits(wall_seconds=30))
    assert outcome.returncode == 0 and out.read_text() == str(first.proc.pid)
    second = pool.acquire("k", env_for)
    assert second is spare  # the spare serves the next request; a new one replaces it
    assert pool._spares["k"][0] is not spare
    waiting = pool._spares["k"][0]
    pool.close()
    assert not waiting.alive and not waiting.scratch.exists()
    second.discard()
