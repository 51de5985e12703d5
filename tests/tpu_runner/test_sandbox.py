"""The sandbox as a candidate meets it: no secrets, no network, limits that stop runaways."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from storage.settings import EvalLimits
from tpu_runner.candidate import SparePool
from tpu_runner.reports import MEMORY_LIMIT_ENV
from tpu_runner.sandbox import child_environment, rss_mib, run_child, spawn, untrusted_reads
from tpu_runner.sandbox.process import device_resident_kib

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


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
# The forked child only calls os, socket and json and leaves with os._exit: no lock of another thread is needed.
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning", "ignore:This process:DeprecationWarning")
def test_a_child_of_an_unprivileged_user_has_no_network_either() -> None:
    """A container's or a systemd unit's user may not enter a network namespace directly: the entry goes
    through a user namespace of its own, and the child still cannot reach the database beside it."""
    import socket

    from tpu_runner.sandbox import isolate_network

    "127.0.0.1".encode("idna")  # loaded now: the child, as nobody, cannot read this root-owned Python's files
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become nobody, isolate, try the database, report, leave without cleanup
        try:
            os.setgid(65534)
            os.setuid(65534)
            problem = isolate_network()
            try:
                socket.create_connection(("127.0.0.1", 5432), timeout=3).close()
                network = "connected"
            except OSError as exc:
                network = f"refused: {exc}"
            os.write(write, json.dumps({"problem": problem, "network": network}).encode())
        except BaseException as exc:  # say what went wrong instead of an empty pipe
            os.write(write, json.dumps({"problem": f"{type(exc).__name__}: {exc}", "network": "?"}).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        seen = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert seen["problem"] is None, seen
    assert seen["network"].startswith("refused"), seen


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
    outcome = first.run([str(out)], stage_file=tmp_path / "stage", limits=EvalLimits(wall_seconds=30),
                        writable=(tmp_path,))
    assert outcome.returncode == 0 and out.read_text() == str(first.proc.pid)
    second = pool.acquire("k", env_for)
    assert second is spare  # the spare serves the next request; a new one replaces it
    assert pool._spares["k"][0] is not spare
    waiting = pool._spares["k"][0]
    pool.close()
    assert not waiting.alive and not waiting.scratch.exists()
    second.discard()


def test_a_child_writes_only_beneath_its_scratch_directory_and_what_it_is_given(tmp_path: Path) -> None:
    """Landlock: the database, the caches and other evaluations' artifacts are out of a candidate's reach."""
    outside, given = tmp_path / "runner-home", tmp_path / "artifacts"
    outside.mkdir()
    given.mkdir()
    (outside / "kernelbot.db").write_text("the database")
    script = _script(tmp_path, textwrap.dedent("""\
        import os, sys
        results = {}
        for name, path in (("scratch", "mine.txt"), ("given", sys.argv[2] + "/ok.txt"),
                           ("outside", sys.argv[1] + "/planted.txt"), ("database", sys.argv[1] + "/kernelbot.db")):
            try:
                with open(path, "a") as f:
                    f.write("x")
                results[name] = "written"
            except OSError as exc:
                results[name] = type(exc).__name__
        try:
            os.remove(sys.argv[1] + "/kernelbot.db")
            results["remove"] = "removed"
        except OSError as exc:
            results["remove"] = type(exc).__name__
        print(results, os.environ.get("KERNELBOT_SANDBOX"))
    """))
    workdir = tmp_path / "work"
    env = child_environment(workdir=workdir, llo_dump_dir=None, on_tpu=False, target_accelerator="v6e-1")
    child = spawn(target=str(script), scratch=workdir, env=env, limits=EvalLimits(wall_seconds=30))
    outcome = child.run([str(outside), str(given)], stage_file=workdir / "stage", limits=EvalLimits(wall_seconds=30),
                        writable=(given,))
    assert outcome.returncode == 0, outcome.stderr_tail
    assert "'scratch': 'written'" in outcome.stdout_tail and "'given': 'written'" in outcome.stdout_tail
    for name in ("outside", "database", "remove"):
        assert f"'{name}': 'PermissionError'" in outcome.stdout_tail, outcome.stdout_tail
    assert "writes confined (Landlock ABI" in outcome.stdout_tail
    assert (outside / "kernelbot.db").read_text() == "the database" and not (outside / "planted.txt").exists()


def test_a_child_running_untrusted_code_reads_only_what_importing_it_needs(tmp_path: Path) -> None:
    """Reads confined: the database, the caches, the settings and other evaluations are unreadable, while Python,
    numpy, JAX and the task's own files load as they must."""
    home, task = tmp_path / "runner-home", tmp_path / "task"
    for path, text in ((home / "kernelbot.db", "the database"), (home / "cache" / "outputs.npz", "the answers"),
                       (home / "artifacts" / "other-eval" / "candidate.py", "someone's kernel"),
                       (tmp_path / "config.toml", "ANTHROPIC_API_KEY = 'sk'"), (task / "reference.py", "x = 1")):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    script = _script(tmp_path, textwrap.dedent("""\
        import os, sys
        import numpy, jax.numpy as jnp  # imported after the confinement: they must still load
        results = {"jax": float(jnp.ones(3).sum())}
        for name in ("database", "cache", "other", "settings", "task", "home_listing"):
            path = dict(zip(("database", "cache", "other", "settings", "task", "home_listing"), sys.argv[1:]))[name]
            try:
                results[name] = os.listdir(path) and "listed" if os.path.isdir(path) else open(path).read()[:4]
            except OSError as exc:
                results[name] = type(exc).__name__
        print(results, os.environ.get("KERNELBOT_SANDBOX"))
    """))
    workdir = tmp_path / "work"
    env = child_environment(workdir=workdir, llo_dump_dir=None, on_tpu=False, target_accelerator="v6e-1")
    child = spawn(target=str(script), scratch=workdir, env=env, limits=EvalLimits(wall_seconds=60))
    outcome = child.run([str(home / "kernelbot.db"), str(home / "cache" / "outputs.npz"),
                         str(home / "artifacts" / "other-eval" / "candidate.py"), str(tmp_path / "config.toml"),
                         str(task / "reference.py"), str(home)], stage_file=workdir / "stage",
                        limits=EvalLimits(wall_seconds=60), reads=untrusted_reads(task, script, private=(home,)))
    assert outcome.returncode == 0, outcome.stderr_tail
    out = outcome.stdout_tail
    assert "'jax': 3.0" in out and "'task': 'x = '" in out, out
    for name in ("database", "cache", "other", "settings", "home_listing"):
        assert f"'{name}': 'PermissionError'" in out, out
    assert "writes and reads confined (Landlock ABI" in out


SMAPS = """\
7f0000000000-7f0200000000 rw-s 00000000 00:0e 1234                       anon_inode:[vfio-device]
Size:            8388608 kB
Rss:             8388608 kB
Pss:             8388608 kB
VmFlags: rd wr sh mr mw me ms dc pf io de dd sd
7f0200000000-7f0300000000 rw-p 00000000 00:00 0
Size:            4194304 kB
Rss:             4000000 kB
7f0300000000-7f0300100000 r-xp 00000000 08:01 99                         /opt/libtpu/libtpu.so
Size:               1024 kB
Rss:                 512 kB
7f0400000000-7f0400100000 rw-s 00000000 00:06 7                          /dev/accel0
Rss:                 256 kB
"""


def test_a_chips_memory_mapped_into_a_process_is_not_host_memory() -> None:
    # What a TPU runtime maps of the chip (through vfio or an accel device file) is counted in VmRSS; the
    # memory limit is the host's, so only those mappings' resident pages come off.
    assert device_resident_kib(SMAPS.splitlines(keepends=True)) == 8388608 + 256
    assert device_resident_kib([]) == 0


def test_resident_memory_of_a_process_without_a_chip_is_its_vmrss() -> None:
    with open(f"/proc/{os.getpid()}/status") as f:
        vmrss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    assert abs(rss_mib(os.getpid()) - vmrss) < 64
    assert rss_mib(2**22 + 12345) == 0.0  # no such process


def test_a_spare_learns_the_memory_limit_of_the_run_it_is_given(tmp_path: Path) -> None:
    # A spare is started before anyone knows whether its run holds the chip (a higher limit): the child must size
    # its own work (the float64 truth) by the limit enforced on the run, not by the one it was started with.
    workdir = tmp_path / "work"
    script = _script(tmp_path, f"import os\nopen('limit.txt', 'w').write(os.environ['{MEMORY_LIMIT_ENV}'])\n")
    env = child_environment(workdir=workdir, llo_dump_dir=None, on_tpu=False, target_accelerator="v6e-1")
    child = spawn(target=str(script), scratch=workdir, env=env, limits=EvalLimits(wall_seconds=30, memory_mib=2000))
    outcome = child.run([], stage_file=workdir / "stage", limits=EvalLimits(wall_seconds=30, memory_mib=3000))
    assert outcome.returncode == 0, outcome.stderr_tail
    assert (workdir / "limit.txt").read_text() == "3000"
