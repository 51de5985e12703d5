"""Turn exceptions from JAX, Pallas, Mosaic and XLA into structured errors with the candidate's line."""

from __future__ import annotations

import re
import traceback
from types import TracebackType

from tpu_runner.reports.result import EvalError

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


def _raised_at(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    return f" raised at {frames[-1].filename}:{frames[-1].lineno} ({frames[-1].name})" if frames else ""


def from_exception(exc: BaseException, *, stage: str, candidate_path: str,
                   default_kind: str | None = None) -> EvalError:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else f"{type(exc).__name__} (no message){_raised_at(exc)}"
    fallback = default_kind or _SNAKE.sub("_", type(exc).__name__).lower()
    kind = classify_text(text, fallback)
    detail = text.strip()
    if len(detail) > 4000:  # compiler errors can be huge; keep head and tail, where the useful parts are
        detail = detail[:2500] + "\n...\n" + detail[-1400:]
    return EvalError(kind=kind, detail=detail, line=candidate_line(exc, candidate_path), stage=stage)


# Where Pallas's TPU interpret mode lives: an internal error raised there, on a construct it cannot simulate, is
# the simulator's limit, not the kernel's bug (on a TPU the kernel would simply run).
_INTERPRETER_FILES = ("jax/_src/pallas/mosaic/interpret", "jax/_src/pallas/primitives.py",
                      "jax/_src/pallas/mosaic/primitives.py", "jax/_src/state/discharge.py")
_INTERNAL_ERRORS = (AttributeError, NotImplementedError, TypeError, KeyError)


_CALLBACK_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_CALLBACK_ERROR = re.compile(r"^(\w+Error|\w+Exception): (.*)$", re.MULTILINE)


def interpreter_limitation(exc: BaseException) -> str | None:
    """A one-line description when `exc` is interpret mode failing on its own internals, else None.

    The simulator runs kernel bodies through host callbacks, so its own errors often arrive as a runtime error
    whose message carries the callback's traceback as text; both forms are read."""
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, _INTERNAL_ERRORS) and frames:
        where, name, text = (frames[-1].filename, frames[-1].lineno), type(exc).__name__, str(exc)
    else:
        message = str(exc)
        found = _CALLBACK_FRAME.findall(message)
        errors = _CALLBACK_ERROR.findall(message)
        if "CpuCallback error" not in message or not found or not errors:
            return None
        where, (name, text) = (found[-1][0], int(found[-1][1])), errors[-1]
        if name not in {e.__name__ for e in _INTERNAL_ERRORS}:
            return None
    if not any(part in where[0] for part in _INTERPRETER_FILES):
        return None
    return (f"Pallas TPU interpret mode cannot simulate this kernel ({name}: {text[:200]} in "
            f"{where[0].rsplit('site-packages/', 1)[-1]}:{where[1]}); its correctness can only be checked on a TPU")
