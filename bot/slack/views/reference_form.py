"""The `/kernel new` form for a pasted reference, as pure functions: the modal, its parsed submission, the problems
Slack can show next to each input before anything runs, the task files it becomes, and the views that follow
(checking, started)."""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from agents.brains import BRAINS
from bot.slack.views.kit import (
    ACTION,
    context,
    modal,
    option,
    section,
    text,
    text_input,
    unfenced,
)
from tpu_runner.hardware import CHIPS
from tpu_runner.tasks import CHECK_SECONDS, ReferenceCheck
from tpu_runner.tasks import parse as parse_source

REFERENCE_CALLBACK = "new_reference"
CHECKING_CALLBACK = "new_reference_checking"
STARTED_CALLBACK = "new_reference_started"
NAME, REFERENCE, ATOL, RTOL, TARGET, BRAIN = "name", "reference", "atol", "rtol", "target", "brain"
REFERENCE_MAX_CHARS = 3000  # Slack's limit for a plain_text_input
NAME_MAX_CHARS = 48
DEFAULT_TOLERANCE = "1e-3"
_NAME = re.compile(rf"[a-z][a-z0-9_]{{0,{NAME_MAX_CHARS - 1}}}")
_TITLE = "New kernel task"
_SHOWN_CONFIGURATIONS = 10


@dataclass(frozen=True)
class ReferenceSubmission:
    name: str
    reference: str  # as pasted, without a surrounding ``` fence, ending in one newline
    atol: str  # as typed: checked by static_problems, read by tolerances()
    rtol: str
    target: str
    brain: str | None  # None: the deployment's default brain
    channel: str

    def tolerances(self) -> tuple[float, float]:
        """(atol, rtol); only for a submission without static problems."""
        return float(self.atol), float(self.rtol)


# --- rendering ---------------------------------------------------------------------------------------------------










def _target_options() -> list[dict[str, Any]]:
    return [option(name, f"{name} ({chip.device_kind})") for name, chip in CHIPS.items()]


def _brain_options() -> list[dict[str, Any]]:
    labels = {"offline": "offline (templates, no LLM)", "anthropic": "anthropic (Claude)"}
    return [option(name, labels.get(name, name)) for name in BRAINS]




def _select(block_id: str, label: str, options: list[dict[str, Any]], *, selected: str | None, optional: bool,
            hint: str | None = None) -> dict[str, Any]:
    element: dict[str, Any] = {"type": "static_select", "action_id": ACTION, "options": options,
                               "placeholder": text("Choose")}
    initial = next((o for o in options if o["value"] == selected), None)
    if initial:
        element["initial_option"] = initial
    block: dict[str, Any] = {"type": "input", "block_id": block_id, "label": text(label), "element": element,
                             "optional": optional}
    if hint:
        block["hint"] = text(hint)
    return block


def reference_form(*, channel: str, values: ReferenceSubmission | None = None, error: str | None = None,
                   target: str = "v6e") -> dict[str, Any]:
    """The modal; with `values` it shows what was typed, with `error` why the last submission did not start."""
    blocks: list[dict[str, Any]] = []
    if error:
        blocks.append(section(f":warning: *The reference did not pass the check; nothing was started.* Fix it below "
                               f"and submit again.\n```{error[:2600]}```"))
    blocks.append(context("A JaxBench reference: `computation(*dynamic, *static)` in pure JAX and `get_inputs()` "
                           "returning `([arrays], [static args])` (or a list of such pairs); optionally "
                           "`get_test_inputs()` with small inputs for the correctness check. It is checked in a "
                           f"sandbox (up to {CHECK_SECONDS} s) before the session starts."))
    blocks += [
        text_input(NAME, "Task name", value=values.name if values else None, max_length=NAME_MAX_CHARS,
                    placeholder="my_softmax",
                    hint="Lowercase letters, digits and underscores. `/kernel new NAME` finds the task later."),
        text_input(REFERENCE, "Reference (reference.py)", value=values.reference if values else None,
                    multiline=True, max_length=REFERENCE_MAX_CHARS,
                    placeholder="def computation(x): ...  def get_inputs(): return [x], []"),
        text_input(ATOL, "Absolute tolerance (atol)", value=values.atol if values else DEFAULT_TOLERANCE,
                    max_length=32),
        text_input(RTOL, "Relative tolerance (rtol)", value=values.rtol if values else DEFAULT_TOLERANCE,
                    max_length=32),
        _select(TARGET, "Target", _target_options(), selected=values.target if values else target, optional=False),
        _select(BRAIN, "Brain", _brain_options(), selected=values.brain if values else None, optional=True,
                hint="Empty: anthropic when this deployment has an API key, else offline."),
    ]
    return modal(callback_id=REFERENCE_CALLBACK, title=_TITLE, submit="Check and start",
                 private_metadata=json.dumps({"channel": channel}), blocks=blocks)


def checking_view(submission: ReferenceSubmission) -> dict[str, Any]:
    return modal(callback_id=CHECKING_CALLBACK, title=_TITLE, close="Close",
                 private_metadata=json.dumps({"channel": submission.channel}), blocks=[
                     section(f":hourglass_flowing_sand: Checking *{submission.name}*: importing the reference, "
                             f"tracing `get_inputs()` and `computation` in a sandbox (up to {CHECK_SECONDS} s)."),
                     context("This view changes when the check is done: to the started session, or back to the form "
                             "with what went wrong.")])


def started_view(session_id: str, *, submission: ReferenceSubmission, brain: str,
                 check: ReferenceCheck) -> dict[str, Any]:
    pairs = [f"• `{args}` → `{out}`" for args, out in zip(check.shapes, check.outputs, strict=False)]
    if len(pairs) > _SHOWN_CONFIGURATIONS:
        pairs = [*pairs[:_SHOWN_CONFIGURATIONS], f"• … and {len(pairs) - _SHOWN_CONFIGURATIONS} more"]
    tested = (f"`computation` ran on {check.tested} `get_test_inputs()` configuration(s)." if check.tested else
              "No `get_test_inputs()`: the evaluator derives small inputs from `get_inputs()` for correctness.")
    blocks = [
        section(f":white_check_mark: Started HITL session `{session_id}` on *{submission.name}* "
                 f"({submission.target}, {brain} brain). Its plan comes to a thread in <#{submission.channel}>: "
                 "approve or redirect it there."),
        section("*Inputs → outputs* (`get_inputs()` traced, `computation` on its shapes):\n" + "\n".join(pairs)),
        context(" ".join([tested, *check.notes])),
        context(f"The task is saved: `/kernel new {submission.name}` starts another session on it."),
    ]
    return modal(callback_id=STARTED_CALLBACK, title=_TITLE, close="Close",
                 private_metadata=json.dumps({"channel": submission.channel, "session": session_id}), blocks=blocks)


# --- reading and checking a submission ----------------------------------------------------------------------------




def parse_submission(view: dict[str, Any]) -> ReferenceSubmission:
    meta = json.loads(view.get("private_metadata") or "{}")
    values = (view.get("state") or {}).get("values") or {}

    def text(block: str) -> str:
        return str(((values.get(block) or {}).get(ACTION) or {}).get("value") or "")

    def selected(block: str) -> str | None:
        option = ((values.get(block) or {}).get(ACTION) or {}).get("selected_option") or {}
        return option.get("value") or None

    return ReferenceSubmission(name=text(NAME).strip(), reference=unfenced(text(REFERENCE).replace("\r\n", "\n")),
                               atol=text(ATOL).strip(), rtol=text(RTOL).strip(), target=selected(TARGET) or "",
                               brain=selected(BRAIN), channel=str(meta.get("channel", "")))


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _reference_problem(code: str) -> str | None:
    if not code.strip():
        return "Paste the reference: computation(...) and get_inputs() in pure JAX."
    try:
        tree = parse_source(code, filename="reference.py")
    except SyntaxError as exc:
        where = f"Line {exc.lineno}: " if exc.lineno else ""
        shown = f" in: {exc.text.strip()[:80]}" if exc.text and exc.text.strip() else ""
        return f"{where}syntax error: {exc.msg}{shown}"
    missing = [name for name in ("computation", "get_inputs") if name not in _top_level_names(tree)]
    if missing:
        return (f"The reference defines no {' and no '.join(missing)} at top level: it needs "
                "def computation(*dynamic, *static) and def get_inputs() returning ([arrays], [static args]).")
    return None


def _tolerance_problem(name: str, raw: str) -> str | None:
    try:
        value = float(raw)
    except ValueError:
        return f"{name} must be a number such as 1e-3; got {raw!r}."
    if not math.isfinite(value) or value < 0:
        return f"{name} must be a non-negative finite number such as 1e-3; got {raw!r}."
    return None


def task_files(submission: ReferenceSubmission) -> dict[str, str]:
    """reference.py and kernel_task.yaml for a submission without static problems."""
    try:
        docstring = ast.get_docstring(parse_source(submission.reference)) or ""
    except SyntaxError:
        docstring = ""
    description = docstring.strip().splitlines()[0] if docstring.strip() else "A reference pasted into Slack."
    atol, rtol = submission.tolerances()
    meta = {"task_id": submission.name, "description": description, "atol": atol, "rtol": rtol}
    return {"reference.py": submission.reference, "kernel_task.yaml": yaml.safe_dump(meta, sort_keys=False)}


def static_problems(submission: ReferenceSubmission, *, existing: Mapping[str, str] | None = None) -> dict[str, str]:
    """Block id -> what is wrong, for Slack to show next to the input (`response_action: "errors"`); nothing runs.

    `existing` holds the files of a task that already has this name, if one does: submitting the same task again
    is fine, taking its name for another is not."""
    problems: dict[str, str] = {}
    if not submission.name:
        problems[NAME] = "Give the task a name, e.g. my_softmax."
    elif not _NAME.fullmatch(submission.name):
        problems[NAME] = (f"{submission.name!r} is not a task name: use lowercase letters, digits and underscores, "
                          f"starting with a letter, at most {NAME_MAX_CHARS} characters (e.g. my_softmax).")
    reference = _reference_problem(submission.reference)
    if reference:
        problems[REFERENCE] = reference
    for block, label, raw in ((ATOL, "atol", submission.atol), (RTOL, "rtol", submission.rtol)):
        tolerance = _tolerance_problem(label, raw)
        if tolerance:
            problems[block] = tolerance
    if submission.target not in CHIPS:
        problems[TARGET] = f"Choose a target: one of {', '.join(CHIPS)}."
    if submission.brain is not None and submission.brain not in BRAINS:
        problems[BRAIN] = f"Choose a brain: one of {', '.join(BRAINS)}, or none for the default."
    if existing is not None and NAME not in problems:
        same = (existing.get("reference.py") == submission.reference if ATOL in problems or RTOL in problems
                else dict(existing) == task_files(submission))
        if not same:
            problems[NAME] = (f"A task named {submission.name} already exists with different content: choose another "
                              f"name, or close this and run /kernel new {submission.name} to start on it.")
    return problems
