"""Shared fixtures: every test gets its own data directory; nothing touches the user's KERNELBOT_HOME."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage.settings import Settings, load_settings
from tpu_runner.spares import SparePool, spare_pool

REPO = Path(__file__).resolve().parent.parent
TASKS = REPO / "tasks"
CORPUS = Path(__file__).resolve().parent / "corpus"

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


@pytest.fixture(scope="session")
def kernelbot_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kernelbot-home")


@pytest.fixture(scope="session")
def settings(kernelbot_home: Path) -> Settings:
    return load_settings({"KERNELBOT_HOME": str(kernelbot_home)})


@pytest.fixture(scope="session")
def spares(settings: Settings) -> Iterator[SparePool]:
    """One pool for a worker's evaluations, as a runner keeps one: its compile servers start once."""
    with spare_pool(settings, keep=0) as pool:
        yield pool
