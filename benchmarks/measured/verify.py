"""Check the measured suite against the facts it was written from: shapes, dtypes, static values and XLA's FLOPs.

For every task directory here whose name is a workload of the measured CSV (by default
/work/shared/data/tpu-v6e-xla-measured.csv, or --csv), in a fresh child process each (so that each compile's
peak memory is its own), one at a time (some take a minute and several GB):

1. loads `reference.py` with importlib and traces `get_inputs()` with `jax.eval_shape` (nothing is materialised);
2. checks the dynamic inputs' dtypes and shapes and the static values (and their int/float kinds) against the
   CSV row, and the output shape of `computation` (traced abstractly) against the row's output_shape;
3. compiles the reference ahead of time for one TPU v6e chip with libtpu (no TPU needed) and reads XLA's
   `cost_analysis()["flops"]`, printed against the CSV's xla_flops with the ratio.

The CSV's FLOPs come from JAX 0.6.2's compiler. This project's newer libtpu differs in two ways that show in the
ratio: it computes bf16 elementwise math in f32 and counts the converts it inserts as FLOPs (the "float type
correction"), so the elementwise part of a program counts about twice what it did (ratios from 1.0 to 1.04, the
most where the elementwise work is a large share: the attention softmax, the small-channel convolutions); and it
rewrites some softmax-then-matmul chains into its own `online-softmax` custom call, whose FLOPs cost analysis
does not count (5p_Flex_Attention: ratio 0.5). To compare FLOP for FLOP, run the children with JAX 0.6.2:

    python3.13 -m venv /tmp/jax062 && /tmp/jax062/bin/pip install "jax[tpu]==0.6.2"
    .venv/bin/python benchmarks/measured/verify.py --python /tmp/jax062/bin/python

(JAX 0.6.2's libtpu aborts in cost_analysis() without a TPU, so there the compiled program's optimised HLO is
cost-analysed by XLA's HloCostAnalysis on a CPU client instead, which reproduces the CSV's numbers.)

    .venv/bin/python benchmarks/measured/verify.py [--only NAME,NAME] [--python PATH] [--json]

The printed table: workload, operation class, CSV FLOPs, compiled FLOPs, their ratio and difference, the
compile's seconds, the child's peak RSS (up to the end of the compile), and the compiled program's temporary
buffers on the TPU (memory_analysis). The TPU environment variables (JAX_PLATFORMS=cpu, TPU_ACCELERATOR_TYPE=v6e-1,
...) are set for the children by this script. It exits non-zero when a task fails to compile or does not match its
row's shapes, dtypes or statics.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_CSV = HERE.parents[2] / "shared" / "data" / "tpu-v6e-xla-measured.csv"
TOPOLOGY = "v6e=1x1"
TPU_ENV = {
    "JAX_PLATFORMS": "cpu",
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_ACCELERATOR_TYPE": "v6e-1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_WORKER_ID": "0",
}
_ARRAY = re.compile(r"^(\w+)\[([\d,]*)\]$")


def parse_array(text: str) -> tuple[str, tuple[int, ...]]:
    """'bfloat16[4096,8192]' -> ('bfloat16', (4096, 8192)); 'x[]' -> ('x', ()), a scalar."""
    m = _ARRAY.match(text.strip())
    if m is None:
        raise ValueError(f"not a dtype[shape]: {text!r}")
    return m.group(1), tuple(int(d) for d in m.group(2).split(",") if d)


def parse_static(text: str) -> list[int | float]:
    """'2 1 4 1e-05 1.0' -> [2, 1, 4, 1e-05, 1.0]: ints where the text is an integer, floats otherwise."""
    return [int(tok) if re.fullmatch(r"[+-]?\d+", tok) else float(tok) for tok in text.split()]


def read_csv(path: Path) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            rows[row["workload"]] = {
                "inputs": [parse_array(t) for t in row["inputs"].split()],
                "static": parse_static(row["static_args"]),
                "output": parse_array("x" + row["output_shape"])[1],
                "xla_flops": float(row["xla_flops"]),
                "measured_ms": float(row["measured_median_ms"]),
            }
    return rows


def workload_order(name: str) -> tuple[int, str]:
    m = re.match(r"\d+", name)
    return (int(m.group(0)) if m else 0, name)


def operation_class(task_dir: Path) -> str:
    path = task_dir / "kernel_task.yaml"
    m = re.search(r"^operation_class:\s*(\S+)", path.read_text(), re.M) if path.is_file() else None
    return m.group(1) if m else "?"


def load_reference(task_dir: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"measured_{task_dir.name}", task_dir / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cost_of(compiled: Any) -> dict[str, float]:
    """XLA's cost analysis of a compiled TPU program (on old JAX: its optimised HLO, analysed on a CPU client)."""
    import jax

    if tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 7):
        cost = compiled.cost_analysis() or {}
        if isinstance(cost, list):  # older JAX returned one dict per device
            cost = cost[0] if cost else {}
        return {k: float(v) for k, v in cost.items() if isinstance(v, int | float)}
    from jax._src.lib import xla_client

    module = xla_client._xla.hlo_module_from_text(compiled.as_text())
    cost = xla_client._xla.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
    return {k: float(v) for k, v in cost.items()}


def check_one(task_dir: Path, row: dict[str, Any]) -> dict[str, Any]:
    """In this process: trace, check against the row, compile for v6e. Returns a JSON-able report."""
    import resource

    import jax
    import numpy as np
    from jax.experimental import topologies

    problems: list[str] = []
    module = load_reference(task_dir)
    statics: list[list[Any]] = []

    def dynamic_only() -> list[Any]:  # the static scalars stay Python values, not ShapeDtypeStructs
        dyn, stat = module.get_inputs()
        statics.append(list(stat))
        return list(dyn)

    dynamic = jax.eval_shape(dynamic_only)
    static = statics[0]
    got = [(np.dtype(a.dtype).name, tuple(a.shape)) for a in dynamic]
    if got != row["inputs"]:
        problems.append(f"inputs {got} != CSV {row['inputs']}")
    if len(static) != len(row["static"]) or any(
            type(a) is not type(b) or a != b for a, b in zip(static, row["static"], strict=False)):
        problems.append(f"static {static!r} != CSV {row['static']!r}")
    argnums = tuple(range(len(dynamic), len(dynamic) + len(static)))

    old_libtpu = {"chips_per_host_bounds": (1, 1, 1)} if jax.__version__.startswith("0.6") else {}
    topo = topologies.get_topology_desc(TOPOLOGY, "tpu", **old_libtpu)
    mesh = jax.sharding.Mesh(np.array(topo.devices[:1]), ("x",))
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep) for a in dynamic] + list(static)
    t0 = time.perf_counter()
    traced = jax.jit(module.computation, static_argnums=argnums).trace(*args)
    out = traced.out_info
    if tuple(out.shape) != row["output"]:
        problems.append(f"output {tuple(out.shape)} != CSV {row['output']}")
    lowered = traced.lower()
    lower_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t0
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    cost = cost_of(compiled)
    mem = compiled.memory_analysis()
    memory = {name: int(getattr(mem, name, 0) or 0) for name in
              ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
               "generated_code_size_in_bytes")} if mem else {}
    return {
        "workload": task_dir.name,
        "jax": jax.__version__,
        "output": f"{np.dtype(out.dtype).name}{list(out.shape)}",
        "flops": cost.get("flops", math.nan),
        "transcendentals": cost.get("transcendentals", math.nan),
        "bytes_accessed": cost.get("bytes accessed", math.nan),
        "lower_seconds": lower_s,
        "compile_seconds": compile_s,
        "peak_rss_mb": peak_rss_mb,
        "memory": memory,
        "problems": problems,
    }


def run_child(task_dir: Path, csv_path: Path, python: str) -> dict[str, Any]:
    """Run check_one in a fresh interpreter, so that the peak RSS it reports is this task's alone."""
    env = {**os.environ, **TPU_ENV}
    cmd = [python, str(Path(__file__).resolve()), "--child", task_dir.name, "--csv", str(csv_path)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, env=env, text=True, check=False)
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        text = proc.stderr or proc.stdout
        errors = [ln for ln in text.splitlines() if re.match(r"^\w*(Error|Exception)\b", ln)]
        return {"workload": task_dir.name, "wall_seconds": wall,
                "error": (errors or text.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]}
    report = json.loads(lines[-1])
    report["wall_seconds"] = wall
    return report


def child_main(name: str, csv_path: Path) -> None:
    print(json.dumps(check_one(HERE / name, read_csv(csv_path)[name])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    parser.add_argument("--only", default="", help="comma-separated workload names (default: all)")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter for the children, e.g. a JAX 0.6.2 venv's (default: this one)")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON instead of a table")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child, args.csv)
        return
    rows = read_csv(args.csv)
    names = [n for n in args.only.split(",") if n] or sorted(rows, key=workload_order)
    missing = [n for n in names if n not in rows or not (HERE / n / "reference.py").is_file()]
    if missing:
        sys.exit(f"not a CSV workload with a task directory here: {', '.join(missing)}")
    header = (f"{'workload':<50} {'class':<16} {'CSV flops':>11} {'compiled':>11} {'ratio':>8} {'difference':>11} "
              f"{'compile s':>9} {'peak RSS':>8} {'TPU temp':>8}  checks")
    if not args.json:
        print(header)
        print("-" * len(header), flush=True)
    reports: list[dict[str, Any]] = []
    for name in names:
        report = run_child(HERE / name, args.csv, args.python)
        report["class"] = operation_class(HERE / name)
        report["csv_flops"] = rows[name]["xla_flops"]
        reports.append(report)
        if args.json:
            continue
        if "error" in report:
            print(f"{name:<50} {report['class']:<16} {report['csv_flops']:>11.4e} failed: {report['error']}",
                  flush=True)
            continue
        ratio = report["flops"] / report["csv_flops"]
        temp_gb = report["memory"].get("temp_size_in_bytes", 0) / 1e9
        checks = "ok" if not report["problems"] else "; ".join(report["problems"])
        diff = report["flops"] - report["csv_flops"]
        print(f"{name:<50} {report['class']:<16} {report['csv_flops']:>11.4e} {report['flops']:>11.4e} "
              f"{ratio:>8.5f} {diff:>+11.3e} {report['compile_seconds']:>9.1f} "
              f"{report['peak_rss_mb'] / 1024:>6.2f}GB {temp_gb:>6.2f}GB  {checks}", flush=True)
    if args.json:
        print(json.dumps(reports, indent=2))
    bad = [r["workload"] for r in reports if "error" in r or r.get("problems")]
    if bad:
        sys.exit(f"{len(bad)} task(s) failed or do not match the CSV: {', '.join(bad)}")


if __name__ == "__main__":
    main()
