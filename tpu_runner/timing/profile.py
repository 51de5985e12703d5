"""Stage 6: a short profile an agent can act on, built from what the earlier stages measured or estimated.

`summarise` is a pure function of plain data so it is tested without compiling anything.
"""

from __future__ import annotations

from typing import Any

from tpu_runner.hardware import ChipSpec

# Mosaic's default scoped VMEM limit per generation (the compiler refuses more unless vmem_limit_bytes says).
DEFAULT_SCOPED_VMEM = {"v5e": 16 * 2**20, "v6e": 32 * 2**20, "v5p": 16 * 2**20}


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def _ms(s: float) -> str:
    return f"{s * 1e3:.4g} ms"


def kernel_facts(traffic: Any, chip: ChipSpec, vmem_limits: list[int | None]) -> list[dict[str, Any]]:
    facts = []
    for call, limit in zip(traffic.calls, vmem_limits, strict=True):
        facts.append({
            "name": call.name, "grid": list(call.grid), "grid_steps": call.grid_steps,
            "vmem_bytes": call.vmem_bytes,
            "vmem_limit_bytes": limit or DEFAULT_SCOPED_VMEM.get(chip.name, 16 * 2**20),
            "hbm_bytes": call.hbm_bytes * call.multiplicity, "io_bytes": call.io_bytes * call.multiplicity,
            "exact": call.exact, "multiplicity": call.multiplicity,
        })
    return facts


def summarise(profile: dict[str, Any]) -> str:
    """Where the time goes, what bounds it, and what to try next, in a few lines."""
    lines: list[str] = []
    cand, ref, roof = profile["candidate"], profile["reference"], profile["roofline"]
    method = profile["method"]
    cand_s = max(cand["seconds"], 1e-12)  # a kernel estimated at 0 s still gets a summary
    lines.append(f"{method} on {profile['target']}: candidate {_ms(cand['seconds'])} vs reference "
                 f"{_ms(ref['seconds'])} (x{ref['seconds'] / cand_s:.2f}).")
    if method == "measured":
        lines.append(f"candidate spread +-{_ms(cand.get('spread', 0.0))}, reference +-{_ms(ref.get('spread', 0.0))}.")
    if method == "estimated":
        lines.append(f"candidate: compute {_ms(cand['compute_seconds'])} ({cand['cycles']:,} static cycles), HBM "
                     f"{_ms(cand['memory_seconds'])} ({cand['hbm_bytes'] / 1e6:.1f} MB) -> {cand['bound']}-bound.")
        if profile.get("band"):
            low, high = profile["band"]
            lines.append(f"the estimate's likely range: x{low:.2f}-x{high:.2f} (from its measured fidelity).")
    lines.append(f"roofline: {_ms(roof['seconds'])}, {roof['bound']}-bound ({roof['flops'] / 1e9:.3g} GFLOP, "
                 f"{roof['bytes'] / 1e6:.1f} MB compulsory, intensity {roof['intensity']:.3g} FLOP/B); candidate at "
                 f"{roof['seconds'] / cand_s:.0%} of it.")
    for k in profile.get("kernels", []):
        vmem = k["vmem_bytes"]
        limit = k["vmem_limit_bytes"]
        reread = k["hbm_bytes"] / k["io_bytes"] if k["io_bytes"] else 1.0
        lines.append(f"kernel {k['name']}: grid {tuple(k['grid'])} = {k['grid_steps']:,} steps; VMEM {_mib(vmem)} of "
                     f"{_mib(limit)} scoped limit; HBM traffic {k['hbm_bytes'] / 1e6:.1f} MB "
                     f"({reread:.2f}x its operands){'' if k['exact'] else ' (lower bound: manual DMA)'}.")
    top = sorted(cand.get("ops", []), key=lambda op: -op[1])[:3]
    total_ns = sum(ns for _, ns in cand.get("ops", []))
    if top and total_ns and method == "estimated":
        lines.append("top ops by estimated time: " + ", ".join(f"{name} {ns / total_ns:.0%}" for name, ns in top)
                     + ".")
    lines.extend(f"hint: {h}" for h in hints(profile))
    return "\n".join(lines)


def hints(profile: dict[str, Any]) -> list[str]:
    out: list[str] = []
    cand, roof = profile["candidate"], profile["roofline"]
    for k in profile.get("kernels", []):
        if k["io_bytes"] and k["hbm_bytes"] > 1.5 * k["io_bytes"]:
            out.append(f"{k['name']} reads {k['hbm_bytes'] / k['io_bytes']:.1f}x its operands: enlarge blocks along "
                       "the axis that is re-fetched, or reorder the grid so the reused block stays resident.")
        if k["grid_steps"] > 4096 and cand.get("bound") == "compute":
            out.append(f"{k['name']} runs {k['grid_steps']:,} grid steps: per-step overhead dominates; "
                       "use larger blocks.")
        if k["vmem_bytes"] > 0.85 * k["vmem_limit_bytes"]:
            out.append(f"{k['name']} uses {k['vmem_bytes'] / k['vmem_limit_bytes']:.0%} of its VMEM limit: smaller "
                       "blocks or a higher vmem_limit_bytes.")
    if cand["seconds"] > 1.5 * roof["seconds"] and roof["bound"] == "memory" and cand.get("bound") == "compute":
        out.append("the task is memory-bound but the kernel is compute-bound: simplify the per-element work "
                   "or fuse fewer passes.")
    return out
