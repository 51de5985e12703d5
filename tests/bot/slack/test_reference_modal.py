"""`/kernel new` without a task: the form to paste a reference (pure rendering, parsing and static problems), then
end to end through the real Bolt app over signed HTTP against the fake Slack Web API."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, select

from agents.session_jobs import hitl_advance_job
from bot.slack.views.reference_form import (
    ATOL,
    BRAIN,
    NAME,
    REFERENCE,
    REFERENCE_CALLBACK,
    RTOL,
    STARTED_CALLBACK,
    TARGET,
    ReferenceSubmission,
    checking_view,
    parse_submission,
    reference_form,
    started_view,
    static_problems,
    task_files,
)
from storage.connect import open_database
from storage.models import Job, KernelSession
from storage.settings import Settings, load_settings
from tests.support.bot import Served, bot_app
from tests.support.slack_http import command, submit_view
from tpu_runner.hardware import CHIPS
from tpu_runner.jobs import JobContext, JobRejected
from tpu_runner.tasks import ReferenceCheck, files_digest, read_task_files

GOOD = '''\
"""Scaled tanh."""
import jax
import jax.numpy as jnp


def computation(x, scale):
    return jnp.tanh(x) * scale


def get_inputs():
    return [jax.random.normal(jax.random.PRNGKey(0), (256, 512), jnp.float32)], [2.0]


def get_test_inputs():
    return [jax.random.normal(jax.random.PRNGKey(1), (8, 128), jnp.float32)], [2.0]
'''

INPUTS_RAISE = '''\
import jax.numpy as jnp


def computation(x):
    return jnp.exp(x)


def get_inputs():
    return [jnp.ones(shape)], []
'''

SYNTAX_ERROR = '''\
import jax.numpy as jnp


def computation(x)
    return x
'''


def submission(**changes: Any) -> ReferenceSubmission:
    base = ReferenceSubmission(name="scaled_tanh", reference=GOOD, atol="1e-3", rtol="1e-3", target="v6e",
                               brain=None, channel="C1")
    return replace(base, **changes)


def state(sub: ReferenceSubmission) -> dict[str, dict[str, dict[str, Any]]]:
    """The `state.values` Slack sends for a form filled in with `sub`."""
    def text(value: str) -> dict[str, dict[str, Any]]:
        return {"value": {"type": "plain_text_input", "value": value}}

    def select(value: str | None) -> dict[str, dict[str, Any]]:
        option = {"text": {"type": "plain_text", "text": value}, "value": value} if value else None
        return {"value": {"type": "static_select", "selected_option": option}}

    return {NAME: text(sub.name), REFERENCE: text(sub.reference), ATOL: text(sub.atol), RTOL: text(sub.rtol),
            TARGET: select(sub.target), BRAIN: select(sub.brain)}


def blocks_by_id(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {b["block_id"]: b for b in view["blocks"] if "block_id" in b}


def all_text(view: dict[str, Any]) -> str:
    return json.dumps(view["blocks"], ensure_ascii=False)


# --- the form, pure --------------------------------------------------------------------------------------------------


def test_the_form_asks_for_every_field_within_slacks_limits() -> None:
    view = reference_form(channel="C9", target="v5e")
    assert view["callback_id"] == REFERENCE_CALLBACK and json.loads(view["private_metadata"]) == {"channel": "C9"}
    for label in (view["title"], view["submit"], view["close"]):
        assert len(label["text"]) <= 24
    inputs = blocks_by_id(view)
    assert list(inputs) == [NAME, REFERENCE, ATOL, RTOL, TARGET, BRAIN]
    assert inputs[REFERENCE]["element"]["multiline"] and inputs[REFERENCE]["element"]["max_length"] == 3000
    assert inputs[ATOL]["element"]["initial_value"] == "1e-3" == inputs[RTOL]["element"]["initial_value"]
    assert [o["value"] for o in inputs[TARGET]["element"]["options"]] == list(CHIPS)
    assert inputs[TARGET]["element"]["initial_option"]["value"] == "v5e"
    assert [o["value"] for o in inputs[BRAIN]["element"]["options"]] == ["anthropic", "offline"]
    assert inputs[BRAIN]["optional"] and "initial_option" not in inputs[BRAIN]["element"]
    assert "initial_value" not in inputs[NAME]["element"] and ":warning:" not in all_text(view)


def test_a_form_shown_again_keeps_what_was_typed_and_says_what_went_wrong() -> None:
    typed = submission(atol="1e-5", rtol="2e-4", target="v5p", brain="offline")
    view = reference_form(channel="C1", values=typed, error="Line 9: get_inputs() raised NameError: name 'shape'")
    inputs = blocks_by_id(view)
    assert inputs[NAME]["element"]["initial_value"] == "scaled_tanh"
    assert inputs[REFERENCE]["element"]["initial_value"] == GOOD
    assert (inputs[ATOL]["element"]["initial_value"], inputs[RTOL]["element"]["initial_value"]) == ("1e-5", "2e-4")
    assert inputs[TARGET]["element"]["initial_option"]["value"] == "v5p"
    assert inputs[BRAIN]["element"]["initial_option"]["value"] == "offline"
    first = view["blocks"][0]["text"]["text"]
    assert "nothing was started" in first and "Line 9: get_inputs() raised NameError" in first
    # What Slack sends back for the form parses to what was typed.
    assert parse_submission({**view, "state": {"values": state(typed)}}) == typed


def test_parsing_strips_a_pasted_code_fence_and_reads_an_empty_brain_as_the_default() -> None:
    fenced = submission(reference="```python\n" + GOOD + "```\n")
    parsed = parse_submission({**reference_form(channel="C7"), "state": {"values": state(fenced)}})
    assert parsed.reference == GOOD and parsed.brain is None and parsed.channel == "C7"


def test_static_problems_name_the_input_and_the_fix() -> None:
    assert static_problems(submission()) == {}
    problems = static_problems(submission(reference=SYNTAX_ERROR))
    assert list(problems) == [REFERENCE] and problems[REFERENCE].startswith("Line 4: syntax error")
    no_inputs = GOOD.replace("def get_inputs", "def make_inputs")
    assert "no get_inputs at top level" in static_problems(submission(reference=no_inputs))[REFERENCE]
    nested = "def helper():\n    def computation(x):\n        return x\n\n\ndef get_inputs():\n    return [], []\n"
    assert "no computation at top level" in static_problems(submission(reference=nested))[REFERENCE]
    assert "Paste the reference" in static_problems(submission(reference=""))[REFERENCE]
    assert "'My-Task' is not a task name" in static_problems(submission(name="My-Task"))[NAME]
    assert "Give the task a name" in static_problems(submission(name=""))[NAME]
    bad = static_problems(submission(atol="tight", rtol="-1"))
    assert bad[ATOL] == "atol must be a number such as 1e-3; got 'tight'."
    assert "rtol must be a non-negative finite number" in bad[RTOL]
    assert TARGET in static_problems(submission(target=""))


def test_a_name_already_taken_by_other_content_is_refused_but_the_same_task_again_is_not() -> None:
    files = task_files(submission())
    assert static_problems(submission(), existing=files) == {}
    taken = static_problems(submission(atol="1e-2"), existing=files)
    assert list(taken) == [NAME] and "already exists with different content" in taken[NAME]
    assert "/kernel new scaled_tanh" in taken[NAME]


def test_task_files_are_a_loadable_task() -> None:
    files = task_files(submission(atol="1e-5", rtol="2e-4"))
    assert files["reference.py"] == GOOD
    assert "task_id: scaled_tanh" in files["kernel_task.yaml"] and "atol: 1.0e-05" in files["kernel_task.yaml"]
    assert "description: Scaled tanh." in files["kernel_task.yaml"]


def test_the_checking_and_started_views_say_what_happens() -> None:
    checking = checking_view(submission())
    assert "submit" not in checking and "Checking *scaled_tanh*" in all_text(checking)
    check = ReferenceCheck(ok=True, shapes=("float32[256,512], 2.0",), outputs=("float32[256,512]",), tested=1)
    started = started_view("s-123", submission=submission(), brain="offline", check=check)
    text = all_text(started)
    assert started["callback_id"] == STARTED_CALLBACK and "submit" not in started
    assert "s-123" in text and "<#C1>" in text and "offline brain" in text
    assert "`float32[256,512], 2.0` → `float32[256,512]`" in text and "ran on 1" in text


# --- end to end ----------------------------------------------------------------------------------------------------


@pytest.fixture
def served_app(tmp_path: Path) -> Iterator[Served]:
    with bot_app(tmp_path / "home") as app:
        yield app


def open_form(app: Served, channel: str = "C1") -> dict[str, Any]:
    status, _ = command(app.url, "new", fake=app.fake, channel=channel, trigger_id="trigger-42", answered=False)
    assert status == 200
    deadline = time.monotonic() + 10
    while not any(method == "views.open" for method, _ in app.fake.calls) and time.monotonic() < deadline:
        time.sleep(0.02)  # the command is acked first, the form opened right after
    opened = [args for method, args in app.fake.calls if method == "views.open"]
    assert opened and opened[-1]["trigger_id"] == "trigger-42"
    view = app.fake.views[sorted(app.fake.views)[-1]]
    assert view["callback_id"] == REFERENCE_CALLBACK
    return view


def updated_view(app: Served, view_id: str, timeout: float = 90.0) -> dict[str, Any]:
    """The view once the background check has updated it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(method == "views.update" and args.get("view_id") == view_id for method, args in app.fake.calls):
            return app.fake.views[view_id]
        time.sleep(0.1)
    raise AssertionError(f"view {view_id} was not updated within {timeout} s")


def sessions_of(settings: Settings) -> list[KernelSession]:
    with Session(open_database(settings)) as s:
        return list(s.exec(select(KernelSession)).all())


def test_kernel_new_opens_the_form_and_a_syntax_error_is_shown_in_it(served_app: Served) -> None:
    view = open_form(served_app)
    assert json.loads(view["private_metadata"]) == {"channel": "C1"}
    status, body = submit_view(served_app.url, view, state(submission(reference=SYNTAX_ERROR)))
    assert status == 200 and body["response_action"] == "errors"
    assert body["errors"][REFERENCE].startswith("Line 4: syntax error")
    assert not any(method == "views.update" for method, _ in served_app.fake.calls)
    assert sessions_of(served_app.settings) == []


def test_a_reference_from_a_channel_the_bot_cannot_post_to_starts_nothing(served_app: Served) -> None:
    served_app.fake.add_channel("GSECRET", private=True, members=("U1",), bot=False)
    view = open_form(served_app, channel="GSECRET")
    status, body = submit_view(served_app.url, view, state(submission()))
    assert status == 200 and body["response_action"] == "update"
    final = updated_view(served_app, view["id"], timeout=10)
    assert final["callback_id"] == REFERENCE_CALLBACK
    text = all_text(final)
    assert "invite me with `/invite @kernelbot`" in text and "Nothing was started." in text
    assert not (served_app.settings.home / "tasks" / "scaled_tanh").exists()  # not checked, not saved
    assert sessions_of(served_app.settings) == []


def test_a_good_reference_starts_a_hitl_session_that_runners_elsewhere_can_load(served_app: Served,
                                                                                tmp_path: Path) -> None:
    view = open_form(served_app)
    pasted = submission(brain="anthropic", target="v5e")
    status, body = submit_view(served_app.url, view, state(pasted), user="U7")
    assert status == 200 and body["response_action"] == "update"
    assert "Checking *scaled_tanh*" in all_text(body["view"])
    final = updated_view(served_app, view["id"])
    assert final["callback_id"] == STARTED_CALLBACK, all_text(final)
    [record] = sessions_of(served_app.settings)
    task_dir = served_app.settings.home / "tasks" / "scaled_tanh"
    assert (record.mode, record.owner, record.slack_channel, record.task, record.target) == (
        "hitl", "U7", "C1", "scaled_tanh", "v5e")
    assert Path(record.task_dir or "") == task_dir.resolve()
    assert record.budget and record.budget["brain"] == "anthropic" and record.budget["iterations"] == 5
    assert record.budget["task_files"] == read_task_files(task_dir) == task_files(pasted)
    text = all_text(final)
    assert record.id in text and "`float32[256,512], 2.0` → `float32[256,512]`" in text
    with Session(open_database(served_app.settings)) as s:
        jobs = s.exec(select(Job).where(Job.session_id == record.id)).all()
    assert [(j.kind, j.status, j.payload) for j in jobs] == [
        ("hitl_advance", "queued", {"session_id": record.id, "fails_session": True})]
    # The pasted task is a task like any other now.
    started = command(served_app.url, "new scaled_tanh --brain offline", fake=served_app.fake)[1]["text"]
    assert "Started HITL session" in started

    # A runner on another host (its own KERNELBOT_HOME, the same database) writes the task from the session.
    runner = load_settings({"KERNELBOT_HOME": str(tmp_path / "runner-home"),
                            "KERNELBOT_DATABASE_URL": served_app.settings.database})
    task_dir.rename(tmp_path / "moved-away")
    with pytest.raises(JobRejected, match="ANTHROPIC_API_KEY"):  # that runner has no key; the task was found first
        hitl_advance_job(JobContext(settings=runner, runner_id="r2", job_id=jobs[0].id or 0),
                         {"session_id": record.id})
    written = runner.home / "tasks" / f"scaled_tanh-{files_digest(task_files(pasted))}"
    assert read_task_files(written) == task_files(pasted)


def test_a_reference_whose_get_inputs_raises_gets_the_form_back_and_starts_nothing(served_app: Served) -> None:
    view = open_form(served_app)
    pasted = submission(name="broken_exp", reference=INPUTS_RAISE, atol="1e-4")
    status, body = submit_view(served_app.url, view, state(pasted))
    assert status == 200 and body["response_action"] == "update"
    final = updated_view(served_app, view["id"])
    assert final["callback_id"] == REFERENCE_CALLBACK
    error = final["blocks"][0]["text"]["text"]
    assert "nothing was started" in error
    assert "Line 9: get_inputs() raised NameError: name 'shape' is not defined" in error
    inputs = blocks_by_id(final)
    assert inputs[REFERENCE]["element"]["initial_value"] == INPUTS_RAISE
    assert (inputs[NAME]["element"]["initial_value"], inputs[ATOL]["element"]["initial_value"]) == ("broken_exp",
                                                                                                    "1e-4")
    assert sessions_of(served_app.settings) == []
    assert not (served_app.settings.home / "tasks" / "broken_exp").exists()
    assert list((served_app.settings.home / "staging").iterdir()) == []
