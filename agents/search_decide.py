"""The Search paradigm's decisions, as pure functions of the candidate graph.

Three ways to spend a budget of evaluations:
- `beam`: keep the best `width` candidates; expand each with its next untried strategy.
- `parallel`: `width` independent trajectories, each a greedy climb from the seed that tries the strategies in
  its own order and moves on from its best candidate so far.
- `tune` (the autotuner): points of the seed's TUNABLE space drawn at random, all at once, so every free
  runner takes one.
- `hybrid`: a third of the budget on random points of the space (so a good region behind a worse first step
  is not missed), the rest as `beam` from the best of everything found.

A parametric move the compiler refuses for the chip's VMEM (`infeasible`: seconds of compiling, no run) costs
none of the budget: the search goes on to the next move, within its cap on nodes.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tpu_runner.timing import clear_improvement

SEARCH_STRATEGIES = ("beam", "parallel", "tune", "hybrid")
ROOT_STRATEGY = "seed"


@dataclass(frozen=True)
class SearchConfig:
    strategy: str = "beam"
    budget: int = 12  # evaluations (duplicates and moves beyond the chip's VMEM do not count)
    width: int = 2  # beam width, number of trajectories, candidates in flight
    max_depth: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        if self.strategy not in SEARCH_STRATEGIES:
            raise ValueError(f"unknown search strategy {self.strategy!r}; choose one of {', '.join(SEARCH_STRATEGIES)}")
        if self.budget < 1 or self.width < 1:
            raise ValueError("the budget and the width must be at least 1")

    def to_json(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "budget": self.budget, "width": self.width, "max_depth": self.max_depth,
                "seed": self.seed}


@dataclass(frozen=True)
class Node:
    id: int
    parent_id: int | None
    strategy: str | None
    trajectory: int
    depth: int
    state: str  # pending | evaluated | duplicate | failed (no candidate could be generated)
    verdict: str | None = None
    speedup: float | None = None
    params: dict[str, Any] | None = None
    method: str | None = None  # "measured" on the chip, else "estimated"
    band: tuple[float, float] | None = None  # the speedup's range: a measured one's spread
    infeasible: bool = False  # a parametric move beyond the chip's VMEM, refused at compile: no evaluation spent

    @property
    def score(self) -> float | None:
        """What the search ranks by: the evaluator's speedup, for candidates it called ok."""
        return self.speedup if self.state == "evaluated" and self.verdict == "ok" and self.speedup else None


@dataclass(frozen=True)
class Expansion:
    parent_id: int | None
    strategy: str
    trajectory: int
    params: dict[str, Any] | None = None  # set for parametric moves: the child's tunables


# For a node: the strategies that apply to it, in the library's order, each with the tunables it would set
# (None for strategies only a brain can carry out).
Options = Callable[[Node], list[tuple[str, dict[str, Any] | None]]]
# For the autotuner: up to n points of the seed's space, excluding those given.
Sampler = Callable[[int, random.Random, list[dict[str, Any]]], list[dict[str, Any]]]


@dataclass
class Graph:
    nodes: list[Node] = field(default_factory=list)

    def children(self, node_id: int | None) -> list[Node]:
        return [n for n in self.nodes if n.parent_id == node_id]

    @property
    def pending(self) -> list[Node]:
        return [n for n in self.nodes if n.state == "pending"]

    @property
    def evaluations(self) -> int:
        return sum(n.state == "evaluated" and not n.infeasible for n in self.nodes)

    @property
    def infeasible(self) -> int:
        return sum(n.infeasible for n in self.nodes)

    def best(self) -> Node | None:
        """The ok candidate with the highest speedup, taken in the order they were made: a later one replaces the
        best so far only when it is clearly faster (`clear_improvement`: a measured gain beyond its spread)."""
        best: Node | None = None
        for n in sorted(self.nodes, key=lambda n: n.id):
            if n.score is not None and (best is None or clear_improvement(n.score, n.band, n.method, best.score or 0)):
                best = n
        return best

    def known_params(self) -> list[dict[str, Any]]:
        return [n.params for n in self.nodes if n.params is not None]


def _untried(graph: Graph, node: Node, options: Options) -> list[tuple[str, dict[str, Any] | None]]:
    tried = {c.strategy for c in graph.children(node.id)}
    known = graph.known_params()
    return [(sid, params) for sid, params in options(node)
            if sid not in tried and (params is None or params not in known)]


def next_expansions(graph: Graph, config: SearchConfig, options: Options, sampler: Sampler | None = None
                    ) -> list[Expansion]:
    """What to create next. Empty with nothing pending: the search is over."""
    if not graph.nodes:
        return [Expansion(None, ROOT_STRATEGY, 0)]
    in_flight = len(graph.pending)
    left = config.budget - graph.evaluations - in_flight
    # Duplicates cost no evaluation; a cap on all nodes keeps a run of them from going on for ever.
    left = min(left, 4 * config.budget - len(graph.nodes))
    if left <= 0:
        return []
    if config.strategy == "tune":
        return _tune(graph, config, left, sampler)
    if config.strategy == "hybrid":
        explored = sum(n.strategy == "tune" for n in graph.nodes)
        wanted = max(config.width, config.budget // 3) - explored
        if wanted > 0 and sampler is not None:
            drawn = _tune(graph, config, min(wanted, left, config.width - in_flight), sampler)
            if drawn:
                return drawn
    slots = min(left, config.width - in_flight)
    if slots <= 0:
        return []
    if config.strategy in ("beam", "hybrid"):
        return _beam(graph, config, options, slots)
    return _parallel(graph, config, options, slots)


REPAIRABLE = ("lowering_error", "compile_error")  # a brain's self-debugger may fix these


def _expandable(graph: Graph, config: SearchConfig) -> list[Node]:
    # A move beyond the chip's VMEM is not repaired: shrinking its blocks would undo the move.
    return [n for n in graph.nodes if n.depth < config.max_depth and (n.score is not None or (
        n.state == "evaluated" and n.verdict in REPAIRABLE and not n.infeasible))]


def _beam(graph: Graph, config: SearchConfig, options: Options, slots: int) -> list[Expansion]:
    # The best `width` nodes that still have something untried: an exhausted node gives its place to the next.
    ranked = sorted(_expandable(graph, config), key=lambda n: (-(n.score or 0.0), n.id))
    queues: dict[int, list[tuple[str, dict[str, Any] | None]]] = {}
    beam: list[Node] = []
    for node in ranked:
        if len(beam) == config.width:
            break
        untried = _untried(graph, node, options)
        if untried:
            beam.append(node)
            queues[node.id] = untried
    out: list[Expansion] = []
    taken: list[dict[str, Any]] = []
    while len(out) < slots and any(queues.values()):
        for node in beam:
            while queues[node.id] and len(out) < slots:
                sid, params = queues[node.id].pop(0)
                if params is not None and params in taken:
                    continue
                if params is not None:
                    taken.append(params)
                out.append(Expansion(node.id, sid, node.trajectory, params))
                break
    return out


def _parallel(graph: Graph, config: SearchConfig, options: Options, slots: int) -> list[Expansion]:
    root = next(n for n in graph.nodes if n.parent_id is None)
    busy = {n.trajectory for n in graph.pending}
    out: list[Expansion] = []
    taken: list[dict[str, Any]] = []
    for t in range(config.width):
        if len(out) >= slots or t in busy:
            continue
        mine = [n for n in _expandable(graph, config) if n.trajectory == t or n.id == root.id]
        own = [n for n in mine if n.id != root.id]
        head = max(own, key=lambda n: (n.score or 0.0, -n.id)) if own else (root if root in mine else None)
        if head is None:
            continue
        choices = _untried(graph, head, options)
        if not choices:
            continue
        # Each trajectory starts at its own place in the strategy list, so they explore different moves first.
        start = (t * len(choices)) // config.width
        for sid, params in choices[start:] + choices[:start]:
            if params is None or params not in taken:
                if params is not None:
                    taken.append(params)
                out.append(Expansion(head.id, sid, t, params))
                break
    return out


def _tune(graph: Graph, config: SearchConfig, left: int, sampler: Sampler | None) -> list[Expansion]:
    root = next(n for n in graph.nodes if n.parent_id is None)
    if sampler is None:
        return []
    rng = random.Random(config.seed * 7919 + len(graph.nodes))
    return [Expansion(root.id, "tune", 0, params) for params in sampler(left, rng, graph.known_params())]
