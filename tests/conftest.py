"""Shared fixtures: every test gets its own data directory; nothing touches the user's KERNELBOT_HOME."""

from __future__ import annotations

import os

# The test process never runs on a TPU, as kernelbot's own processes never do: on a TPU host the chip has one holder
# at a time, and the evaluator's children that run on it get their own environment. Before anything imports JAX.
os.environ["JAX_PLATFORMS"] = "cpu"

from collections.abc import Iterator  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from storage.settings import Settings, host_target, load_settings  # noqa: E402
from tpu_runner.candidate import SparePool, spare_pool  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TASKS = REPO / "tasks"
CORPUS = Path(__file__).resolve().parent / "corpus"

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
HOST_TPU = host_target(os.environ)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules with `slow` tests run first; tests marked `tpu` need this host's chip: elsewhere they are skipped,
    with the reason in the summary.

    xdist hands out whole modules in this order (`--dist loadscope --no-loadscope-reorder`): a module of one
    three-minute test handed out last kept one worker busy minutes after the other had finished."""
    def module(item: pytest.Item) -> str:
        return getattr(getattr(item, "module", None), "__name__", "")

    slow = {module(item) for item in items if "slow" in item.keywords}
    items.sort(key=lambda item: module(item) not in slow)  # a stable sort: each module's tests stay together, in order
    if HOST_TPU is not None:
        return
    skip = pytest.mark.skip(reason="needs a TPU host (no TPU device files and TPU_ACCELERATOR_TYPE here); on one: "
                            "./kb test -m tpu -n 0")
    for item in items:
        if "tpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One reference cache for the whole run, as the runners of one host share one: both xdist workers and the
    commands the tests start (they inherit the environment) run each task's reference once. Tests that need a
    cold cache build their settings from a home of their own."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the workers' common directory
    cache = root / "shared-cache"
    cache.mkdir(exist_ok=True)
    before = os.environ.get("KERNELBOT_CACHE_DIR")
    os.environ["KERNELBOT_CACHE_DIR"] = str(cache)
    yield cache
    if before is None:
        os.environ.pop("KERNELBOT_CACHE_DIR", None)
    else:
        os.environ["KERNELBOT_CACHE_DIR"] = before


@pytest.fixture(scope="session")
def kernelbot_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kernelbot-home")


@pytest.fixture(scope="session")
def settings(kernelbot_home: Path, shared_cache: Path) -> Settings:
    return load_settings({"KERNELBOT_HOME": str(kernelbot_home), "KERNELBOT_CACHE_DIR": str(shared_cache)})


@pytest.fixture(scope="session")
def verdict_settings(settings: Settings) -> Settings:
    """For the tests that assert verdicts only (many kernels through the whole evaluator): no static cycle profile
    (`KERNELBOT_STATIC_PROFILE=off`), which took ~40% of those evaluations' time (the 12 suite tasks' kernels: 106 s
    with it, 66 s without). The compiles are libtpu's as ever; only the estimate goes on without cycles."""
    return replace(settings, static_profile="off")


@pytest.fixture(scope="session")
def spares(settings: Settings) -> Iterator[SparePool]:
    """One pool for a worker's evaluations, as a runner keeps one: its compile servers start once."""
    with spare_pool(settings, keep=0) as pool:
        yield pool
