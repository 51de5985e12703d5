"""Fit the timing model's factors (`tpu_runner/timing/calibration.py`) on measured TPU times.

Input: the compiler's figures for each measured workload, written by
`benchmarks/estimate_fidelity.py --dump FILE`. For each (source, operation class) pair that carries time in
the measured programs, a factor on that source's compute time is fitted by minimising the squared log ratio of
estimated to measured time over all workloads (coordinate descent on a log grid, with a mild pull towards 1 so
that a class seen in one workload is not bent to it alone). Printed: the factors, the fit's fidelity, the
leave-one-out fidelity (each workload estimated with factors fitted without it: what to expect on workloads
the fit has not seen), and the bands per class from the leave-one-out ratios. For v6e (the measured suite's
times), paste the printed `FACTORS` and `BANDS` into calibration.py; for a chip measured by an on-chip log,
`--write` keeps them as that chip's data (`tpu_runner/timing/fitted/<target>.json`, with the fit's figures),
which estimates for that chip then use.

    .venv/bin/python benchmarks/fit_timing_model.py /tmp/fidelity-dump.json
    .venv/bin/python benchmarks/estimate_fidelity.py --measured-log benchmarks/on_chip_v5e.jsonl --dump /tmp/v5e.json
    .venv/bin/python benchmarks/fit_timing_model.py /tmp/v5e.json --write
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tpu_runner.compiler import CompileAnswer  # noqa: E402
from tpu_runner.hardware import get_chip  # noqa: E402
from tpu_runner.timing import UNCALIBRATED, calibration  # noqa: E402
from tpu_runner.timing import model as timing_model

GRID = [math.exp(x / 40) for x in range(-60, 61)]  # 0.22x .. 4.5x, 2.5% steps
PULL = 0.02  # weight of log(factor)^2 against one workload's log ratio^2
ROUNDS = 6


def unit_times(chip, answers: list[CompileAnswer]) -> list[timing_model.OpTime]:
    """Each op's time with every factor 1 (factors are applied afterwards, so the fit never recompiles)."""
    return list(timing_model.programs_time(chip, answers, mode="fast", calibration=UNCALIBRATED).ops)


HBM = ("hbm", "efficiency")  # the fitted share of the HBM bandwidth, a factor on every op's memory time too


def _scaled(op: timing_model.OpTime, factors: dict[tuple[str, str], float]) -> timing_model.OpTime:
    return replace(op, compute_seconds=op.compute_seconds * factors.get((op.source, op.op_class), 1.0),
                   memory_seconds=op.memory_seconds / factors.get(HBM, 1.0))


def total(ops: list[timing_model.OpTime], factors: dict[tuple[str, str], float]) -> float:
    return sum(_scaled(op, factors).seconds for op in ops)


def loss(data: dict[str, tuple[list, float]], factors: dict[tuple[str, str], float]) -> float:
    err = sum(math.log(total(ops, factors) / measured) ** 2 for ops, measured in data.values())
    return err + PULL * sum(math.log(f) ** 2 for f in factors.values())


def fit(data: dict[str, tuple[list, float]], keys: list[tuple[str, str]]) -> dict[tuple[str, str], float]:
    factors = {k: 1.0 for k in keys}
    for _ in range(ROUNDS):
        for key in keys:
            grid = [g for g in GRID if g <= 1.0] if key == HBM else GRID  # no op beats the HBM's peak
            factors[key] = min(grid, key=lambda f: loss(data, {**factors, key: f}))
    return factors


def dominant(ops: list[timing_model.OpTime], factors: dict[tuple[str, str], float]) -> str:
    by: dict[str, float] = {}
    for op in ops:
        t = _scaled(op, factors).seconds
        by[op.op_class] = by.get(op.op_class, 0.0) + t
    return max(by, key=lambda k: by[k])


def describe(ratios: list[float]) -> str:
    within = sum(0.8 <= r <= 1.25 for r in ratios)
    gm = math.exp(statistics.fmean(math.log(r) for r in ratios))
    return f"{within}/{len(ratios)} within 0.8-1.25x, geomean {gm:.3f}, range {min(ratios):.2f}-{max(ratios):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dump", type=Path)
    parser.add_argument("--target", help="the chip the times were measured on (default: the dump's, else v6e)")
    parser.add_argument("--write", action="store_true", help="keep the fit as the chip's own calibration data")
    args = parser.parse_args()
    raw = json.loads(args.dump.read_text())
    target = args.target or next((w["target"] for w in raw.values() if w.get("target")), "v6e")
    chip = get_chip(target)
    data = {name: (unit_times(chip, [CompileAnswer.from_json(a) for a in w["answers"]]), w["measured_ms"] / 1e3)
            for name, w in raw.items()}
    share: dict[tuple[str, str], float] = {}
    for ops, measured in data.values():
        for op in ops:
            if op.compute_seconds > op.memory_seconds and op.seconds > 0:
                share[(op.source, op.op_class)] = share.get((op.source, op.op_class), 0.0) + op.seconds / measured
    keys = [*sorted(k for k, v in share.items() if v > 0.05), HBM]  # pairs that carry time somewhere
    factors = fit(data, keys)
    fidelity = {"before": describe([total(ops, {}) / m for ops, m in data.values()]),
                "fitted": describe([total(ops, factors) / m for ops, m in data.values()])}
    held_out: dict[str, float] = {}
    for name in data:
        rest = {n: v for n, v in data.items() if n != name}
        ops, measured = data[name]
        held_out[name] = total(ops, fit(rest, keys)) / measured
    fidelity["leave-one-out"] = describe(list(held_out.values()))
    print(f"{len(data)} workloads measured on {target}")
    for label, text in fidelity.items():
        print(f"{label}: {text}")
    for name, r in sorted(held_out.items(), key=lambda kv: kv[1]):
        print(f"  {name:<52} {r:5.2f}  ({dominant(data[name][0], factors)})")
    by_class: dict[str, list[float]] = {}
    for name, r in held_out.items():
        by_class.setdefault(dominant(data[name][0], factors), []).append(1.0 / r)  # true / estimated
    bands, default_band = class_bands(by_class)
    print("FACTORS = {")
    for key in keys[:-1]:
        print(f"    {key!r}: {factors[key]:.3f},")
    print(f"}}\nHBM_EFFICIENCY = {factors[HBM]:.3f}")
    print("BANDS = {")
    for cls, band in bands.items():
        print(f"    {cls!r}: {band},  # {len(by_class[cls])} workloads")
    print(f"}}\nDEFAULT_BAND = {default_band}")
    if args.write:
        path = calibration.FITTED / f"{target}.json"
        path.parent.mkdir(exist_ok=True)
        kept = json.loads(path.read_text()).get("kernel") if path.is_file() else None  # fit_kernel_model.py's
        path.write_text(json.dumps({
            **({"kernel": kept} if kept else {}),
            "target": target, "workloads": len(data), "fidelity": fidelity,
            "measured_from": sorted({w.get("measured_from", "?") for w in raw.values()}),
            "made_by": "benchmarks/estimate_fidelity.py --measured-log LOG --dump D; "
                       "benchmarks/fit_timing_model.py D --write",
            "factors": {f"{s}/{c}": round(factors[(s, c)], 3) for s, c in keys[:-1]},
            "hbm_efficiency": round(factors[HBM], 3), "bands": bands, "default_band": default_band,
            "held_out": {name: round(r, 3) for name, r in sorted(held_out.items())},
        }, indent=1) + "\n")
        print(f"wrote {path}")


def class_bands(by_class: dict[str, list[float]]) -> tuple[dict[str, tuple[float, float]], tuple[float, float]]:
    """Each class's band from its workloads' leave-one-out true / estimated times, and the band of all of them."""
    everything = sorted(t for trues in by_class.values() for t in trues)
    # A class seen in fewer than 3 workloads says little about its own spread: it gets everything's.
    bands = {cls: _band(sorted(trues) if len(trues) >= MIN_CLASS_WORKLOADS else everything)
             for cls, trues in sorted(by_class.items())}
    return bands, _band(everything)


MIN_CLASS_WORKLOADS = 3


def _band(trues: list[float]) -> tuple[float, float]:
    """The 10th and 90th percentiles of true / estimated time, and at least +-10%, rounded outwards (so the
    workloads at a percentile stay inside it: many kernels' times sit within 1% of each other)."""
    lo = min(0.9, trues[int(0.1 * (len(trues) - 1))])
    hi = max(1.1, trues[math.ceil(0.9 * (len(trues) - 1))])
    return math.floor(lo * 100) / 100, math.ceil(hi * 100) / 100


if __name__ == "__main__":
    main()
