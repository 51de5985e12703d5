"""The layering holds: bot -> agents -> tpu_runner -> storage, arrows pointing down only."""

from __future__ import annotations

import ast

import pytest

from tests.conftest import REPO

BELOW = {"storage": set(), "tpu_runner": {"storage"}, "agents": {"tpu_runner", "storage"},
         "bot": {"agents", "tpu_runner", "storage"}}


def _imports(path) -> set[str]:  # type: ignore[no-untyped-def]
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(BELOW))
def test_a_package_imports_only_the_layers_below_it(package: str) -> None:
    ours = set(BELOW)
    wrong = {}
    for path in sorted((REPO / package).rglob("*.py")):
        if "migrations" in path.parts:
            continue
        upward = (_imports(path) & ours) - BELOW[package] - {package}
        if upward:
            wrong[str(path.relative_to(REPO))] = sorted(upward)
    assert not wrong, f"{package} imports layers above it: {wrong}"
