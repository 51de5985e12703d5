"""How far the evaluator's time estimate is from real TPU times.

For each task of the measured suite (`benchmarks/measured/`, XLA's device time on TPU v6e beside each task), the
reference is compiled for v6e exactly as an evaluation does it (libtpu, static profile, the HLO summary) and its
time is estimated by the evaluator's model (`tpu_runner.timing.model`). Printed: the estimate against the
measurement and their ratio per workload, then a summary over all and by operation class: the share within
0.8-1.25x, the geometric mean ratio, the worst cases. The same run prints the previous model's figures (the
whole program's static cycles against its bytes at bandwidth, no calibration) as the baseline.

With `--measured-log FILE` (what `benchmarks/on_chip.py --log` appended on a TPU host), the measurements are that
log's: the reference's (XLA's) measured device time of each task of both suites on the log's chip, estimated for
that chip (`--target` follows the log). That is how a chip's own factors are fitted (`fit_timing_model.py`).

Then the Pallas side: the published Pallas TPU matmul guide's measured table (v5e, bf16, block sizes against
time) against the estimates of the same kernels (`--pallas`).

    .venv/bin/python benchmarks/estimate_fidelity.py [--only NAME,NAME] [--json] [--dump FILE] [--pallas]
    .venv/bin/python benchmarks/estimate_fidelity.py --measured-log benchmarks/on_chip_v5e.jsonl --dump FILE

A workload the static profiler aborts on, or whose profile is over its memory cap, is still estimated (the model
falls back to its per-op figures) and says so. The first run compiles every reference (several minutes; the
largest need a few GB); the compiles are cached under KERNELBOT_HOME.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from storage.settings import load_settings  # noqa: E402
from tpu_runner.compiler import CompileAnswer, compile_service  # noqa: E402
from tpu_runner.hardware import chip_for_device_kind, get_chip  # noqa: E402
from tpu_runner.reference import reference_store  # noqa: E402
from tpu_runner.tasks import load_task  # noqa: E402
from tpu_runner.timing import programs_time, static_profile_time  # noqa: E402

SUITE = Path(__file__).resolve().parent / "measured"
SUITES = {"measured": SUITE, "tasks": SUITE.parent.parent / "tasks"}  # as benchmarks/on_chip.py names them
WITHIN = (0.8, 1.25)


@dataclass
class Row:
    workload: str
    op_class: str
    measured_ms: float
    estimated_ms: float
    baseline_ms: float | None  # the previous model's figure (None: it could not estimate)
    how: str

    @property
    def ratio(self) -> float:
        return self.estimated_ms / self.measured_ms


def measured_tasks(only: set[str] | None) -> list[tuple[Path, dict]]:
    out = []
    for path in sorted(SUITE.iterdir()):
        meta_path = path / "kernel_task.yaml"
        if not meta_path.is_file() or (only and path.name not in only):
            continue
        meta = yaml.safe_load(meta_path.read_text())
        if meta.get("measured"):
            out.append((path, meta))
    return out


def logged_tasks(log: Path, only: set[str] | None) -> tuple[str, list[tuple[Path, dict]]]:
    """The tasks an on-chip log measured the reference of (the last entry of each), as (directory, metadata with
    `measured.xla_ms` the log's reference time), and the chip they were measured on."""
    last: dict[tuple[str, str], dict] = {}
    for line in log.read_text().splitlines():
        if line.strip():
            entry = json.loads(line)
            last[(entry["suite"], entry["task"])] = entry
    kinds = {e["device"] for e in last.values() if e.get("reference_ms")}
    if len(kinds) != 1:
        raise SystemExit(f"{log}: expected measurements from one chip, found {sorted(kinds) or 'none'}")
    chip = chip_for_device_kind(kinds.pop())
    if chip is None:
        raise SystemExit(f"{log}: no target has that device kind")
    out = []
    for (suite, name), entry in sorted(last.items()):
        if entry.get("reference_ms") and (not only or name in only):
            path = SUITES[suite] / name
            meta_path = path / "kernel_task.yaml"
            meta = yaml.safe_load(meta_path.read_text()) if meta_path.is_file() else {}
            out.append((path, {**meta, "measured": {"xla_ms": entry["reference_ms"]}}))
    return chip.name, out


def summary(rows: list[Row], figure: str) -> dict[str, float]:
    ratios = [getattr(r, figure) / r.measured_ms for r in rows if getattr(r, figure)]
    if not ratios:
        return {"n": 0, "within": 0.0, "geomean": float("nan"), "worst": float("nan")}
    within = sum(WITHIN[0] <= x <= WITHIN[1] for x in ratios) / len(rows)
    geomean = math.exp(statistics.fmean(math.log(x) for x in ratios))
    worst = max(ratios, key=lambda x: abs(math.log(x)))
    return {"n": len(ratios), "within": within, "geomean": geomean, "worst": worst}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated workload names")
    parser.add_argument("--json", action="store_true", help="print the rows and summaries as JSON")
    parser.add_argument("--dump", type=Path, help="write each workload's compiler figures (HLO ops, static "
                        "cycles) to this JSON file, for fitting the model")
    parser.add_argument("--target", default="v6e")
    parser.add_argument("--pallas", action="store_true", help="only the Pallas matmul guide's measurements")
    parser.add_argument("--measured-log", type=Path, help="measurements from an on-chip log (benchmarks/on_chip.py "
                        "--log) instead of the measured suite's v6e times; the target is the log's chip")
    args = parser.parse_args()
    if args.pallas:
        pallas_fidelity(as_json=args.json)
        return
    only = {n for n in args.only.split(",") if n} or None
    if args.measured_log:
        target, workloads = logged_tasks(args.measured_log, only)
    else:
        target, workloads = args.target, measured_tasks(only)
    settings = load_settings()
    chip = get_chip(target)
    store = reference_store(settings)
    rows: list[Row] = []
    dump: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="fidelity-") as tmp, compile_service(
            root=Path(tmp), limits=settings.limits, static_profile=settings.static_profile) as compilers:
        for path, meta in workloads:
            task = load_task(path)
            print(f"... {task.task_id}", file=sys.stderr, flush=True)
            answers: list[CompileAnswer] = store.costs(task, target=chip.name, mode=settings.static_profile,
                                                       compilers=compilers)
            timed = programs_time(chip, answers, mode=settings.static_profile)
            baseline = static_profile_time(chip, answers, mode=settings.static_profile)
            rows.append(Row(task.task_id, meta.get("operation_class", "?"), float(meta["measured"]["xla_ms"]),
                            timed.seconds * 1e3, baseline * 1e3 if baseline else None, timed.how))
            dump[task.task_id] = {"target": chip.name, "measured_from": str(args.measured_log or SUITE.name),
                                  "class": meta.get("operation_class"),
                                  "measured_ms": meta["measured"]["xla_ms"],
                                  "answers": [{**asdict(a), "error": None} for a in answers]}
    if args.dump:
        args.dump.write_text(json.dumps(dump))
    by_class = sorted({r.op_class for r in rows})
    report = {"rows": [{**asdict(r), "ratio": r.ratio} for r in rows],
              "summary": {"model": summary(rows, "estimated_ms"), "baseline": summary(rows, "baseline_ms")},
              "by_class": {c: {"model": summary([r for r in rows if r.op_class == c], "estimated_ms"),
                               "baseline": summary([r for r in rows if r.op_class == c], "baseline_ms")}
                           for c in by_class}}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{'workload':<52} {'class':<17} {'measured':>9} {'estimate':>9} {'ratio':>6} {'baseline':>9} {'ratio':>6}")
    for r in rows:
        base = f"{r.baseline_ms:9.4g} {r.baseline_ms / r.measured_ms:6.2f}" if r.baseline_ms else f"{'-':>9} {'-':>6}"
        print(f"{r.workload:<52} {r.op_class:<17} {r.measured_ms:9.4g} {r.estimated_ms:9.4g} {r.ratio:6.2f} {base}"
              f"  {r.how}")
    print()
    print(f"{'':<24} {'n':>3} {'within 0.8-1.25':>16} {'geomean':>8} {'worst':>6}   (baseline: n within geomean worst)")
    for name, entry in [("all", report["summary"]), *report["by_class"].items()]:
        m, b = entry["model"], entry["baseline"]
        print(f"{name:<24} {m['n']:>3} {m['within']:>16.0%} {m['geomean']:>8.3g} {m['worst']:>6.3g}   "
              f"({b['n']} {b['within']:.0%} {b['geomean']:.3g} {b['worst']:.3g})")


# -- Pallas kernels against the Pallas TPU matmul guide's measurements -----------------------------------------
GUIDE = Path(__file__).resolve().parent / "pallas_matmul_guide.json"
# The guide times each call from Python (timeit of block_until_ready): XLA's 1024^3 bf16 matmul, 2.1 GFLOP
# (11 us at the v5e peak), took 0.119 ms there. Rows that fast are dispatch, not kernel.
DISPATCH_MS = 0.1


def guide_matmul(bm: int, bk: int, bn: int, fused: str | None):
    """A blocked matmul as the guide's table describes it (f32 accumulator in VMEM, k innermost); written here."""
    import functools

    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(x_ref, y_ref, o_ref, acc_ref, *, steps: int):
        @pl.when(pl.program_id(2) == 0)
        def _():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        y = y_ref[...]
        if fused == "transpose_rhs":
            acc_ref[...] += jax.lax.dot_general(x_ref[...], y, (((1,), (1,)), ((), ())),
                                                preferred_element_type=jnp.float32)
        else:
            acc_ref[...] += jnp.dot(x_ref[...], y, preferred_element_type=jnp.float32)

        @pl.when(pl.program_id(2) == steps - 1)
        def _():
            out = acc_ref[...]
            o_ref[...] = (jnp.maximum(out, 0) if fused == "relu" else out).astype(o_ref.dtype)

    def matmul(x, y):
        m, k = x.shape
        n = y.shape[0] if fused == "transpose_rhs" else y.shape[1]
        y_spec = (pl.BlockSpec((bn, bk), lambda i, j, kk: (j, kk)) if fused == "transpose_rhs"
                  else pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)))
        return pl.pallas_call(
            functools.partial(kernel, steps=k // bk), grid=(m // bm, n // bn, k // bk),
            in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)), y_spec],
            out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
            out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
            compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        )(x, y)

    return matmul


def _export(fn, shapes: list[tuple[int, ...]], chip, workdir: Path, name: str):
    """(exported program path, Pallas traffic) of fn at bf16 inputs of these shapes, traced for the target."""
    import jax
    import jax.numpy as jnp

    from tpu_runner.analysis import pallas_traffic
    from tpu_runner.candidate import target_context

    args = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in shapes]
    with target_context(chip, False):
        traffic = pallas_traffic(jax.make_jaxpr(fn)(*args))
        exported = jax.export.export(jax.jit(fn), platforms=["tpu"])(*args)
    path = workdir / f"{name}.exported"
    path.write_bytes(exported.serialize())
    return path, traffic


def pallas_fidelity(as_json: bool) -> None:
    import jax
    import jax.numpy as jnp

    from tpu_runner.timing import grid_steps

    jax.config.update("jax_export_ignore_forward_compatibility", True)
    guide = json.loads(GUIDE.read_text())
    chip = get_chip(guide["chip"])
    settings = load_settings()
    rows = []
    with tempfile.TemporaryDirectory(prefix="fidelity-pallas-") as tmp, compile_service(
            root=Path(tmp), limits=settings.limits, static_profile=settings.static_profile) as compilers:
        xla_done: dict[int, float] = {}
        for row in guide["rows"]:
            m, k, n = row["m"], row["k"], row["n"]
            shapes = [(m, k), (n, k) if row["fused"] == "transpose_rhs" else (k, n)]
            label = f"{m}^3 {row['bm']}/{row['bk']}/{row['bn']} {row['fused'] or 'plain'}"
            print(f"... {label}", file=sys.stderr, flush=True)
            path, traffic = _export(guide_matmul(row["bm"], row["bk"], row["bn"], row["fused"]), shapes, chip,
                                    Path(tmp), f"pallas{len(rows)}")
            answer = compilers.compile(path, target=chip.name)
            timed = programs_time(chip, [answer], mode=settings.static_profile,
                                  kernel_bytes=[float(traffic.total_hbm_bytes)], kernel_flops=[2.0 * m * k * n],
                                  kernel_steps=[grid_steps(traffic)])
            if row["xla_ms"] is not None and m not in xla_done:
                xla_path, _ = _export(jnp.matmul, shapes, chip, Path(tmp), f"xla{m}")
                xla_done[m] = programs_time(chip, [compilers.compile(xla_path, target=chip.name)],
                                            mode=settings.static_profile).seconds * 1e3
            rows.append({"kernel": label, "measured_ms": row["pallas_ms"], "estimated_ms": timed.seconds * 1e3,
                         "ratio": timed.seconds * 1e3 / row["pallas_ms"], "how": timed.how,
                         "xla_measured_ms": row["xla_ms"], "xla_estimated_ms": xla_done.get(m) if row["xla_ms"]
                         else None})
    if as_json:
        print(json.dumps({"source": guide["source"], "chip": guide["chip"], "rows": rows}, indent=2))
        return
    print(f"Pallas matmul guide ({guide['chip']}): {guide['source']}")
    print(f"{'kernel':<32} {'measured':>9} {'estimate':>9} {'ratio':>6}   {'XLA meas.':>9} {'XLA est.':>9}")
    for r in rows:
        xla = (f"{r['xla_measured_ms']:9.4g} {r['xla_estimated_ms']:9.4g}" if r["xla_measured_ms"] else "")
        print(f"{r['kernel']:<32} {r['measured_ms']:9.4g} {r['estimated_ms']:9.4g} {r['ratio']:6.2f}   {xla}")
    timed = [r for r in rows if r["measured_ms"] >= 3 * DISPATCH_MS]
    ratios = [r["ratio"] for r in timed]
    within = sum(WITHIN[0] <= x <= WITHIN[1] for x in ratios)
    print(f"within 0.8-1.25x: {within}/{len(timed)}; geomean {math.exp(statistics.fmean(map(math.log, ratios))):.3g}"
          f" (rows under {3 * DISPATCH_MS:g} ms left out: the guide's timing includes ~{DISPATCH_MS:g} ms of Python "
          "dispatch per call)")
    for r in timed:
        if r["xla_measured_ms"] and r["xla_estimated_ms"]:
            print(f"  {r['kernel']}: Pallas vs XLA measured x{r['xla_measured_ms'] / r['measured_ms']:.2f}, "
                  f"estimated x{r['xla_estimated_ms'] / r['estimated_ms']:.2f}")


if __name__ == "__main__":
    main()
