"""Stage 5 on hardware: time candidate and reference in one process, interleaved, from a profiler trace.

Each call gets inputs copied afresh to the device (so nothing can be cached on buffer identity), the order
alternates every iteration, warm-up calls are discarded, and every output produced while timing is compared
with the reference's output on the same inputs. Per-call times come from the trace's device lane when there
is one (TPU), else from the host's per-call events (CPU backend), else from the wall clock - always labelled.
The same code runs on the CPU backend in tests, so the path that times kernels on TPUs is not untested.
"""

from __future__ import annotations

import gzip
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import jax.profiler  # loaded now, so that the integrity check watches it from before the candidate runs
import numpy as np

from tpu_runner.checking import Comparison, compare_outputs

REFERENCE_NAME = "_kb_reference"
CANDIDATE_NAME = "_kb_candidate"


@dataclass(frozen=True)
class Timing:
    samples_ms: tuple[float, ...]
    source: str  # "trace:device", "trace:host" or "wall_clock"

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def spread_ms(self) -> float:
        """Half the distance between the 10th and 90th percentiles."""
        if len(self.samples_ms) < 2:
            return 0.0
        lo, hi = np.percentile(self.samples_ms, [10, 90])
        return float(hi - lo) / 2


@dataclass
class MeasuredPair:
    reference: Timing
    candidate: Timing
    mismatches: list[str] = field(default_factory=list)  # outputs that differed while timing
    notes: list[str] = field(default_factory=list)  # differences the judge accepted, and why
    # Differences the judge kept for later: (input set, the iterations that gave them), in the order it was asked.
    kept: list[tuple[int, list[int]]] = field(default_factory=list)
    reference_ops: list[tuple[str, float]] = field(default_factory=list)  # `device_ops` of each
    candidate_ops: list[tuple[str, float]] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        return self.reference.median_ms / self.candidate.median_ms


def _named(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    def wrapper(*args: Any) -> Any:
        return fn(*args)

    wrapper.__name__ = wrapper.__qualname__ = name
    return wrapper


def _trace_file(trace_dir: Path) -> Path | None:
    files = sorted(trace_dir.glob("**/*.trace.json.gz"), key=lambda p: p.stat().st_mtime)
    return files[-1] if files else None


def _trace_events(trace_path: Path) -> tuple[list[dict[str, Any]], set[int]]:
    """The trace's complete events, and the ids of its device processes (not the host's CPU)."""
    data = json.loads(gzip.decompress(trace_path.read_bytes()))
    events = data.get("traceEvents", [])
    processes = {e["pid"]: e.get("args", {}).get("name", "") for e in events
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
    device_pids = {pid for pid, pname in processes.items() if "/device:" in pname and "CPU" not in pname}
    return [e for e in events if e.get("ph") == "X"], device_pids


def per_call_durations(trace_path: Path, name: str) -> tuple[list[float], str]:
    """Durations (ms) of each call of the jitted function `name`, from a Chrome trace written by jax.profiler."""
    complete, device_pids = _trace_events(trace_path)
    device = _outermost([e for e in complete if e["pid"] in device_pids and f"jit_{name}" in e.get("name", "")])
    if device:
        return [e["dur"] / 1e3 for e in device], "trace:device"
    host = _outermost([e for e in complete if e.get("name") == f"PjitFunction({name})"])
    return [e["dur"] / 1e3 for e in host], "trace:host"


def device_ops(trace_path: Path, name: str) -> list[tuple[str, float]]:
    """The device's ops within the calls of `name` (a Pallas kernel, XLA fusions), in the order they run: (op,
    median ns per call). Empty without a device lane."""
    complete, device_pids = _trace_events(trace_path)
    on_device = [e for e in complete if e["pid"] in device_pids]
    calls = _outermost([e for e in on_device if f"jit_{name}" in e.get("name", "")])
    per_call: dict[str, list[float]] = {}
    first_seen: dict[str, float] = {}
    for call in calls:
        end = call["ts"] + call["dur"]
        inside: dict[str, float] = {}
        for e in on_device:
            if call["ts"] <= e["ts"] and e["ts"] + e["dur"] <= end and "jit_" not in e.get("name", "jit_"):
                inside[e["name"]] = inside.get(e["name"], 0.0) + e["dur"] * 1e3
                first_seen.setdefault(e["name"], e["ts"] - call["ts"])
        for op, ns in inside.items():
            per_call.setdefault(op, []).append(ns)
    return [(op, statistics.median(per_call[op])) for op in sorted(per_call, key=lambda op: first_seen[op])]


def _outermost(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events not nested in another of the list (the profiler records some calls twice), in time order."""
    out: list[dict[str, Any]] = []
    end = float("-inf")
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        if e["ts"] >= end:
            out.append(e)
            end = e["ts"] + e["dur"]
    return out


def _differs(atol: float, rtol: float) -> Callable[[Any, Any], Any]:
    """A jitted check, on the device, of whether candidate and reference outputs (same structure, shapes and dtypes)
    differ beyond atol + rtol * |reference| anywhere (NaN where the other is not counts): one flag per output, so
    the timed loop moves no output to the host."""

    def leaf(c: Any, r: Any) -> Any:
        c32, r32 = c.astype(jnp.float32), r.astype(jnp.float32)
        both_nan = jnp.isnan(c32) & jnp.isnan(r32)
        beyond = jnp.abs(c32 - r32) > atol + rtol * jnp.abs(r32)
        return jnp.any((beyond & ~both_nan) | (jnp.isnan(c32) != jnp.isnan(r32)))

    return jax.jit(lambda c, r: [leaf(a, b) for a, b in zip(jax.tree.leaves(c), jax.tree.leaves(r), strict=True)])


def _identical() -> Callable[[Any, Any], Any]:
    """A jitted check, on the device, that two output trees hold the same values (NaN equal to NaN)."""
    return jax.jit(lambda a, b: jnp.all(jnp.stack([jnp.array_equal(x, y, equal_nan=True)
                                                   for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b),
                                                                   strict=True)])))


# judge(input set, candidate's outputs, reference's) -> (comparison, note on how it passed), or None: kept to be
# judged elsewhere (the evaluator judges values that differ against a float64 run it has made).
Judgement = Callable[[int, Any, Any], tuple[Comparison, str] | None]


def _same_form(c: Any, r: Any) -> bool:
    lc, lr = jax.tree.leaves(c), jax.tree.leaves(r)
    return jax.tree.structure(c) == jax.tree.structure(r) and all(
        a.shape == b.shape and a.dtype == b.dtype for a, b in zip(lc, lr, strict=True))


def measure_pair(*, reference: Callable[..., Any], candidate: Callable[..., Any],
                 input_sets: Sequence[Sequence[np.ndarray]], static: tuple[Any, ...], trace_dir: Path,
                 atol: float, rtol: float, warmup: int = 3, iterations: int = 20,
                 judge: Judgement | None = None) -> MeasuredPair:
    """Time both, interleaved. Each input set goes to the device once; every call gets its own copy of it, made on
    the device (a fresh buffer, nothing to cache on, without the host's transfer time: 0.35 s for 256 MB on one
    TPU host); outputs are compared on the device, and moved to the host only to describe a difference.

    A difference is judged after the timed loop by `judge(input set, candidate's, reference's outputs)` when
    given (it may keep one to be judged elsewhere: `MeasuredPair.kept`), else elementwise; outputs identical to
    ones judged already on the same input set share that judgement."""
    argnums = tuple(range(len(input_sets[0]), len(input_sets[0]) + len(static)))
    fns = {REFERENCE_NAME: jax.jit(_named(reference, REFERENCE_NAME), static_argnums=argnums),
           CANDIDATE_NAME: jax.jit(_named(candidate, CANDIDATE_NAME), static_argnums=argnums)}
    resident = [[jax.device_put(np.asarray(x)) for x in inputs] for inputs in input_sets]
    differs = _differs(atol, rtol)

    def call(name: str, i: int) -> tuple[Any, float]:
        args = [jax.device_put(x, may_alias=False) for x in resident[i % len(resident)]]
        jax.block_until_ready(args)
        t0 = time.perf_counter()
        out = jax.block_until_ready(fns[name](*args, *static))
        return out, (time.perf_counter() - t0) * 1e3

    for i in range(warmup):
        for name in fns:
            call(name, i)
    wall: dict[str, list[float]] = {name: [] for name in fns}
    # Outputs that differed, judged after the loop: per input set, each distinct pair held once on the device with
    # the iterations that gave it (a deterministic kernel holds one pair per set, not one per iteration).
    differed: dict[int, list[tuple[Any, Any, list[int]]]] = {}
    identical = _identical()
    trace_dir.mkdir(parents=True, exist_ok=True)
    with jax.profiler.trace(str(trace_dir), create_perfetto_trace=True):
        for i in range(iterations):
            order = list(fns) if i % 2 == 0 else list(reversed(fns))
            outs = {}
            for name in order:
                outs[name], ms = call(name, i)
                wall[name].append(ms)
            cand, ref = outs[CANDIDATE_NAME], outs[REFERENCE_NAME]
            if _same_form(cand, ref) and not any(bool(f) for f in differs(cand, ref)):
                continue
            held = differed.setdefault(i % len(resident), [])
            same = next((its for c, r, its in held if _same_form(c, cand) and _same_form(r, ref)
                         and bool(identical(c, cand)) and bool(identical(r, ref))), None)
            if same is not None:
                same.append(i)
            else:
                held.append((cand, ref, [i]))
    mismatches, notes, kept = _judged(differed, judge or (lambda _k, c, r: (compare_outputs(c, r, atol, rtol), "")))
    timings = {}
    trace_path = _trace_file(trace_dir)
    for name in fns:
        samples, source = per_call_durations(trace_path, name) if trace_path else ([], "")
        if len(samples) != iterations:  # the trace did not resolve one event per call: fall back, and say so
            samples, source = wall[name], "wall_clock"
        timings[name] = Timing(tuple(samples), source)
    ops = {name: device_ops(trace_path, name) if trace_path else [] for name in fns}
    return MeasuredPair(timings[REFERENCE_NAME], timings[CANDIDATE_NAME], mismatches, notes, kept,
                        ops[REFERENCE_NAME], ops[CANDIDATE_NAME])


def accepted_while_timing(iteration: int, note: str) -> str:
    """The note on outputs that differed while timing beyond the tolerance and were judged right all the same."""
    why = note or "within the reference's own error (its float64 truth)"
    return f"while timing, iteration {iteration}'s outputs differ from the reference's beyond the tolerance, {why}"


def _judged(differed: dict[int, list[tuple[Any, Any, list[int]]]], judge: Judgement
            ) -> tuple[list[str], list[str], list[tuple[int, list[int]]]]:
    """The mismatches among outputs that differed while timing (one per iteration, in order), notes on the
    differences the judge accepted, and the ones it kept; each distinct pair of outputs is judged once."""
    mismatches: list[tuple[int, str]] = []
    notes: list[str] = []
    kept: list[tuple[int, list[int]]] = []
    for k, held in differed.items():
        for cand, ref, iterations in held:
            if (judgement := judge(k, cand, ref)) is None:
                kept.append((k, iterations))
                continue
            comparison, note = judgement
            if comparison.ok or comparison.error is None:
                notes.append(accepted_while_timing(iterations[0], note))
            else:
                mismatches += [(i, f"{comparison.error.kind}: {comparison.error.detail}") for i in iterations]
    return [f"iteration {i}: {m}" for i, m in sorted(mismatches)], notes, kept
