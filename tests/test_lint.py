"""The code stays ruff-clean (the rules are in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def test_ruff_is_clean() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", str(REPO)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
