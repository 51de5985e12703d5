"""The layering holds: bot -> agents -> tpu_runner -> storage, arrows pointing down only; inside bot/, the terminal
and Slack stand side by side on what both share; and no module imports, however indirectly, one that imports it.
tpu_runner's sub-packages export their public names lazily: every name resolves, callers outside a sub-package import
them from it, and importing a sub-package alone loads none of its modules and no JAX."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = ("bot", "agents", "tpu_runner", "storage")
BELOW = {"storage": set(), "tpu_runner": {"storage"}, "agents": {"tpu_runner", "storage"},
         "bot": {"agents", "tpu_runner", "storage"}}
# tpu_runner/'s sub-packages, lowest first: each may import only those before it (the evaluator's stages build on
# the records, the hardware, the sandbox and the task formats; the pipeline, the runner and porting on everything).
TPU_RUNNER_PARTS = ("reports", "hardware", "sandbox", "tasks", "analysis", "compiler", "checking", "timing",
                    "reference", "candidate", "jobs", "evaluation", "runner", "porting")
# Inside bot/: which surfaces each part may import (modules directly in bot/ are what both surfaces share).
BOT_PARTS = {"bot.cli": {"bot.cli", "bot.slack", "bot"}, "bot.slack": {"bot.slack", "bot"}, "bot": {"bot"}}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _export_table(part: str) -> dict[str, str]:
    """A tpu_runner sub-package's exports, read from its `__init__` without importing it: name -> defining module."""
    for node in ast.walk(ast.parse((REPO / "tpu_runner" / part / "__init__.py").read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_exports":
            return ast.literal_eval(node.args[1])
    return {}


EXPORTS = {part: _export_table(part) for part in TPU_RUNNER_PARTS}
# `tpu_runner.timing.measure_pair` -> `tpu_runner.timing.measure`: an import of an exported name is an import of the
# module that defines it, so the graph below keeps the edges the packages' lazy attributes hide.
EXPORTED_FROM = {f"tpu_runner.{part}.{name}": f"tpu_runner.{part}.{module}"
                 for part, table in EXPORTS.items() for name, module in table.items()}


def _imported_names(module: str, path: Path) -> Iterator[str]:
    """Every dotted name a module imports, at any depth of its code (function-level imports count too)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def _ours(name: str) -> str | None:
    name = EXPORTED_FROM.get(name, name)
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        targets = {_ours(name) for name in _imported_names(module, path)}
        graph[module] = {t for t in targets if t and t != module}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


@pytest.mark.parametrize("package", sorted(BELOW))
def test_a_package_imports_only_the_layers_below_it(package: str) -> None:
    wrong = {}
    for module, targets in _graph().items():
        if module.split(".")[0] != package:
            continue
        upward = {t.split(".")[0] for t in targets} - BELOW[package] - {package}
        if upward:
            wrong[module] = sorted(upward)
    assert not wrong, f"{package} imports layers above it: {wrong}"


def _bot_part(module: str) -> str:
    return ".".join(module.split(".")[:2]) if module.split(".")[:2] in (["bot", "cli"], ["bot", "slack"]) else "bot"


def test_slack_never_imports_the_terminal_and_shared_modules_import_neither() -> None:
    wrong = {}
    for module, targets in _graph().items():
        if not module.startswith("bot"):
            continue
        part = _bot_part(module)
        bad = sorted(t for t in targets if t.startswith("bot") and _bot_part(t) not in BOT_PARTS[part])
        if bad:
            wrong[module] = bad
    assert not wrong, f"bot/ parts import a surface they stand beside: {wrong}"


def _tpu_runner_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "tpu_runner" and len(parts) > 1 else None


def test_tpu_runner_modules_live_in_its_sub_packages() -> None:
    flat = sorted(m for m in MODULES if _tpu_runner_part(m) not in (*TPU_RUNNER_PARTS, None))
    assert not flat, f"tpu_runner modules outside its sub-packages {TPU_RUNNER_PARTS}: {flat}"


def test_tpu_runner_sub_packages_import_only_those_below() -> None:
    rank = {part: i for i, part in enumerate(TPU_RUNNER_PARTS)}
    wrong = {}
    for module, targets in _graph().items():
        part = _tpu_runner_part(module)
        if part not in rank:  # outside tpu_runner, or a flat module (the test above names those)
            continue
        # A target outside the sub-packages (storage, tpu_runner's own __init__) is below them all.
        upward = sorted(t for t in targets if rank.get(_tpu_runner_part(t) or "", -1) > rank[part])
        if upward:
            wrong[module] = upward
    assert not wrong, f"tpu_runner sub-packages import ones above them ({' < '.join(TPU_RUNNER_PARTS)}): {wrong}"


def test_no_module_imports_itself_through_others() -> None:
    circles = _circles(_graph())
    assert not circles, f"import circles (each a set of modules that import each other): {circles}"


def test_the_circle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_the_graph_follows_an_exported_name_to_its_module() -> None:
    assert _ours("tpu_runner.timing.measure_pair") == "tpu_runner.timing.measure"
    assert _ours("tpu_runner.hardware.chip") == "tpu_runner.hardware.chip"  # a module imported from its package


@pytest.mark.parametrize("part", TPU_RUNNER_PARTS)
def test_every_exported_name_resolves_to_its_module(part: str) -> None:
    package = importlib.import_module(f"tpu_runner.{part}")
    table = EXPORTS[part]
    missing = sorted(set(table) - set(package.__all__))
    assert not missing, f"tpu_runner.{part}.__all__ lacks {missing}"
    assert set(package.__all__) <= set(dir(package))
    modules = {path.stem for path in (REPO / "tpu_runner" / part).glob("*.py")}
    shadowed = sorted(set(package.__all__) & modules)
    assert not shadowed, f"tpu_runner.{part} exports names of its own modules, which the modules replace: {shadowed}"
    wrong = {}
    for name in package.__all__:
        value = getattr(package, name)  # raises for a name its module lacks
        defined = inspect.isclass(value) or inspect.isfunction(value)  # constants and type aliases do not say where
        if name in table and defined and value.__module__ != f"tpu_runner.{part}.{table[name]}":
            wrong[name] = value.__module__
    assert not wrong, f"tpu_runner.{part} maps names to a module other than the one defining them: {wrong}"
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        package.no_such_name  # noqa: B018


def _python_files() -> Iterator[Path]:
    for top in (*PACKAGES, "tests", "benchmarks"):
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if not rel.startswith("tests/corpus/"):
                yield path


def test_callers_outside_a_sub_package_import_its_exported_names_from_it() -> None:
    wrong = []
    for path in _python_files():
        parts = path.relative_to(REPO).parts
        inside = parts[1] if parts[0] == "tpu_runner" and len(parts) > 2 else None
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            package, _, module = node.module.rpartition(".")
            part = _tpu_runner_part(package) if package.count(".") == 1 else None
            if part not in EXPORTS or part == inside:
                continue
            named = sorted(a.name for a in node.names if EXPORTS[part].get(a.name) == module)
            if named:
                wrong.append(f"{path.relative_to(REPO)}:{node.lineno}: {', '.join(named)} from {node.module}, "
                             f"not from {package}")
    assert not wrong, "exported names imported by module path, not from their package:\n" + "\n".join(wrong)


_LOADED = """import importlib, json, sys
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(sys.modules)))"""


@pytest.mark.parametrize("part", TPU_RUNNER_PARTS)
def test_importing_a_sub_package_alone_loads_none_of_its_modules_and_no_jax(part: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _LOADED, f"tpu_runner.{part}"], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=True)
    loaded = set(json.loads(proc.stdout))
    heavy = sorted(m for m in loaded if m.split(".")[0] in ("jax", "jaxlib", "numpy", "libtpu", "torch"))
    assert not heavy, f"importing tpu_runner.{part} loads {heavy[:10]}"
    own = sorted(m for m in loaded if m.startswith(f"tpu_runner.{part}."))
    assert not own, f"importing tpu_runner.{part} loads its modules {own}"


def test_an_exported_name_is_read_from_its_module_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from tpu_runner import timing
    from tpu_runner.timing import band

    monkeypatch.setattr(band, "band_text", "patched")
    assert timing.band_text == "patched"  # never a copy in the package, so a test patching the module is seen
    assert "band_text" not in vars(timing)
