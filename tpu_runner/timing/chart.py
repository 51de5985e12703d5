"""The profile as a picture: on the left the time of reference and candidate against the roofline; on the right
what explains it - the time of each kernel and XLA op of both programs when they have several, or, when each is
a single op (or was measured whole), where both sit on the chip's roofline.

What the right panel shows is decided by `right_panel`, a pure function of the profile; the drawing only follows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_runner.hardware import CHIPS
from tpu_runner.reports import draws_alone

TOP_OPS = 5  # per program; the rest are one "other" bar
COLOURS = {"candidate": "#55A868", "reference": "#4C72B0"}


@dataclass(frozen=True)
class OpBar:
    program: str  # candidate | reference
    name: str
    seconds: float
    kind: str  # the op's class: kernel, matmul, elementwise, ... ("op" when the profile does not say)
    share: float  # of its program's time


@dataclass(frozen=True)
class RooflinePoint:
    label: str
    intensity: float  # the task's FLOPs per HBM byte the program moves
    flops_per_second: float  # the task's FLOPs over the program's time


@dataclass(frozen=True)
class RightPanel:
    kind: str  # ops | roofline | kernels
    title: str
    bars: tuple[OpBar, ...] = ()
    points: tuple[RooflinePoint, ...] = ()
    peak_flops: float = 0.0
    bandwidth: float = 0.0
    kernels: tuple[tuple[str, float], ...] = ()  # (name, HBM bytes), when nothing else can be said


def _ops(program: dict[str, Any]) -> list[tuple[str, float]]:
    """(name, seconds) of a program's ops, the same op's repeats (one per production shape) added up."""
    out: dict[str, float] = {}
    for name, ns in program.get("ops") or []:
        out[str(name)] = out.get(str(name), 0.0) + float(ns) * 1e-9
    return [(n, s) for n, s in out.items() if s > 0]


def _op_bars(who: str, program: dict[str, Any]) -> list[OpBar]:
    ops = sorted(_ops(program), key=lambda op: -op[1])
    total = sum(s for _, s in ops) or 1.0
    classes = program.get("op_classes") or {}
    bars = [OpBar(who, name, s, classes.get(name, "op"), s / total) for name, s in ops[:TOP_OPS]]
    rest = ops[TOP_OPS:]
    if rest:
        seconds = sum(s for _, s in rest)
        bars.append(OpBar(who, f"{len(rest)} other ops", seconds, "other", seconds / total))
    return bars


def _bytes(profile: dict[str, Any], who: str) -> float:
    """What a program moves through HBM: the estimate's count, else its kernels' traffic (a candidate), else the
    task's compulsory bytes."""
    program = profile.get(who) or {}
    if program.get("hbm_bytes"):
        return float(program["hbm_bytes"])
    kernels = sum(float(k.get("hbm_bytes") or 0) for k in profile.get("kernels") or [])
    if who == "candidate" and kernels:
        return kernels
    return float((profile.get("roofline") or {}).get("bytes") or 0.0)


def right_panel(profile: dict[str, Any]) -> RightPanel:
    """What the chart's right panel shows for this profile."""
    cand, ref = profile.get("candidate") or {}, profile.get("reference") or {}
    roof = profile.get("roofline") or {}
    chip = CHIPS.get(str(profile.get("target")))
    flops = float(roof.get("flops") or 0.0)
    single = len(_ops(cand)) <= 1 and len(_ops(ref)) <= 1
    if single and chip is not None and flops > 0 and roof.get("bytes"):
        points = tuple(RooflinePoint(who, flops / max(_bytes(profile, who), 1.0), flops / program["seconds"])
                       for who, program in (("candidate", cand), ("reference", ref)) if program.get("seconds"))
        return RightPanel("roofline", f"{profile.get('target')} roofline: where each program sits",
                          points=points, peak_flops=chip.peak_flops["bf16"], bandwidth=chip.hbm_bandwidth)
    bars = tuple(_op_bars("candidate", cand) + _op_bars("reference", ref))
    if bars:
        return RightPanel("ops", f"time by kernel and XLA op ({profile.get('method', 'estimated')})", bars=bars)
    kernels = tuple((str(k["name"]), float(k.get("hbm_bytes") or 0)) for k in profile.get("kernels") or [])
    return RightPanel("kernels", "candidate kernels: HBM traffic", kernels=kernels)


def _draw_ops(ax: Any, panel: RightPanel) -> None:
    from matplotlib.patches import Patch
    from matplotlib.ticker import EngFormatter

    bars = panel.bars[::-1]  # barh draws bottom-up: the candidate's largest op on top
    labels = [f"{b.name[:26]} ({b.kind})" for b in bars]
    ax.barh(range(len(bars)), [b.seconds for b in bars], color=[COLOURS[b.program] for b in bars],
)
    for i, b in enumerate(bars):
        ax.text(b.seconds, i, f" {b.share:.0%}", va="center", fontsize=7)
    ax.set_yticks(range(len(bars)), labels, fontsize=7)
    ax.xaxis.set_major_formatter(EngFormatter(unit="s"))  # 40 µs, not 4e-05 running into its neighbours
    ax.set_xlabel("time (share of its program)")
    ax.margins(x=0.15)
    ax.legend(handles=[Patch(color=c, label=w) for w, c in COLOURS.items()], fontsize=7, loc="lower right")
    ax.set_title(panel.title, fontsize=9)


def _draw_roofline(ax: Any, panel: RightPanel) -> None:
    from matplotlib.ticker import EngFormatter

    ridge = panel.peak_flops / panel.bandwidth
    xs = [p.intensity for p in panel.points] + [ridge]
    low, high = min(xs) / 10, max(xs) * 10
    ax.loglog([low, ridge, high], [low * panel.bandwidth, panel.peak_flops, panel.peak_flops], color="black",
              linewidth=1, label=f"roofline ({panel.bandwidth / 1e9:.0f} GB/s, {panel.peak_flops / 1e12:.0f} "
                                 "TFLOP/s)")
    for p in panel.points:
        ax.scatter([p.intensity], [p.flops_per_second], color=COLOURS.get(p.label, "#8172B3"), zorder=3,
                   label=f"{p.label}: {p.flops_per_second / min(panel.peak_flops, p.intensity * panel.bandwidth):.0%}"
                         " of its roof")
    ax.yaxis.set_major_formatter(EngFormatter(unit="FLOP/s"))
    ax.set_xlabel("arithmetic intensity (FLOP / HBM byte)")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(panel.title, fontsize=9)


def _draw_kernels(ax: Any, panel: RightPanel) -> None:
    names = [name[:28] for name, _ in panel.kernels] or ["(none)"]
    ax.barh(names, [b / 1e6 for _, b in panel.kernels] or [0], color="#8172B3")
    ax.set_xlabel("HBM MB")
    ax.set_title(panel.title, fontsize=9)


@draws_alone
def render_profile_chart(profile: dict[str, Any], path: Path, *, title: str) -> Path:
    # The Figure API, not pyplot: no global figure state; one chart at a time all the same (`draws_alone`).
    from matplotlib.figure import Figure

    ref, cand, roof = profile["reference"], profile["candidate"], profile["roofline"]
    fig = Figure(figsize=(11, 4))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.2]})
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
    left.set_title(f"{profile['target']}: x{ref['seconds'] / cand['seconds']:.2f} vs reference", fontsize=9)
    left.legend(fontsize=8)

    panel = right_panel(profile)
    {"ops": _draw_ops, "roofline": _draw_roofline, "kernels": _draw_kernels}[panel.kind](right, panel)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path
