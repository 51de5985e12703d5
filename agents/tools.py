"""Tools LLM brains may call. `jax_api` shows the installed JAX's own signature and docstring of an object, so a
brain checks the Pallas API of this version instead of guessing (the API moves fast)."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from agents.brain import Tool

MAX_DOC_CHARS = 6000


def describe_jax_object(path: str) -> str:
    """`jax.experimental.pallas.BlockSpec` -> its signature and docstring; only names under `jax`."""
    path = path.strip()
    if not (path == "jax" or path.startswith("jax.")) or not all(p.isidentifier() for p in path.split(".")):
        raise ValueError(f"{path!r} is not a dotted name under jax (e.g. jax.experimental.pallas.BlockSpec)")
    if any(p.startswith("_") for p in path.split(".")):
        raise ValueError(f"{path}: private names are not part of the API")
    parts = path.split(".")
    obj: Any = None
    for i in range(len(parts), 0, -1):  # the longest importable module prefix, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                raise ValueError(f"{'.'.join(parts[:parts.index(attr)])} has no attribute {attr!r}")
            obj = getattr(obj, attr)
        break
    try:
        signature = f"{path}{inspect.signature(obj)}"
    except (TypeError, ValueError):
        signature = f"{path} ({type(obj).__name__})"
    doc = inspect.getdoc(obj) or "(no docstring)"
    if len(doc) > MAX_DOC_CHARS:
        doc = doc[:MAX_DOC_CHARS] + "\n... (truncated)"
    members = ""
    if inspect.ismodule(obj) or inspect.isclass(obj):
        public = sorted(n for n in dir(obj) if not n.startswith("_"))
        members = "\n\nmembers: " + ", ".join(public[:200])
    return f"{signature}\n\n{doc}{members}"


def jax_api_tool() -> Tool:
    return Tool(
        name="jax_api",
        description="Signature, docstring and public members of an object in the installed JAX, by dotted name "
                    "(e.g. jax.experimental.pallas.pallas_call, jax.experimental.pallas.tpu.CompilerParams).",
        input_schema={"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
        run=lambda args: describe_jax_object(str(args.get("name", ""))),
    )
