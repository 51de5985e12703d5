"""Jobs carry their files: the task's and the kernel's bytes travel in the database, so a runner anywhere runs the
job after the files it was submitted from are gone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select

from storage.blobs import BlobError, pack_files, put, unpack_files
from storage.models import Blob
from tests.conftest import REPO, TASKS


def test_files_are_stored_once_and_unpacked_as_they_were(engine: Engine, tmp_path: Path) -> None:
    task = tmp_path / "softmax"
    shutil.copytree(TASKS / "softmax", task)
    (task / "__pycache__").mkdir(exist_ok=True)
    (task / "__pycache__" / "junk.pyc").write_bytes(b"\0")
    with Session(engine) as s, s.begin():
        first = pack_files(s, task)
        again = pack_files(s, task)
        kernel = pack_files(s, task / "solutions" / "pallas.py")
        assert first["blob"] == again["blob"] and first["kind"] == "dir" and kernel["kind"] == "file"
        assert len(s.exec(select(Blob)).all()) == 2  # the same bytes once
    shutil.rmtree(task)
    with Session(engine) as s:
        unpacked = unpack_files(s, first, tmp_path / "jobs")
        assert unpacked.name == "softmax" and unpack_files(s, first, tmp_path / "jobs") == unpacked
        assert (unpacked / "reference.py").read_bytes() == (TASKS / "softmax" / "reference.py").read_bytes()
        assert not (unpacked / "__pycache__").exists()
        source = unpack_files(s, kernel, tmp_path / "jobs")
        assert source.name == "pallas.py" and source.read_bytes() == (
            TASKS / "softmax" / "solutions" / "pallas.py").read_bytes()
        with pytest.raises(BlobError, match="no blob 000000000000"):
            unpack_files(s, {"blob": "0" * 64, "name": "x.py", "kind": "file"}, tmp_path / "jobs")
    with Session(engine) as s, pytest.raises(BlobError, match="more than a job may carry"):
        put(s, b"\0" * (33 * 2**20))


@pytest.mark.slow
def test_a_job_runs_after_its_kernel_file_is_deleted_on_a_runner_elsewhere(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "KERNELBOT_HOME": str(home), "PYTHONPATH": str(REPO)}
    submitted = tmp_path / "submitter"
    shutil.copytree(TASKS / "layer_norm", submitted / "layer_norm")
    kernel = submitted / "my_kernel.py"
    shutil.copy(TASKS / "layer_norm" / "solutions" / "pallas.py", kernel)
    cli = [sys.executable, "-m", "bot.cli"]
    proc = subprocess.run([*cli, "enqueue-eval", "--task", str(submitted / "layer_norm"), "--kernel", str(kernel)],
                          env=env, capture_output=True, text=True, timeout=120, cwd=submitted)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    shutil.rmtree(submitted)  # the files it was submitted from are gone
    elsewhere = tmp_path / "runner-host"
    elsewhere.mkdir()
    proc = subprocess.run([*cli, "runner", "--exit-when-idle", "--name", "elsewhere", "--kind", "evaluate"], env=env,
                          capture_output=True, text=True, timeout=600, cwd=elsewhere)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shutil.rmtree(home / "artifacts")  # the runner's own disk is not where the team reads results
    fetched = tmp_path / "fetched"
    job = json.loads(subprocess.run([*cli, "job", job_id, "--json", "--files", str(fetched)], env=env,
                                    capture_output=True, text=True, timeout=120, cwd=elsewhere, check=True).stdout)
    assert job["status"] == "done" and job["verdict"] == "ok", job
    assert {Path(p).name for p in job["fetched"]} >= {"result.json", "candidate.py", "profile.png",
                                                      "profile.trace.json", "profile.txt"}
    assert (fetched / "candidate.py").read_bytes() == (TASKS / "layer_norm" / "solutions" / "pallas.py").read_bytes()
    assert json.loads((fetched / "result.json").read_text())["verdict"] == "ok"
