"""The README stays true to the tree and short: its links and anchors resolve (docs/ pages are checked by
test_docs.py), the counts it and the pages give match the folders they count, and it stays a five-minute read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO

PAGES = [REPO / "README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)|<img src=\"([^\"]+)\"")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in page.read_text().splitlines() if line.startswith("#")}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for match in LINK.finditer(page.read_text()):
        target = match.group(1) or match.group(2)
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists() or (anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved)):
            broken.append(target)
    assert not broken, f"{page.name}: {broken}"


def test_the_counts_match_the_tree() -> None:
    tasks = [d for d in (REPO / "tasks").iterdir() if (d / "kernel_task.yaml").is_file()]
    solved = [d for d in tasks if (d / "solutions" / "pallas.py").is_file()]
    measured = [d for d in (REPO / "benchmarks" / "measured").iterdir() if (d / "kernel_task.yaml").is_file()]
    assert f"`tasks/` ({len(tasks)} tasks)" in (REPO / "README.md").read_text()
    cli = (REPO / "docs" / "cli.md").read_text()
    assert f"`tasks/` holds {len(tasks)} tasks" in cli and f"{len(solved)} have a known-good kernel" in cli
    benchmarks = (REPO / "docs" / "benchmarks.md").read_text()
    assert f"`tasks/` ({len(tasks)} tasks)" in benchmarks
    assert f"`benchmarks/measured/` ({len(measured)} tasks)" in benchmarks


def test_the_readme_is_a_five_minute_read() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 150, len(lines)
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[:2] == ["## The two commands", "## Everyday commands"]
    assert {"## Slack", "## On a TPU host", "## A fleet of hosts"} <= set(headings)
