"""The evaluation's profile as a Chrome trace (the Trace Event Format that Perfetto's UI, chrome://tracing and
TensorBoard's trace viewer open), so a person can look at where the time goes op by op.

Candidate and reference are two processes, each with one track on which its ops (Pallas kernels and XLA ops) run
one after another as complete events ("ph": "X", times in microseconds); the roofline is a third process with one
event, what the chip allows. An estimated program's ops are in the order it runs them and last what the timing
model gives each; a program whose estimate was raised to the roofline ends with an event for the difference, so a
track's events always add up to the program's time. A measured program has no ops: one event for the whole of it.
Pure: plain profile data in, plain data out (`trace_json` for the bytes of the file).
"""

from __future__ import annotations

import json
from typing import Any

PROGRAMS = (("candidate", 1), ("reference", 2))
ROOFLINE_PID = 3
TRACK = 1
RAISED = "(raised to the roofline)"


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 6)


def _op_times(program: dict[str, Any]) -> list[tuple[str, float]]:
    """(name, seconds) of a program's ops, fitted within its time: a profile stored before the ops were in
    nanoseconds (they were static cycles) would otherwise run past it."""
    ops = [(str(name), float(ns) * 1e-9) for name, ns in program.get("ops") or [] if ns > 0]
    total, seconds = sum(s for _, s in ops), float(program.get("seconds") or 0.0)
    if total > seconds > 0:
        ops = [(name, s * seconds / total) for name, s in ops]
    return ops


def _kernel_args(profile: dict[str, Any], kernel_ops: int) -> dict[str, Any]:
    """What the candidate's one kernel does (grid, VMEM, HBM traffic), when there is one kernel to give it to."""
    kernels = profile.get("kernels") or []
    if kernel_ops != 1 or len(kernels) != 1:
        return {}
    k = kernels[0]
    return {"kernel": k.get("name"), "grid": k.get("grid"), "grid_steps": k.get("grid_steps"),
            "vmem_bytes": k.get("vmem_bytes"), "vmem_limit_bytes": k.get("vmem_limit_bytes"),
            "hbm_bytes": k.get("hbm_bytes"), "operand_bytes": k.get("io_bytes")}


def _program_events(profile: dict[str, Any], who: str, pid: int) -> list[dict[str, Any]]:
    program = profile.get(who) or {}
    seconds = float(program.get("seconds") or 0.0)
    method = profile.get("method", "estimated")
    label = f"{who}: {seconds * 1e3:.4g} ms {method}"
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": TRACK,
         "args": {"name": "TensorCore, op by op" if program.get("ops") else "TensorCore"}},
    ]
    classes = program.get("op_classes") or {}
    ops = _op_times(program)
    kernel_args = _kernel_args(profile, sum(classes.get(n) == "kernel" for n, _ in ops)) if who == "candidate" else {}
    at = 0.0
    for name, s in ops:
        op_class = classes.get(name, "op")
        args: dict[str, Any] = {"class": op_class, "share": f"{s / seconds:.1%}" if seconds else ""}
        if op_class == "kernel":
            args.update(kernel_args)
        events.append({"ph": "X", "name": name, "cat": op_class, "pid": pid, "tid": TRACK, "ts": _us(at),
                       "dur": _us(s), "args": args})
        at += s
    rest = seconds - at
    if not ops and seconds > 0:
        args = {"spread_ms": program["spread"] * 1e3} if program.get("spread") is not None else {}
        events.append({"ph": "X", "name": f"{who} ({method})", "cat": "program", "pid": pid, "tid": TRACK,
                       "ts": 0.0, "dur": _us(seconds), "args": args})
    elif rest > seconds * 1e-9:
        events.append({"ph": "X", "name": RAISED, "cat": "roofline", "pid": pid, "tid": TRACK, "ts": _us(at),
                       "dur": _us(rest), "args": {"why": "the model's time was below the roofline; no program runs "
                                                         "faster than the roofline, so the estimate is raised to it"}})
    return events


def chrome_trace(profile: dict[str, Any], *, task: str, target: str, title: str = "") -> dict[str, Any]:
    """The profile as a Trace Event Format object (JSON object form, with its metadata in `otherData`)."""
    roof = profile.get("roofline") or {}
    cand = profile.get("candidate") or {}
    ref = profile.get("reference") or {}
    events: list[dict[str, Any]] = []
    for who, pid in PROGRAMS:
        events += _program_events(profile, who, pid)
    if roof.get("seconds"):
        events += [
            {"ph": "M", "name": "process_name", "pid": ROOFLINE_PID, "tid": 0,
             "args": {"name": f"roofline: {roof['seconds'] * 1e3:.4g} ms, {roof.get('bound')}-bound"}},
            {"ph": "M", "name": "process_sort_index", "pid": ROOFLINE_PID, "tid": 0, "args": {"sort_index": 3}},
            {"ph": "X", "name": "what the chip allows", "cat": "roofline", "pid": ROOFLINE_PID, "tid": TRACK,
             "ts": 0.0, "dur": _us(roof["seconds"]),
             "args": {k: roof.get(k) for k in ("flops", "bytes", "intensity", "bound")}},
        ]
    method = profile.get("method", "estimated")
    speedup = ref.get("seconds", 0.0) / cand["seconds"] if cand.get("seconds") else None
    meta: dict[str, Any] = {
        "title": title or f"{task} on {target}", "task": task, "target": target, "method": method,
        "candidate_ms": cand.get("seconds", 0.0) * 1e3, "reference_ms": ref.get("seconds", 0.0) * 1e3,
        "speedup": speedup, "band": profile.get("band"),
        "how": ("estimated without a TPU: each op's time from the compiler's figures and the calibrated timing "
                "model (docs/estimates.md); ops run one after another" if method == "estimated" else
                "measured on a device: the whole program's median time (no per-op breakdown)"),
    }
    if profile.get("kernels"):
        meta["kernels"] = profile["kernels"]
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": meta}


def trace_json(profile: dict[str, Any], *, task: str, target: str, title: str = "") -> bytes:
    """The bytes of a `.trace.json` file for the profile."""
    return json.dumps(chrome_trace(profile, task=task, target=target, title=title), indent=1).encode()
