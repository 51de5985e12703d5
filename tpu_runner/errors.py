"""Turn exceptions from JAX, Pallas, Mosaic and XLA into structured errors with the candidate's line."""

from __future__ import annotations

import re
import traceback
from types import TracebackType

from tpu_runner.result import EvalError

# (kind, pattern) in priority order; the first that matches the exception text wins.
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern, re.IGNORECASE | re.DOTALL)) for kind, pattern in (
        ("vmem_oom", r"ScopedVmemOom|out of memory in memory space vmem|vmem.{0,40}(exceed|oom|out of memory)|"
                     r"would exceed memory.{0,300}space=vmem"),
        ("hbm_oom", r"HbmOom|out of memory in memory space hbm|RESOURCE_EXHAUSTED"),
        ("alignment", r"Alignment|not aligned|misaligned"),
        ("block_shape", r"block shape|divisible by 8 and 128|BlockSpec|last two dimensions"),
        ("unsupported_primitive", r"Unimplemented primitive|not implemented|NotImplementedError|"
                                  r"Unsupported (op|primitive|operation)|failed to legalize|no lowering"),
        ("out_of_bounds", r"out[- ]of[- ]bounds|OutOfBounds|index .* out of range"),
        ("uninitialized_memory", r"uninitiali[sz]ed"),
        ("shape_mismatch", r"shape mismatch|incompatible shapes|shapes? .* (do not|don't) match|"
                           r"must have (the )?same shape"),
        ("dtype_mismatch", r"dtype mismatch|incompatible dtype|requires .* dtype"),
        ("tracer_error", r"ConcretizationTypeError|TracerBoolConversionError|TracerArrayConversionError|"
                         r"TracerIntegerConversionError"),
        ("mosaic_error", r"Mosaic|MLIR"),
    ))

_SNAKE = re.compile(r"(?<!^)(?=[A-Z])")


def classify_text(text: str, default: str = "error") -> str:
    for kind, pattern in _PATTERNS:
        if pattern.search(text):
            return kind
    return default


def candidate_line(exc: BaseException, candidate_path: str) -> int | None:
    """The deepest line of the candidate file in the traceback, or one named in the message."""
    line = None
    tb: TracebackType | None = exc.__traceback__
    for frame in traceback.extract_tb(tb):
        if frame.filename == candidate_path:
            line = frame.lineno
    if line is None:
        text = str(exc)
        name = re.escape(candidate_path)
        found = re.findall(rf"{name}:(\d+)", text)
        if found:
            line = int(found[-1])
    cause = exc.__cause__ or exc.__context__
    if line is None and cause is not None and cause is not exc:
        return candidate_line(cause, candidate_path)
    return line


def from_exception(exc: BaseException, *, stage: str, candidate_path: str,
                   default_kind: str | None = None) -> EvalError:
    text = f"{type(exc).__name__}: {exc}"
    fallback = default_kind or _SNAKE.sub("_", type(exc).__name__).lower()
    kind = classify_text(text, fallback)
    detail = text.strip()
    if len(detail) > 4000:  # compiler errors can be huge; keep head and tail, where the useful parts are
        detail = detail[:2500] + "\n...\n" + detail[-1400:]
    return EvalError(kind=kind, detail=detail, line=candidate_line(exc, candidate_path), stage=stage)
