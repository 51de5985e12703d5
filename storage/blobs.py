"""Content-addressed blobs in the database, and the files a job carries in them: a task (its directory, or a
KernelBench-style module file) and a kernel's source, packed where the job is submitted and unpacked where it runs.
The same bytes are stored once."""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
import uuid
from pathlib import Path
from typing import Any

from sqlmodel import Session

from storage.errors import KernelbotError
from storage.models import Blob

MAX_BLOB_BYTES = 32 * 2**20  # a task's files or a kernel's source; more is not a task but a data set
_SKIPPED = ("__pycache__", ".git", ".pytest_cache")


class BlobError(KernelbotError, ValueError):
    """Files that cannot travel with a job (too large, missing), or a blob that is not in the database."""
    next_step = ("pass a task or kernel path that exists and fits the limit; a job whose files are gone must be "
                 "enqueued again")


def put(session: Session, data: bytes) -> str:
    """Store `data` (once) and return its digest."""
    if len(data) > MAX_BLOB_BYTES:
        raise BlobError(f"{len(data) / 2**20:.1f} MiB is more than a job may carry ({MAX_BLOB_BYTES // 2**20} MiB)")
    digest = hashlib.sha256(data).hexdigest()
    if session.get(Blob, digest) is None:
        session.add(Blob(digest=digest, content=data, size=len(data)))
        session.flush()
    return digest


def get(session: Session, digest: str) -> bytes:
    blob = session.get(Blob, digest)
    if blob is None:
        raise BlobError(f"no blob {digest[:12]} in the database: the job's files were never stored, or were removed")
    return bytes(blob.content)


def _pack(path: Path) -> bytes:
    """A deterministic archive of a file or a directory (sorted, no times or owners), caches and VCS left out."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        members = [path] if path.is_file() else sorted(
            p for p in path.rglob("*") if p.is_file() and not any(part in _SKIPPED for part in p.parts))
        for member in members:
            data = member.read_bytes()
            info = tarfile.TarInfo(member.name if path.is_file() else member.relative_to(path).as_posix())
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def pack_files(session: Session, path: Path) -> dict[str, Any]:
    """Store a task (directory or module file) or a kernel file; what a job's payload keeps of it."""
    if not path.exists():
        raise BlobError(f"{path} does not exist")
    return {"blob": put(session, _pack(path)), "name": path.name, "kind": "file" if path.is_file() else "dir",
            "from": str(path)}


def unpack_files(session: Session, carried: dict[str, Any], root: Path) -> Path:
    """The carried files under `root/<digest>/` (unpacked once, then reused); the task directory or file's path."""
    digest, name = str(carried["blob"]), Path(str(carried["name"])).name
    home = root / digest
    target = home / name
    if target.exists():
        return target
    staging = root / f".{digest}.{uuid.uuid4().hex[:8]}"  # unpacked aside, then moved in whole
    dest = staging / name if carried.get("kind") == "dir" else staging
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(get(session, digest)), mode="r") as tar:
        tar.extractall(dest, filter="data")  # no absolute paths, links out of it or devices
    try:
        staging.rename(home)
    except OSError:  # another job unpacked the same files first
        shutil.rmtree(staging, ignore_errors=True)
    return target


KEPT_ARTIFACTS = ("result", "candidate", "profile_summary", "profile_chart", "profile_trace", "trace", "log")
MAX_KEPT_FILE_BYTES = 16 * 2**20  # a larger file stays on its runner only


def keep_files(session: Session, artifacts: dict[str, str]) -> dict[str, dict[str, str]]:
    """An evaluation's files worth fetching elsewhere (its result, kernel, profile, chart and traces), stored:
    {artifact: {"blob": digest, "name": file name}}. Folders and files too large are left on the runner."""
    kept = {}
    for name in KEPT_ARTIFACTS:
        path = Path(artifacts.get(name, ""))
        if artifacts.get(name) and path.is_file() and path.stat().st_size <= MAX_KEPT_FILE_BYTES:
            kept[name] = {"blob": put(session, path.read_bytes()), "name": path.name}
    return kept


def fetch_files(session: Session, kept: dict[str, dict[str, str]], into: Path) -> list[Path]:
    """Write a job's kept files into `into` (created); their paths."""
    into.mkdir(parents=True, exist_ok=True)
    written = []
    for entry in kept.values():
        target = into / Path(entry["name"]).name
        target.write_bytes(get(session, entry["blob"]))
        written.append(target)
    return written
