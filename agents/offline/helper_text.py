"""The source of kernel helpers, read from the modules that define them, for pasting into written kernels.

A kernel the offline brain writes is one self-contained module (the evaluator loads it alone), so its helpers are
pasted into it. They are written as real functions in helper modules (`agents.offline.kernel_helpers`, and a
`helpers` module per family package), where ruff and the tests read them as code; this module gives back their
text. The helper modules import jax and the brain does not, so their files are parsed, never imported.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

from tpu_runner.tasks import parse


@functools.cache
def _definitions(module: str) -> dict[str, str]:
    """Each top-level function and assignment of a module, by name, as its source text."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"no helper module {module}")
    text = Path(spec.origin).read_text()
    found = {}
    for node in parse(text, spec.origin).body:
        if isinstance(node, ast.FunctionDef):
            found[node.name] = ast.get_source_segment(text, node) or ""
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found[node.targets[0].id] = ast.get_source_segment(text, node) or ""
    return found


def helper_source(module: str, *names: str, rename: dict[str, str] | None = None) -> str:
    """The named definitions of `module`, in that order, two blank lines apart (no newline after the last).
    `rename` gives a function another name in the kernel (two variants of one helper live side by side here)."""
    definitions = _definitions(module)
    missing = [name for name in names if name not in definitions]
    if missing:
        raise KeyError(f"{module} defines no {', '.join(missing)}")
    texts = []
    for name in names:
        text = definitions[name]
        if rename and name in rename:
            text = text.replace(f"def {name}(", f"def {rename[name]}(", 1)
        texts.append(text)
    return "\n\n\n".join(texts)
