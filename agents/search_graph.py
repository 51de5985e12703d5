"""The search graph as a picture: the seed on the left, each expansion one column to the right.

Layout is a pure function of the graph (tested); drawing is matplotlib, as for the profile chart.
"""

from __future__ import annotations

from pathlib import Path

from agents.search_decide import Graph, Node
from tpu_runner.reports import draws_alone

_FILL = {"pending": "#FFFFFF", "duplicate": "#D0D0D0", "failed": "#F4A6A6"}


def layout(graph: Graph) -> dict[int, tuple[float, float]]:
    """(x, y) per node: x is the depth, y spreads the leaves of each subtree apart (a tidy tree)."""
    by_parent: dict[int | None, list[Node]] = {}
    for n in graph.nodes:
        by_parent.setdefault(n.parent_id, []).append(n)
    pos: dict[int, tuple[float, float]] = {}
    next_leaf = [0.0]

    def place(node: Node, depth: int) -> float:
        kids = by_parent.get(node.id, [])
        if not kids:
            y = next_leaf[0]
            next_leaf[0] += 1.0
        else:
            ys = [place(k, depth + 1) for k in kids]
            y = (min(ys) + max(ys)) / 2
        pos[node.id] = (float(depth), y)
        return y

    for root in by_parent.get(None, []):
        place(root, 0)
    return pos


def label(node: Node) -> str:
    head = f"#{node.id} {node.strategy or ''}".strip()
    if node.state == "evaluated":
        value = f"x{node.speedup:.2f}" if node.verdict == "ok" and node.speedup else node.verdict or ""
    else:
        value = node.state
    return f"{head}\n{value}"


@draws_alone
def render_search_graph(graph: Graph, path: Path, *, title: str) -> Path:
    # Here, not at the top: matplotlib is slow to import and only drawing needs it; the headless backend must be
    # chosen before pyplot is imported.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pos = layout(graph)
    best = graph.best()
    scores = [n.score for n in graph.nodes if n.score]
    top = max(scores) if scores else 1.0
    depth = max((x for x, _ in pos.values()), default=0.0)
    leaves = max((y for _, y in pos.values()), default=0.0)
    fig, ax = plt.subplots(figsize=(max(6.0, 2.6 * (depth + 1)), max(3.0, 0.75 * (leaves + 1))))
    for n in graph.nodes:
        if n.parent_id in pos:
            (x0, y0), (x1, y1) = pos[n.parent_id], pos[n.id]
            ax.plot([x0, x1], [y0, y1], color="#888888", linewidth=1, zorder=1)
    cmap = plt.get_cmap("Greens")
    for n in graph.nodes:
        x, y = pos[n.id]
        if n.score:
            fill = cmap(0.15 + 0.4 * n.score / top)
        elif n.state == "evaluated":
            fill = "#F4A6A6"
        else:
            fill = _FILL.get(n.state, "#FFFFFF")
        is_best = best is not None and n.id == best.id
        ax.text(x, y, label(n), ha="center", va="center", fontsize=7, zorder=2,
                bbox={"boxstyle": "round,pad=0.35", "facecolor": fill,
                      "edgecolor": "#C9A400" if is_best else "#444444", "linewidth": 2.5 if is_best else 0.8})
    ax.set_xlim(-0.6, depth + 0.6)
    ax.set_ylim(leaves + 0.7, -0.7)
    ax.axis("off")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
