"""Python source parsed safely from threads: every parse in kernelbot goes through `parse`.

CPython 3.11's AST constructor keeps its recursion depth in state the threads share, so two threads parsing at
once can fail with `SystemError: AST constructor recursion depth mismatch` (python/cpython#106905). A TPU host
runs 3.11, and its runner checks several candidates side by side: there it stopped a benchmark. Parses are short,
so one at a time costs nothing measurable.
"""

from __future__ import annotations

import ast
import threading

_ONE_AT_A_TIME = threading.Lock()


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse`, one thread at a time (raises SyntaxError as it does)."""
    with _ONE_AT_A_TIME:
        return ast.parse(source, filename=filename)
