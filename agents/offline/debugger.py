"""The offline self-debugger: a fix for each kind of error the evaluator reports, chosen by that kind.

Pure: the failed module's source, the evaluator's error (stage and kind, read off the debugger's prompt), the
reference's output and the chip in; the fixed source and a sentence saying what was changed out. Each kind has its
repairs in order, and the first that changes the module is taken, so a second failure of the same kind moves on
to the next repair:
- a result of the wrong shape or dtype (shape_mismatch, dtype_mismatch): the kernel's result is reshaped to the
  reference's shape (its sizes written as the inputs' sizes, so the fix holds at every shape) and cast to its dtype;
- wrong values or non-finite ones (mismatch, nan): the elementwise work in f32, then an f32 accumulator, then the
  epilogue left to XLA after the kernel, then smaller blocks;
- part of the output never written (partial_output), a block the lowering refuses (block_shape, alignment) and
  everything else: smaller blocks;
- scoped VMEM overflow (vmem_oom): the limit the compiler asked for; where the compiler's own temporaries, unused,
  filled the VMEM beside a small kernel, the next declared limit with the blocks kept; else smaller blocks and a
  higher limit.
"""

from __future__ import annotations

import re
from typing import Any

from agents import tunable
from agents.offline.params import raised_vmem_limit
from agents.offline.program import Value

_ERROR = re.compile(r"rejected this candidate in the (\w+) stage \((\w+)")
# libtpu's report when its HLO temporaries, unused, took the whole VMEM beside the kernel's scoped allocation: seen
# compiling for v5e with a limit of 63-64 MiB, where 60 and 65 MiB compiled the same kernel.
_IDLE_HLO_TEMP = re.compile(r"HLO temp\s+[\d.]+[KMG] \(0\.0% utilization")
_ENTRY = re.compile(r"^def computation\(([^)]*)\):", re.MULTILINE)
BLOCKS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "BLOCK_ROWS", "BLOCK_COLS", "BLOCK_Q", "BLOCK_KV", "BLOCK_CO", "BLOCK_P")
CONFORMED = "_unconformed_computation"  # the kernel's own entry once its result is conformed


class CannotRepair(Exception):
    """No repair of this kind is left for the module; the message says what was tried."""


def error_of(prompt: str) -> tuple[str, str]:
    """(stage, kind) of the error the debugger is asked to fix (the first one in its prompt)."""
    found = _ERROR.search(prompt)
    return (found.group(1), found.group(2)) if found else ("", "")


def _size_expr(size: int, inputs: list[Value], names: list[str]) -> str:
    """A size as the first input dimension that has it (so the fix holds at every shape), else the number."""
    for i, value in enumerate(inputs[:len(names)]):
        for j, d in enumerate(value.shape):
            if d == size and size != 1:
                return f"{names[i]}.shape[{j}]"
    return str(size)


def conform(code: str, output: Value, inputs: list[Value]) -> str:
    """The module with its result reshaped and cast to the reference's (sizes as the inputs' where they match)."""
    entry = _ENTRY.search(code)
    if entry is None or CONFORMED in code:
        raise CannotRepair("the kernel's result is already reshaped and cast to the reference's")
    args = entry.group(1)
    names = [a.strip() for a in args.split(",") if a.strip()]
    shape = "(" + "".join(f"{_size_expr(d, inputs, names)}, " for d in output.shape) + ")"
    renamed = code[:entry.start()] + f"def {CONFORMED}({args}):" + code[entry.end():]
    return renamed.rstrip("\n") + f'''


def computation({args}):
    """The kernel's result in the reference's shape {list(output.shape)} and dtype {output.dtype} (a self-debugger
    fix: the evaluator found another shape or dtype)."""
    out = {CONFORMED}({", ".join(names)})
    return jnp.reshape(out, {shape}).astype(jnp.{output.dtype})
'''


def _with(code: str, params: dict[str, Any], space: dict[str, tuple[Any, ...]], key: str, value: Any
          ) -> str | None:
    if key in space and value in space[key] and params.get(key) != value:
        return tunable.with_params(code, {**params, key: value})
    return None


def _smaller(code: str, params: dict[str, Any], space: dict[str, tuple[Any, ...]]) -> str | None:
    moved = tunable.step(params, space, BLOCKS, -1) if space else None
    if moved is None:
        return None
    bigger = tunable.step(moved, space, ("VMEM_LIMIT_BYTES",), +1)
    return tunable.with_params(code, bigger or moved)


def _next_limit(code: str, params: dict[str, Any], space: dict[str, tuple[Any, ...]], prompt: str,
                vmem_bytes: int) -> str | None:
    """The next declared VMEM limit up within the chip (else down), the blocks kept, when the compiler's report
    says its idle temporaries filled the VMEM; None otherwise."""
    if not _IDLE_HLO_TEMP.search(prompt):
        return None
    up = tunable.step(params, space, ("VMEM_LIMIT_BYTES",), +1)
    if up is not None and up["VMEM_LIMIT_BYTES"] <= vmem_bytes:
        return tunable.with_params(code, up)
    down = tunable.step(params, space, ("VMEM_LIMIT_BYTES",), -1)
    return tunable.with_params(code, down) if down is not None else None


def repair(code: str, prompt: str, output: Value, inputs: list[Value], vmem_bytes: int) -> tuple[str, str]:
    """The fixed module and what was changed, for the error the prompt reports (CannotRepair when none is left)."""
    stage, kind = error_of(prompt)
    space = tunable.space(code)
    params = tunable.current(code) if space else {}
    tries: list[tuple[str, Any]] = []
    if kind == "vmem_oom":
        raised = raised_vmem_limit(params, space, prompt, vmem_bytes)
        tries += [("the scoped VMEM limit raised to what the compiler asked for",
                   lambda: tunable.with_params(code, raised) if raised else None),
                  ("the next declared VMEM limit, the blocks kept (the compiler's idle temporaries filled the VMEM)",
                   lambda: _next_limit(code, params, space, prompt, vmem_bytes))]
    elif kind in ("shape_mismatch", "dtype_mismatch"):
        tries.append((f"the result reshaped to {list(output.shape)} and cast to {output.dtype}, as the reference's",
                      lambda: conform(code, output, inputs)))
    elif kind in ("mismatch", "nan"):
        tries += [("the elementwise work computed in f32",
                   lambda: _with(code, params, space, "ELEMENTWISE_DTYPES", "float32")),
                  ("the running sum kept in f32", lambda: _with(code, params, space, "ACC_DTYPE", "float32")),
                  ("the epilogue left to XLA after the kernel",
                   lambda: _with(code, params, space, "FUSE_EPILOGUE", False))]
    tries.append(("smaller blocks", lambda: _smaller(code, params, space)))
    for what, attempt in tries:
        try:
            fixed = attempt()
        except CannotRepair:
            continue
        if fixed is not None and fixed != code:
            return fixed, f"For the {stage or 'evaluation'} error ({kind or 'unknown'}): {what}."
    raise CannotRepair(f"the offline brain has no repair left for this kernel's {kind or 'error'} "
                       f"(tried: {', '.join(what for what, _ in tries)})")
