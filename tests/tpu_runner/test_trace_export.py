"""The profile as a Chrome trace: loadable JSON, candidate and reference as two processes whose op events add up
to their programs' times, and metadata naming the task, target and how the times were obtained."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.tpu_runner.test_chart import estimated
from tpu_runner.timing import RAISED, trace_json


def _load(profile: dict[str, Any]) -> dict[str, Any]:
    return json.loads(trace_json(profile, task="softmax", target="v6e"))


def _track(trace: dict[str, Any], pid: int) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == pid]


def _process_names(trace: dict[str, Any]) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}


def test_each_op_is_a_complete_event_and_a_track_adds_up_to_its_program() -> None:
    profile = estimated([("_softmax.1", 160_000), ("copy.2", 20_000)],
                        [("fusion.1", 100_000), ("fusion", 110_000), ("reduce_max.7", 120_000)],
                        classes={"_softmax.1": "kernel", "copy.2": "copy"})
    trace = _load(profile)
    names = _process_names(trace)
    assert names[1].startswith("candidate: 0.18 ms estimated") and names[2].startswith("reference: 0.33 ms")
    cand, ref = _track(trace, 1), _track(trace, 2)
    assert [e["name"] for e in cand] == ["_softmax.1", "copy.2"]  # in the order the program runs them
    assert [e["name"] for e in ref] == ["fusion.1", "fusion", "reduce_max.7"]
    for events, program in ((cand, profile["candidate"]), (ref, profile["reference"])):
        assert sum(e["dur"] for e in events) == pytest.approx(program["seconds"] * 1e6)
        for before, after in zip(events, events[1:], strict=False):  # one after another, no overlap
            assert after["ts"] == pytest.approx(before["ts"] + before["dur"])
    kernel = cand[0]
    assert kernel["cat"] == "kernel" and kernel["args"]["grid"] == [64] and kernel["args"]["share"] == "88.9%"
    assert "grid" not in cand[1]["args"]
    meta = trace["otherData"]
    assert (meta["task"], meta["target"], meta["method"], meta["band"]) == ("softmax", "v6e", "estimated", [1.6, 2.5])
    assert meta["speedup"] == pytest.approx(330 / 180) and "estimated without a TPU" in meta["how"]
    roofline = _track(trace, 3)
    assert len(roofline) == 1 and roofline[0]["dur"] == pytest.approx(150.0)


def test_an_estimate_raised_to_the_roofline_shows_the_difference() -> None:
    profile = estimated([("_softmax.1", 100_000)], [("fusion", 300_000)])
    profile["candidate"]["seconds"] = 150e-6  # the model said 100 us, below the 150 us roofline
    cand = _track(_load(profile), 1)
    assert [e["name"] for e in cand] == ["_softmax.1", RAISED]
    assert cand[1]["ts"] == pytest.approx(100.0) and cand[1]["dur"] == pytest.approx(50.0)


def test_a_measured_program_is_one_event_with_its_spread() -> None:
    profile = estimated([], [])
    profile.update(method="measured", candidate={"seconds": 200e-6, "spread": 1e-6, "ops": []},
                   reference={"seconds": 400e-6, "spread": 2e-6, "ops": []})
    trace = _load(profile)
    (cand,), (ref,) = _track(trace, 1), _track(trace, 2)
    assert cand["dur"] == pytest.approx(200.0) and ref["dur"] == pytest.approx(400.0)
    assert cand["args"]["spread_ms"] == pytest.approx(1e-3) and trace["otherData"]["method"] == "measured"


def test_ops_stored_as_static_cycles_are_fitted_within_the_programs_time() -> None:
    profile = estimated([("_softmax.1", 100_000)], [("fusion", 300_000)])
    profile["candidate"]["ops"] = [("_softmax.1", 171_245), ("copy", 300_000)]  # an older profile: cycles
    cand = _track(_load(profile), 1)
    assert sum(e["dur"] for e in cand) == pytest.approx(100.0)
