"""The Search paradigm's pure parts: decisions over the graph, tunable spaces, the strategy library, layout."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agents import strategies, tunable
from agents.search_decide import Expansion, Graph, Node, SearchConfig, next_expansions
from agents.search_graph import layout, render_search_graph
from tests.conftest import TASKS


def N(id: int, parent: int | None = None, *, state: str = "evaluated", verdict: str | None = "ok",  # noqa: N802
      speedup: float | None = 1.0, strategy: str = "s", trajectory: int = 0, depth: int = 0,
      params: dict | None = None) -> Node:
    return Node(id=id, parent_id=parent, strategy=strategy, trajectory=trajectory, depth=depth, state=state,
                verdict=verdict if state == "evaluated" else None, speedup=speedup if state == "evaluated" else None,
                params=params)


def options_abc(node: Node) -> list[tuple[str, dict | None]]:
    return [("a", {"X": node.id * 10 + 1}), ("b", {"X": node.id * 10 + 2}), ("c", None)]


def test_beam_expands_the_best_nodes_with_untried_strategies() -> None:
    graph = Graph([N(1, speedup=1.2), N(2, 1, speedup=2.0, strategy="a", depth=1),
                   N(3, 1, speedup=0.5, strategy="b", depth=1)])
    out = next_expansions(graph, SearchConfig("beam", budget=10, width=2), options_abc)
    # The two best (2 then 1) take turns; node 1 has tried a and b already.
    assert out == [Expansion(2, "a", 0, {"X": 21}), Expansion(1, "c", 0, None)]


def test_the_budget_counts_evaluations_and_work_in_flight_but_not_duplicates() -> None:
    graph = Graph([N(1), N(2, 1, state="pending"), N(3, 1, state="duplicate", strategy="b")])
    assert len(next_expansions(graph, SearchConfig("beam", budget=3, width=4), options_abc)) == 1
    assert next_expansions(graph, SearchConfig("beam", budget=2, width=4), options_abc) == []
    many_duplicates = Graph([N(1)] + [N(i, 1, state="duplicate", strategy=f"d{i}") for i in range(2, 10)])
    assert next_expansions(many_duplicates, SearchConfig("beam", budget=2, width=2), options_abc) == []


def test_a_move_beyond_the_chips_vmem_costs_no_evaluation_and_is_not_repaired() -> None:
    # The seed, and its first move refused at compile for VMEM: one evaluation spent of two, the next move comes.
    refused = Node(id=2, parent_id=1, strategy="a", trajectory=0, depth=1, state="evaluated",
                   verdict="compile_error", params={"X": 11}, infeasible=True)
    graph = Graph([N(1, speedup=1.5), refused])
    assert (graph.evaluations, graph.infeasible) == (1, 1)
    out = next_expansions(graph, SearchConfig("beam", budget=2, width=1), options_abc)
    assert out == [Expansion(1, "b", 0, {"X": 12})]  # not a self_debug of node 2: that would undo the move
    # The same failure of any other kind is an evaluation spent, and a repair is tried.
    failed = Graph([N(1, speedup=1.5), Node(**{**refused.__dict__, "infeasible": False})])
    assert failed.evaluations == 2
    assert next_expansions(failed, SearchConfig("beam", budget=2, width=1), options_abc) == []


def test_parameters_already_in_the_graph_are_not_expanded_again() -> None:
    graph = Graph([N(1, params={"X": 0}), N(2, 1, strategy="z", params={"X": 11}, depth=1)])
    out = next_expansions(graph, SearchConfig("beam", budget=10, width=3), options_abc)
    assert {"X": 11} not in [e.params for e in out]


def test_parallel_trajectories_start_from_different_strategies_and_keep_one_job_each() -> None:
    graph = Graph([N(1)])
    out = next_expansions(graph, SearchConfig("parallel", budget=10, width=3), options_abc)
    assert [(e.trajectory, e.strategy) for e in out] == [(0, "a"), (1, "b"), (2, "c")]
    busy = Graph([N(1), N(2, 1, state="pending", trajectory=0), N(3, 1, speedup=3.0, trajectory=1, strategy="b",
                                                                  depth=1)])
    out = next_expansions(busy, SearchConfig("parallel", budget=10, width=2), options_abc)
    assert [(e.trajectory, e.parent_id) for e in out] == [(1, 3)]  # trajectory 1 climbs from its best


def test_tune_draws_distinct_points_all_at_once() -> None:
    space = {"A": (1, 2, 3), "B": (10, 20)}

    def sampler(n: int, rng: random.Random, known: list[dict]) -> list[dict]:
        return tunable.sample(space, n, rng, tuple(known))

    graph = Graph([N(1, params={"A": 1, "B": 10})])
    out = next_expansions(graph, SearchConfig("tune", budget=10, width=1), options_abc, sampler)
    points = [e.params for e in out]
    assert len(out) == 5 and {"A": 1, "B": 10} not in points  # the whole space but the seed
    assert len({tuple(sorted(p.items())) for p in points}) == 5


def test_the_best_is_an_ok_candidate_never_worse_than_any_other_ok() -> None:
    graph = Graph([N(1, speedup=1.5), N(2, 1, verdict="incorrect", speedup=9.0), N(3, 1, speedup=2.5),
                   N(4, 1, state="duplicate")])
    best = graph.best()
    assert best is not None and best.id == 3
    assert Graph([N(1, verdict="compile_error", speedup=None)]).best() is None


def test_a_measured_gain_inside_its_spread_does_not_replace_the_earlier_best() -> None:
    def measured(id: int, speedup: float, spread: float) -> Node:
        return Node(id=id, parent_id=None, strategy="s", trajectory=0, depth=0, state="evaluated", verdict="ok",
                    speedup=speedup, method="measured", band=(speedup / (1 + spread), speedup * (1 + spread)))

    assert Graph([measured(1, 1.50, 0.01), measured(2, 1.51, 0.01)]).best().id == 1  # type: ignore[union-attr]
    assert Graph([measured(1, 1.50, 0.01), measured(2, 1.53, 0.01)]).best().id == 2  # type: ignore[union-attr]
    # Estimates rank by their value: their band is the model's error, not the noise of a measurement.
    estimated = [N(1, speedup=1.50), N(2, speedup=1.51)]
    assert Graph(estimated).best().id == 2  # type: ignore[union-attr]


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="unknown search strategy"):
        SearchConfig("greedy")
    with pytest.raises(ValueError, match="at least 1"):
        SearchConfig("beam", budget=0)


# --- tunable spaces -------------------------------------------------------------------------------------------

KERNEL = '''TUNABLE = {"DEFAULT_BLOCK_M": (128, 256, 512), "VMEM_LIMIT_BYTES": (16 * 1024, 32 * 1024)}
DEFAULT_BLOCK_M = 256  # rows per block
VMEM_LIMIT_BYTES = 16 * 1024


def computation(x):
    return x
'''


def test_tunables_are_read_rewritten_and_stepped() -> None:
    space = tunable.space(KERNEL)
    assert space == {"DEFAULT_BLOCK_M": (128, 256, 512), "VMEM_LIMIT_BYTES": (16384, 32768)}
    assert tunable.current(KERNEL) == {"DEFAULT_BLOCK_M": 256, "VMEM_LIMIT_BYTES": 16384}
    moved = tunable.step(tunable.current(KERNEL), space, ("BLOCK_M",), +1)
    assert moved == {"DEFAULT_BLOCK_M": 512, "VMEM_LIMIT_BYTES": 16384}
    assert tunable.step(moved, space, ("BLOCK_M",), +1) is None  # at the end of its list
    code = tunable.with_params(KERNEL, moved)
    assert "DEFAULT_BLOCK_M = 512  # rows per block\n" in code and tunable.current(code) == moved
    assert code.count("\n") == KERNEL.count("\n")


@pytest.mark.parametrize("bad, message", [
    ("TUNABLE = {'X': (1, 2)}\n", "does not assign"),
    ("TUNABLE = {'X': ()}\nX = 1\n", "at least one value"),
    ("TUNABLE = {'X': (1,)}\nX = 1\nX = 2\n", "more than once"),
    ("TUNABLE = dict(X=(1,))\nX = 1\n", "literal dict"),
])
def test_malformed_tunables_say_what_is_wrong(bad: str, message: str) -> None:
    with pytest.raises(tunable.TunableError, match=message):
        tunable.space(bad)


def test_suite_solutions_declare_valid_spaces_that_the_library_moves() -> None:
    moved_somewhere = set()
    for path in sorted(TASKS.glob("*/solutions/pallas.py")):
        code = path.read_text()
        space = tunable.space(code)
        if not space:
            continue
        params = tunable.current(code)
        assert all(params[name] in values for name, values in space.items()), path
        for strategy in strategies.LIBRARY:
            if strategy.apply(params, space) is not None:
                moved_somewhere.add(strategy.id)
    assert len(moved_somewhere) >= 12


def test_the_library_has_at_least_30_distinct_tpu_strategies() -> None:
    assert len(strategies.LIBRARY) >= 30
    assert len({s.id for s in strategies.LIBRARY}) == len(strategies.LIBRARY)
    assert all(len(s.advice) > 40 for s in strategies.LIBRARY)
    assert {s.id for s in strategies.for_family("attention")} >= {"online_softmax", "causal_block_skip"}
    assert "fuse_epilogue" not in {s.id for s in strategies.for_family("elementwise")}


def test_layout_puts_children_right_of_parents_and_apart(tmp_path: Path) -> None:
    graph = Graph([N(1), N(2, 1, depth=1), N(3, 1, state="duplicate", depth=1), N(4, 2, state="pending", depth=2)])
    pos = layout(graph)
    assert pos[2][0] == pos[3][0] == pos[1][0] + 1 and pos[4][0] == pos[2][0] + 1
    assert len(set(pos.values())) == 4
    picture = render_search_graph(graph, tmp_path / "g.png", title="t")
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_exhausted_node_gives_its_beam_place_to_the_next_best() -> None:
    def only_for_node_1(node: Node) -> list[tuple[str, dict | None]]:
        return [("a", {"X": 1})] if node.id == 1 else []

    graph = Graph([N(1, speedup=1.0), N(2, 1, speedup=3.0, strategy="z", depth=1)])
    out = next_expansions(graph, SearchConfig("beam", budget=10, width=1), only_for_node_1)
    assert out == [Expansion(1, "a", 0, {"X": 1})]


def test_hybrid_explores_a_third_of_the_budget_at_random_then_climbs() -> None:
    space = {"A": (1, 2, 3, 4), "B": (10, 20, 30)}

    def sampler(n: int, rng: random.Random, known: list[dict]) -> list[dict]:
        return tunable.sample(space, n, rng, tuple(known))

    config = SearchConfig("hybrid", budget=9, width=2)
    graph = Graph([N(1, params={"A": 1, "B": 10})])
    first = next_expansions(graph, config, options_abc, sampler)
    assert [e.strategy for e in first] == ["tune", "tune"]
    explored = Graph(graph.nodes + [N(i, 1, strategy="tune", speedup=float(i), params={"A": i, "B": 20}, depth=1)
                                    for i in (2, 3, 4)])
    climb = next_expansions(explored, config, options_abc, sampler)
    assert climb and all(e.strategy != "tune" for e in climb) and climb[0].parent_id == 4  # from the best found
    assert [e.parent_id for e in climb] == [4, 3]  # the beam's two best, not one trajectory each
