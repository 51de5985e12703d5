"""The offline brain's first kernel for a task and its one-step variants, timed against XLA on this host's chip.

Which single parameter matters on this chip, in one run: the brain writes its first kernel for the task and, for
every TUNABLE parameter, one kernel per other value of it (the rest as first chosen); each is timed beside the
task's XLA reference on the task's own inputs (`get_inputs`) by wall clock (the fastest of --repeat rounds of
--calls back-to-back calls), and its largest difference from the reference's output is shown. No sandbox, no
correctness cases, no estimate: what the evaluator does is in `kernelbot eval`; this is for reading a family's
parameter space on a chip quickly (on a v5e, 47 kernels of four workloads took ~8 minutes, most of it compiling).
A variant that does not compile or run says why in its row.

    .venv/bin/python benchmarks/kernel_variants.py --task benchmarks/measured/39k_Conv2d_GELU_GlobalAvgPool
                                                   [--target v5e] [--only CHUNK,BLOCK_P] [--max 40] [--kernel-alone]
                                                   [--stages] [--json FILE]

With --kernel-alone each kernel is also timed without what its wrapper does after its last pallas_call (the module
cut there, returning that call's value): the rest of its time is the XLA work after the kernel - a crop, an
interleave, a tail of the reference's last steps - which can outweigh the kernel itself (28k on a v5e: 5.8 of 29.6 ms).

With --stages each kernel is also timed up to each of its pallas_calls' outputs in turn (the module cut right after
the call): where a kernel of several calls (17p's projection, contraction and output) spends its time.

With --interpret (a host without a TPU, for trying the script itself) the kernels run in Pallas interpret mode on
the task's test inputs (`get_test_inputs`): the times then say nothing of a chip.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from agents.offline.brain import offline_brain  # noqa: E402
from agents.offline.emit import space_of  # noqa: E402
from agents.offline.params import choose  # noqa: E402
from storage.settings import load_settings  # noqa: E402
from tpu_runner.checking.correctness import interpret_mode  # noqa: E402
from tpu_runner.hardware import get_chip  # noqa: E402
from tpu_runner.tasks import concrete_configurations, import_reference, load_task, parse  # noqa: E402


def variants(first: dict[str, Any], space: dict[str, tuple[Any, ...]], only: set[str] | None
             ) -> list[tuple[str, dict[str, Any]]]:
    """The first choice, then each other value of each parameter (of `only`, when given) with the rest kept."""
    out = [("first", dict(first))]
    for key, values in space.items():
        if key not in first or (only and key not in only):
            continue
        out += [(f"{key}={value}", {**first, key: value}) for value in values if value != first[key]]
    return out


def cut_after_kernel(source: str, which: int = -1) -> str | None:
    """The module with `computation` returning a pallas_call's value right after the call: the last one, or the
    `which`-th in the source's order (None when there is no such `name = pl.pallas_call(...)(...)`)."""
    tree = parse(source)
    computation = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "computation"), None)
    if computation is None:
        return None

    def is_kernel_call(node: ast.AST) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Call)
                and ast.unparse(node.func.func) in ("pl.pallas_call", "pallas_call"))

    def named(target: ast.expr) -> bool:  # `out = ...` or `left, right = ...`
        return isinstance(target, ast.Name) or (isinstance(target, ast.Tuple)
                                                 and all(isinstance(e, ast.Name) for e in target.elts))

    calls = [n for n in ast.walk(computation) if isinstance(n, ast.Assign) and len(n.targets) == 1
             and named(n.targets[0]) and is_kernel_call(n.value)]
    calls.sort(key=lambda n: n.end_lineno or 0)
    if not -len(calls) <= which < len(calls):
        return None
    last = calls[which]
    lines = source.splitlines(keepends=True)
    indent = " " * last.col_offset
    assert last.end_lineno is not None
    value = ast.unparse(last.targets[0])
    return "".join(lines[:last.end_lineno] + [f"{indent}return {value}\n"] + lines[last.end_lineno:])


def fastest_ms(fn: Any, args: list[Any], calls: int, repeat: int) -> tuple[float, Any]:
    """The fastest of `repeat` rounds of `calls` back-to-back calls, per call, after one warm-up call."""
    out = jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e3, out


def _load(source: str, folder: Path, name: str) -> Any:
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _max_diff(got: Any, want: Any) -> float:
    leaves = zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True)
    return max(float(np.max(np.abs(np.asarray(g, np.float32) - np.asarray(w, np.float32)))) for g, w in leaves)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", type=Path, required=True)
    parser.add_argument("--target", default="v5e", help="the chip the brain writes for (default v5e)")
    parser.add_argument("--only", help="comma-separated parameters to vary (default: all)")
    parser.add_argument("--max", type=int, default=40, help="at most this many kernels, the first included")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--interpret", action="store_true", help="no TPU: interpret mode on the test inputs")
    parser.add_argument("--kernel-alone", action="store_true",
                        help="also time each kernel without the wrapper's work after its last pallas_call")
    parser.add_argument("--stages", action="store_true",
                        help="also time each kernel up to each of its pallas_calls' outputs, in the source's order")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()

    chip = get_chip(args.target)
    task = load_task(args.task)
    with tempfile.TemporaryDirectory(prefix="kernel-variants-") as tmp:
        brain = offline_brain(task, chip, load_settings({"KERNELBOT_HOME": str(Path(tmp) / "home")}))
        assert brain.spec is not None
        first, _ = choose(brain.spec, chip)
        only = set(args.only.split(",")) if args.only else None
        kernels = variants(first, space_of(brain.spec), only)[: args.max]
        config = concrete_configurations(task, "get_test_inputs" if args.interpret else "get_inputs")[0]
        arrays = [jnp.asarray(v) for v in config.values or ()]
        reference = import_reference(task).computation
        ref_ms, want = fastest_ms(jax.jit(lambda *a: reference(*a, *config.static)), arrays, args.calls, args.repeat)
        print(f"{task.task_id} on {jax.devices()[0].device_kind}: XLA {ref_ms:.3f} ms; {len(kernels)} kernels",
              flush=True)

        def cut_ms(cut: str, name: str) -> float:
            """A module cut after one of its pallas_calls, timed as the whole kernel is."""
            head = _load(cut, Path(tmp), name)
            with interpret_mode(args.interpret):
                return fastest_ms(jax.jit(lambda *a: head.computation(*a, *config.static)), arrays, args.calls,
                                  args.repeat)[0]

        rows: list[dict[str, Any]] = []
        for k, (name, params) in enumerate(kernels):
            row: dict[str, Any] = {"variant": name, "params": params}
            try:
                source = brain.source(params)
                module = _load(source, Path(tmp), f"variant_{k}")
                run = jax.jit(lambda *a, m=module: m.computation(*a, *config.static))
                with interpret_mode(args.interpret):  # as the evaluator checks a kernel without its TPU
                    ms, got = fastest_ms(run, arrays, args.calls, args.repeat)
                row.update(ms=ms, speedup=ref_ms / ms, max_diff=_max_diff(got, want))
                alone = ""
                if args.stages:
                    row["stages_ms"] = []
                    while (cut := cut_after_kernel(source, len(row["stages_ms"]))) is not None:
                        row["stages_ms"].append(cut_ms(cut, f"variant_{k}_stage_{len(row['stages_ms'])}"))
                    alone = "  (to each pallas_call's output: " + ", ".join(f"{t:.3f}" for t in row["stages_ms"]) \
                        + " ms)"
                cut = cut_after_kernel(source) if args.kernel_alone else None
                if cut is not None:
                    row["kernel_ms"] = cut_ms(cut, f"variant_{k}_alone")
                    alone = f"  (to the kernel's output {row['kernel_ms']:.3f} ms, after it " \
                        f"{ms - row['kernel_ms']:.3f})"
                print(f"  {name:36s} {ms:9.3f} ms  x{ref_ms / ms:5.2f}  max |diff| {row['max_diff']:.3g}{alone}",
                      flush=True)
            except Exception as exc:  # noqa: BLE001 - a variant that fails is a row saying why
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                print(f"  {name:36s} failed: {row['error']}", flush=True)
            rows.append(row)
    timed = sorted((r for r in rows if "ms" in r), key=lambda r: r["ms"])
    if timed:
        best = timed[0]
        print(f"fastest: {best['variant']} {best['ms']:.3f} ms (x{best['speedup']:.2f} vs XLA {ref_ms:.3f} ms); "
              f"first {rows[0].get('ms', float('nan')):.3f} ms")
    if args.json:
        args.json.write_text(json.dumps({"task": task.task_id, "xla_ms": ref_ms, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
