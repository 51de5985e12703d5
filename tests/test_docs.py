"""The user documentation stays true to the product: its pictures and links exist, it names every `/kernel`
command and every evaluator verdict and error kind, and its example task loads and its kernel passes the static
check. Fast: files and source text only, no compiles."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from bot.slack.slash import COMMANDS
from tpu_runner.candidate import check_source
from tpu_runner.reports import Verdict
from tpu_runner.reports.errors import _PATTERNS
from tpu_runner.tasks import discover_tasks, load_task

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
GUIDE = DOCS / "user-guide.md"
TASKS_DOC = DOCS / "tasks.md"
VERDICTS = DOCS / "verdicts.md"
EXAMPLE = DOCS / "examples" / "scaled_tanh"
MAX_IMAGE_BYTES = 300 * 1024

_LINK = re.compile(r"(!?)\[[^\]]*\]\(([^)\s]+)\)|<img[^>]+src=\"([^\"]+)\"")


def _docs() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _links(doc: Path) -> list[tuple[bool, str]]:
    """(is an image, target) of every Markdown link and <img> in the file, code blocks left out."""
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.DOTALL | re.MULTILINE)  # fenced blocks only
    out = []
    for bang, target, img in _LINK.findall(text):
        out.append((bool(bang) or bool(img), target or img))
    return out


def _local(target: str) -> bool:
    return not re.match(r"[a-z]+:", target) and not target.startswith("#")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]{2,}|`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.DOTALL | re.MULTILINE)  # fenced blocks only
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)}


def test_the_user_docs_exist_and_show_pictures() -> None:
    for doc in (GUIDE, TASKS_DOC, VERDICTS):
        assert doc.is_file(), doc
    images = [t for is_image, t in _links(GUIDE) if is_image]
    assert len(images) >= 5, f"the user guide shows {images}"


@pytest.mark.parametrize("doc", _docs(), ids=lambda p: str(p.relative_to(DOCS)))
def test_every_image_and_local_link_of_the_docs_exists(doc: Path) -> None:
    missing = []
    for is_image, target in _links(doc):
        if not _local(target):
            continue
        path_part, _, anchor = target.partition("#")
        path = (doc.parent / path_part).resolve() if path_part else doc
        if not path.exists():
            missing.append(f"{'image' if is_image else 'link'} {target}")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            missing.append(f"anchor {target} (headings of {path.name}: {sorted(_anchors(path))})")
    assert not missing, f"{doc.relative_to(REPO)} links to what is not there: {missing}"


def test_the_pictures_are_commit_ready_pngs() -> None:
    pictures = sorted((DOCS / "images").glob("*.png"))
    assert pictures, "docs/images holds no pictures: run .venv/bin/python docs/render_screens.py"
    for picture in pictures:
        data = picture.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", picture
        assert len(data) < MAX_IMAGE_BYTES, f"{picture.name} is {len(data) // 1024} KB"


def test_every_kernel_command_is_in_the_user_guide() -> None:
    guide = GUIDE.read_text()
    missing = [name for name in COMMANDS if not re.search(rf"`/kernel {name}\b", guide)]
    assert not missing, f"the user guide never shows /kernel {missing}"


def test_every_terminal_command_is_in_the_user_guide() -> None:
    guide = GUIDE.read_text()
    missing = [c for c in ("optimize", "chat", "search", "bench", "eval") if f"kernelbot {c} " not in guide]
    assert not missing, missing


def test_the_example_task_loads_and_its_kernel_passes_the_static_check() -> None:
    assert EXAMPLE in discover_tasks(DOCS / "examples")
    task = load_task(EXAMPLE)
    assert task.task_id == "scaled_tanh" and task.param_count == 2 and task.family == "elementwise"
    kernel = EXAMPLE / "solutions" / "pallas.py"
    report = check_source(kernel.read_text(), expected_params=task.param_count, allow_pure_jax=task.allow_pure_jax,
                          filename=str(kernel))
    assert report.has_pallas_call and report.entry_point_params == task.param_count


def test_tasks_md_shows_the_example_files_as_they_are() -> None:
    doc = TASKS_DOC.read_text()
    for name in ("reference.py", "kernel_task.yaml", "solutions/pallas.py"):
        assert (EXAMPLE / name).read_text().strip() in doc, f"docs/tasks.md shows another {name} than the example's"


def test_tasks_md_explains_every_yaml_field() -> None:
    doc = TASKS_DOC.read_text()
    fields = ("task_id", "description", "atol", "rtol", "input_gen_code", "family", "allow_pure_jax",
              "allow_input_output_aliases")
    missing = [f for f in fields if not re.search(rf"^\| `{f}` \|", doc, flags=re.MULTILINE)]
    assert not missing, missing


def test_every_verdict_is_explained() -> None:
    doc = VERDICTS.read_text()
    missing = [v for v in typing.get_args(Verdict) if not re.search(rf"^\| `{v}` \|", doc, flags=re.MULTILINE)]
    assert not missing, f"docs/verdicts.md has no row for {missing}"


def _error_kinds() -> set[str]:
    """Every error kind the evaluator's source names."""
    kinds = {kind for kind, _ in _PATTERNS}
    for source in (REPO / "tpu_runner").rglob("*.py"):
        text = source.read_text()
        for pattern in (r"_violation\(\"([a-z_]+)\"", r"EvalError\(\s*(?:kind=)?\"([a-z_]+)\"",
                        r"default_kind=\"([a-z_]+)\"", r"self\.fail\(\"[a-z]+\", exc, \"([a-z_]+)\"\)",
                        r"\"SIG[A-Z]+\": \"([a-z_]+)\"", r"(?<!self\.)_fail\(\"([a-z_]+)\"", r"_LIMIT = \"([a-z_]+)\""):
            kinds.update(re.findall(pattern, text))
    return kinds


def test_every_error_kind_is_explained() -> None:
    kinds = _error_kinds()
    assert {"vmem_oom", "block_shape", "mismatch", "nan", "forbidden_import", "timeout", "duplicate_ir"} <= kinds
    doc = VERDICTS.read_text()
    missing = sorted(k for k in kinds if f"`{k}`" not in doc)
    assert not missing, f"docs/verdicts.md does not explain the error kinds {missing}"
