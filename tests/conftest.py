"""Shared fixtures: every test gets its own data directory; nothing touches the user's KERNELBOT_HOME."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from storage.settings import Settings, load_settings

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
