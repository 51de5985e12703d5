"""Fit the timing model's figures for Pallas kernels on one chip from its measured kernels: vector rate, band.

The static profile counts a kernel's code once (a loop's body, not its trips), so a kernel whose time is elementwise
work inside a loop is estimated from its MXU FLOPs alone: 39k's convolution with its GELU, 0.45 ms estimated and
1.78 measured on a v5e. With a vector rate, a kernel takes at least the task's elementwise and reduction work (XLA's
count of its own program's elements, less what the XLA ops around the kernels do) at that many elements per cycle.
This script fits that rate on the kernels an on-chip log measured (`benchmarks/on_chip.py --log`): the rate that puts
the most kernels' estimated times within 0.8-1.25x of their measured times (ties: the smaller median error), from a
grid of quarter-octave steps, or none when no rate does better than none. Printed: each kernel's measured and
estimated time before and with the fit, the fit's and the leave-one-out fidelity (each kernel estimated with the rate
fitted without it), and the kernel band from the leave-one-out ratios (10th and 90th percentiles of measured /
estimated, at least +-10%). `--write` keeps the rate and the band in the chip's calibration data
(`tpu_runner/timing/fitted/<target>.json`, its `kernel` entry), which estimates for that chip then use.

The kernels are the offline brain's first kernels whose source digest the log measured (a kernel changed since is
left out); their estimates are made here, on this host's CPU, and kept in --estimates (made when missing; ~15
minutes on 2 cores for 31 kernels), so a refit does not evaluate again.

    .venv/bin/python benchmarks/fit_kernel_model.py --measured-log benchmarks/on_chip_v5e.jsonl --target v5e \\
                                                    --estimates /tmp/v5e-kernels.json [--write]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fit_timing_model import _band, describe  # noqa: E402

from tpu_runner.hardware import get_chip  # noqa: E402
from tpu_runner.timing import calibration  # noqa: E402
from tpu_runner.timing.model import OpTime  # noqa: E402

RATES: list[float | None] = [None, *(1024 * 2 ** (k / 4) for k in range(17))]  # none, then 1024 .. 16384
FAITHFUL = (0.8, 1.25)


def kernel_seconds(estimate: dict[str, Any], rate: float | None, clock_hz: float) -> float:
    """A candidate's estimated time with the vector rate `rate` (None: no vector floor), from its profile's record
    of what its kernels' times rest on; the rest of its program as estimated; never below its roofline."""
    cand = estimate["candidate"]
    rest = sum(s for cls, s in cand["by_class"].items() if cls != "kernel")
    kernels = sum(OpTime(op["name"], "kernel", "profile",
                         max(op["compute_before_vector"], op["vector_elements"] / (rate * clock_hz) if rate else 0.0),
                         op["memory"], op["repeat"], op["fixed"]).seconds
                  for op in cand["kernel_ops"])
    return max(rest + kernels, estimate["roofline"]["seconds"])


def ratios(data: dict[str, tuple[dict, float]], rate: float | None, clock_hz: float) -> dict[str, float]:
    """Estimated / measured time per kernel."""
    return {name: kernel_seconds(est, rate, clock_hz) / measured for name, (est, measured) in data.items()}


def fit(data: dict[str, tuple[dict, float]], clock_hz: float) -> float | None:
    def score(rate: float | None) -> tuple[int, float]:
        r = ratios(data, rate, clock_hz).values()
        within = sum(FAITHFUL[0] <= x <= FAITHFUL[1] for x in r)
        return within, -statistics.median(abs(math.log(x)) for x in r)

    return max(RATES, key=score)  # the first best: none before any rate, the smaller rate before a larger one


def estimates(log: Path, target: str, path: Path) -> dict[str, dict]:
    """name -> {"profile": the local estimate's profile, "measured_s": the chip's time of the same kernel}; made
    by evaluating each logged kernel here (estimates only: this host has no TPU) and kept in `path`."""
    if path.is_file():
        return json.loads(path.read_text())
    from on_chip import SUITES, first_kernel, kernel_digest, logged

    from storage.settings import load_settings
    from tpu_runner.evaluation import EvalRequest, evaluate_many

    chip = get_chip(target)
    home = Path(tempfile.mkdtemp(prefix="fit-kernels-"))
    settings = load_settings({"KERNELBOT_HOME": str(home)})
    requests, names, measured = [], [], {}
    for suite, root in SUITES.items():
        for name, row in logged(log, suite).items():
            if row.get("method") != "measured" or not row.get("candidate_ms") or not (root / name).is_dir():
                continue
            (home / suite).mkdir(exist_ok=True)
            kernel, _ = first_kernel(root / name, chip, settings, home / suite)
            if kernel is None or kernel_digest(kernel) != row.get("kernel"):
                print(f"{suite}/{name}: the brain's kernel is not the one measured; left out", flush=True)
                continue
            requests.append(EvalRequest(root / name, kernel, target))
            names.append(f"{suite}/{name}")
            measured[f"{suite}/{name}"] = row["candidate_ms"] / 1e3
    out = {}
    for name, result in zip(names, evaluate_many(requests, settings), strict=True):
        profile = getattr(result, "profile", None)
        if not profile or profile.get("method") != "estimated":
            print(f"{name}: no estimate ({getattr(result, 'message', result)!s:.200})", flush=True)
            continue
        out[name] = {"profile": profile, "measured_s": measured[name]}
    path.write_text(json.dumps(out))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measured-log", type=Path, required=True, help="an on-chip log (benchmarks/on_chip.py)")
    parser.add_argument("--target", required=True, help="the chip the log was measured on")
    parser.add_argument("--estimates", type=Path, required=True, help="the kernels' local estimates (made if missing)")
    parser.add_argument("--write", action="store_true", help="keep the rate and band as the chip's calibration data")
    parser.add_argument("--fitted", type=Path, default=calibration.FITTED,
                        help="where the chips' calibration data is kept (default: the product's own)")
    args = parser.parse_args()
    clock = get_chip(args.target).clock_hz
    data = {name: (e["profile"], e["measured_s"])
            for name, e in estimates(args.measured_log, args.target, args.estimates).items()}
    if len(data) < 3:
        raise SystemExit(f"{len(data)} measured kernels: too few to fit")
    rate = fit(data, clock)
    before, fitted = ratios(data, None, clock), ratios(data, rate, clock)
    held_out = {name: ratios({name: data[name]}, fit({k: v for k, v in data.items() if k != name}, clock),
                              clock)[name] for name in data}
    print(f"{'kernel':56} {'measured':>9} {'before':>9} {'fitted':>9} {'held out':>9}  (estimated ms; / measured)")
    for name, (_, measured) in sorted(data.items()):
        print(f"{name[:56]:56} {measured * 1e3:9.3f} {before[name] * measured * 1e3:9.3f} "
              f"{fitted[name] * measured * 1e3:9.3f} {held_out[name] * measured * 1e3:9.3f}  "
              f"x{fitted[name]:.2f}")
    fidelity = {"before": describe(list(before.values())), "fitted": describe(list(fitted.values())),
                "leave-one-out": describe(list(held_out.values()))}
    band = _band(sorted(1 / r for r in held_out.values()))
    print(f"vector rate: {'none' if rate is None else f'{rate:.0f} elements per cycle'}")
    for what, text in fidelity.items():
        print(f"{what}: {text}")
    print(f"kernel band (measured / estimated, leave-one-out): {band}")
    if args.write:
        path = args.fitted / f"{args.target}.json"
        data_file = json.loads(path.read_text())  # the chip's XLA factors (fit_timing_model.py) come first
        data_file["kernel"] = {
            "vpu_elements_per_cycle": None if rate is None else round(rate), "band": band, "kernels": len(data),
            "fidelity": fidelity, "measured_from": str(args.measured_log),
            "made_by": "benchmarks/fit_kernel_model.py --measured-log LOG --target T --estimates E --write",
            "held_out": {name: round(r, 3) for name, r in sorted(held_out.items())}}
        path.write_text(json.dumps(data_file, indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
