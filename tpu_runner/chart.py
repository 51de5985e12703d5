"""The profile as a picture: time per part for reference and candidate, against the roofline."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def render_profile_chart(profile: dict[str, Any], path: Path, *, title: str) -> Path:
    # The Figure API, not pyplot: charts are drawn from several threads at once (evaluations, the notifier).
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter

    ref, cand, roof = profile["reference"], profile["candidate"], profile["roofline"]
    fig = Figure(figsize=(11, 4))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.2, 1]})
    labels = ["reference (XLA)", "candidate"]
    if profile["method"] == "estimated":
        compute = [ref["compute_seconds"] * 1e3, cand["compute_seconds"] * 1e3]
        memory = [ref["memory_seconds"] * 1e3, cand["memory_seconds"] * 1e3]
        x = range(len(labels))
        left.bar([i - 0.2 for i in x], compute, width=0.4, label="compute (static cycles)", color="#4C72B0")
        left.bar([i + 0.2 for i in x], memory, width=0.4, label="HBM traffic / bandwidth", color="#DD8452")
        left.set_xticks(list(x), labels)
    else:
        left.bar(labels, [ref["seconds"] * 1e3, cand["seconds"] * 1e3], color=["#4C72B0", "#55A868"],
                 yerr=[ref.get("spread", 0) * 1e3, cand.get("spread", 0) * 1e3])
    left.axhline(roof["seconds"] * 1e3, color="black", linestyle="--", linewidth=1,
                 label=f"roofline ({roof['bound']}-bound)")
    left.set_ylabel(f"ms ({profile['method']})")
    left.set_title(f"{profile['target']}: x{ref['seconds'] / cand['seconds']:.2f} vs reference")
    left.legend(fontsize=8)

    ops = sorted(cand.get("ops", []), key=lambda op: -op[1])[:8]
    if ops:
        names = [name[:28] for name, _ in ops][::-1]
        right.barh(names, [ns * 1e-9 for _, ns in ops][::-1], color="#8172B3")
        right.set_xlabel("estimated time")
        right.xaxis.set_major_formatter(EngFormatter(unit="s"))  # 40 µs, not 4e-05 running into its neighbours
        right.set_title("candidate: where the time goes")
    else:
        kernels = profile.get("kernels", [])
        right.barh([k["name"][:28] for k in kernels] or ["(none)"],
                   [k["hbm_bytes"] / 1e6 for k in kernels] or [0], color="#8172B3")
        right.set_xlabel("HBM MB")
        right.set_title("candidate kernels: HBM traffic")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
