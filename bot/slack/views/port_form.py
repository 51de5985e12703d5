"""The `/kernel port` form, as pure functions: the modal (a name, a pasted snippet or an uploaded file, an optional
PyTorch reference for a CUDA or Triton source), its parsed submission, the problems Slack can show next to each
input before anything runs, and the views that follow (porting, ported with the two buttons that start a session,
started)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.porter import NAME_MAX_CHARS, SourceError, check_name, detect_kind
from bot.slack.views.kit import (
    ACTION,
    actions,
    button,
    context,
    modal,
    section,
    text,
    text_input,
    unfenced,
)
from tpu_runner.porting import PORT_SECONDS, PortResult
from tpu_runner.tasks import parse as parse_source

PORT_CALLBACK = "port_kernel"
PORTING_CALLBACK = "port_kernel_porting"
PORTED_CALLBACK = "port_kernel_ported"
STARTED_CALLBACK = "port_kernel_started"
NAME, SOURCE, FILE, TORCH_REFERENCE = "name", "source", "file", "torch_reference"
START_HITL, START_AUTO = "port_start_hitl", "port_start_auto"
MODES = {START_HITL: "hitl", START_AUTO: "auto"}
SOURCE_MAX_CHARS = 3000  # Slack's limit for a plain_text_input
FILE_MAX_BYTES = 1_000_000
FILE_TYPES = ("py", "cu", "cuh")
KINDS = {"pytorch": "PyTorch module", "cuda": "CUDA source", "triton": "Triton kernel"}
PASTED = "the paste"  # what a pasted source is called in messages about it
_TITLE = "Port a kernel"
_SHOWN_ARGUMENTS = 20


@dataclass(frozen=True)
class UploadedFile:
    id: str
    name: str


@dataclass(frozen=True)
class PortSubmission:
    name: str
    source: str  # as pasted, without a surrounding ``` fence, ending in one newline; "" when nothing was pasted
    files: tuple[UploadedFile, ...]  # what was uploaded (Slack file ids; the bytes are fetched in the background)
    torch_reference: str  # a PyTorch module of the same operation, for a CUDA or Triton source; "" when none
    channel: str

    @property
    def source_name(self) -> str:
        """What the source is called where people read it: the uploaded file's name, or `pasted`."""
        return self.files[0].name if self.files else "pasted"


# --- what a source is ----------------------------------------------------------------------------------------------


def source_kind(filename: str, text: str) -> tuple[str | None, str | None]:
    """(pytorch, cuda or triton; None) for a source `kernelbot port` reads, else (None, what it lacks)."""
    try:
        return detect_kind(Path(filename), text), None
    except SourceError as exc:
        return None, str(exc)


def paste_filename(name: str, source: str) -> str:
    """The file a pasted source is ported from: NAME.cu for CUDA, NAME.py otherwise."""
    return f"{name}.cu" if source_kind(PASTED, source)[0] == "cuda" else f"{name}.py"


def ported_from(existing: Mapping[str, str], source: str) -> bool:
    """Was the task with these files ported from `source`? (A ported reference quotes its source as comments.)"""
    quoted = "\n".join(f"# {line}".rstrip() for line in source.strip().splitlines())
    return bool(quoted) and quoted in existing.get("reference.py", "")


def name_taken(name: str, existing: Mapping[str, str] | None, source: str | None) -> str | None:
    """Why `name` cannot be used for this source (a task of that name holds something else), or None.
    `source` None: not known yet (an upload not fetched), so any existing task counts as another one."""
    if existing is None or (source is not None and ported_from(existing, source)):
        return None
    return (f"A task named {name} already exists with different content: choose another name, or close this and "
            f"run /kernel new {name} to start on it.")


# --- rendering -----------------------------------------------------------------------------------------------------










def _metadata(**values: str) -> str:
    return json.dumps(values)


def port_form(*, channel: str, values: PortSubmission | None = None, error: str | None = None) -> dict[str, Any]:
    """The modal; with `values` it shows what was typed, with `error` why the last submission was not ported."""
    blocks: list[dict[str, Any]] = []
    if error:
        again = " Upload the file again: Slack does not keep it in the form." if values and values.files else ""
        blocks.append(section(f":warning: *It was not ported; nothing was written.* Fix it below and submit again."
                               f"{again}\n```{error[:2500]}```"))
    blocks.append(context(
        "A PyTorch module in the KernelBench format (`class Model(nn.Module)` with `forward`, `get_inputs()` and "
        "`get_init_inputs()`) becomes a task whose JAX reference is the module's own program, through torchax, "
        "checked against PyTorch. A CUDA or Triton source is translated by the LLM brain; give the PyTorch module "
        "of the same operation to have the translation checked against it."))
    blocks += [
        text_input(NAME, "Task name", value=values.name if values else None, optional=False,
                    max_length=NAME_MAX_CHARS, placeholder="my_layernorm",
                    hint="Lowercase letters, digits and underscores. `/kernel new NAME` finds the task later."),
        text_input(SOURCE, "Paste the kernel", value=values.source if values else None, optional=True,
                    multiline=True, max_length=SOURCE_MAX_CHARS,
                    placeholder="class Model(nn.Module): ...  def get_inputs(): ...  def get_init_inputs(): ...",
                    hint=f"Up to {SOURCE_MAX_CHARS} characters; for a longer one, upload the file below."),
        {"type": "input", "block_id": FILE, "label": text("… or upload it"), "optional": True,
         "element": {"type": "file_input", "action_id": ACTION, "filetypes": list(FILE_TYPES), "max_files": 1},
         "hint": text(f"One .py (PyTorch or Triton) or .cu file, up to {FILE_MAX_BYTES // 1_000_000} MB.")},
        text_input(TORCH_REFERENCE, "PyTorch reference (for CUDA or Triton)",
                    value=values.torch_reference if values else None, optional=True, multiline=True,
                    max_length=SOURCE_MAX_CHARS, placeholder="class Model(nn.Module): ...",
                    hint="Optional. Without it the brain's JAX reference is not verified by an oracle."),
    ]
    return modal(callback_id=PORT_CALLBACK, title=_TITLE, submit="Port", private_metadata=_metadata(channel=channel),
                 blocks=blocks)


def porting_view(submission: PortSubmission) -> dict[str, Any]:
    if submission.files:
        what = f"fetching `{submission.source_name}` from Slack, then porting it"
    else:
        kind = source_kind(PASTED, submission.source)[0] or "pytorch"
        what = ("running the module in PyTorch and through torchax in a sandbox, then checking the written JAX "
                "reference against PyTorch" if kind == "pytorch" else
                f"the brain is writing a JAX reference from the {KINDS[kind]}")
    return modal(callback_id=PORTING_CALLBACK, title=_TITLE, close="Close",
                 private_metadata=_metadata(channel=submission.channel), blocks=[
                     section(f":hourglass_flowing_sand: Porting *{submission.name}*: {what} (up to {PORT_SECONDS} s)."),
                     context("This view changes when it is done: to the new task, with buttons to start a session on "
                             "it, or back to the form with what went wrong.")])


def start_value(*, task: str, channel: str) -> str:
    return json.dumps({"task": task, "channel": channel})


def read_start_value(raw: str) -> tuple[str, str]:
    """(task, channel) from a start button's value."""
    try:
        value = json.loads(raw)
        return str(value["task"]), str(value["channel"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"this button carries no task ({raw[:80]!r}); run /kernel port again") from exc


def _verification(result: PortResult) -> str:
    if result.verified_by and result.max_abs_err is not None:
        return (f"*Checked against PyTorch* through {result.verified_by}: max |diff| {result.max_abs_err:.3g} on the "
                "module's own weights and inputs.")
    return (":warning: *Not verified by an oracle*: no PyTorch reference was given, so the JAX reference the brain "
            "wrote was not checked against a run of the original. Read its `reference.py` before trusting results, "
            "or port it again with the PyTorch module beside it.")


def ported_view(result: PortResult, *, channel: str, kind: str, source_name: str) -> dict[str, Any]:
    """The new task: its signature, how it was checked, and buttons that start a session on it in `channel`."""
    arguments = [f"• `{a}`" for a in result.signature]
    if len(arguments) > _SHOWN_ARGUMENTS:
        arguments = [*arguments[:_SHOWN_ARGUMENTS], f"• … and {len(arguments) - _SHOWN_ARGUMENTS} more"]
    outputs = ", ".join(f"`{o}`" for o in result.outputs) or "none reported"
    value = start_value(task=result.name, channel=channel)
    blocks = [
        section(f":white_check_mark: Ported *{result.name}* from the {KINDS.get(kind, kind)} `{source_name}`. "
                 f"The task is saved: `/kernel new {result.name}` finds it later."),
        section("*Signature* (`computation`'s arguments):\n" + "\n".join(arguments) + f"\n*Returns* {outputs}"),
        section(_verification(result)),
    ]
    notes = [n for n in result.notes if not n.startswith("not verified by an oracle")]  # said above
    if notes:
        blocks.append(context(" ".join(notes)[:2000]))
    blocks.append(actions("start", [button("Start a HITL session", START_HITL, value, "primary"),
                                    button("Start an Auto session", START_AUTO, value)]))
    blocks.append(context(f"The session's thread goes to <#{channel}>."))
    return modal(callback_id=PORTED_CALLBACK, title=_TITLE, close="Close",
                 private_metadata=_metadata(channel=channel, task=result.name), blocks=blocks)


def started_view(session_id: str, *, mode: str, task: str, channel: str, target: str, brain: str) -> dict[str, Any]:
    if mode == "hitl":
        what = (f"Started HITL session `{session_id}` on *{task}* ({target}, {brain} brain). Its thread is in "
                f"<#{channel}>: approve or redirect its plan there.")
    else:
        what = (f"Started Auto session `{session_id}` on *{task}* ({target}, {brain} brain). Its thread is in "
                f"<#{channel}>: one message there follows each iteration, then the summary.")
    return modal(callback_id=STARTED_CALLBACK, title=_TITLE, close="Close",
                 private_metadata=_metadata(channel=channel, session=session_id), blocks=[
                     section(f":white_check_mark: {what}"),
                     context(f"`/kernel new {task}` or `/kernel auto {task}` starts another session on it.")])


def start_failed_view(*, task: str, error: str) -> dict[str, Any]:
    return modal(callback_id=STARTED_CALLBACK, title=_TITLE, close="Close",
                 blocks=[section(f":warning: No session was started on *{task}*: {error}")])


# --- reading and checking a submission ------------------------------------------------------------------------------




def parse_submission(view: dict[str, Any]) -> PortSubmission:
    meta = json.loads(view.get("private_metadata") or "{}")
    values = (view.get("state") or {}).get("values") or {}

    def state(block: str) -> dict[str, Any]:
        return (values.get(block) or {}).get(ACTION) or {}

    files = tuple(UploadedFile(id=str(f.get("id", "")), name=str(f.get("name") or f.get("title") or "upload"))
                  for f in state(FILE).get("files") or [] if f.get("id"))
    return PortSubmission(name=str(state(NAME).get("value") or "").strip(),
                          source=unfenced(str(state(SOURCE).get("value") or "")), files=files,
                          torch_reference=unfenced(str(state(TORCH_REFERENCE).get("value") or "")),
                          channel=str(meta.get("channel", "")))


def _syntax_problem(code: str, filename: str) -> str | None:
    try:
        parse_source(code, filename=filename)
    except SyntaxError as exc:
        where = f"Line {exc.lineno}: " if exc.lineno else ""
        shown = f" in: {exc.text.strip()[:80]}" if exc.text and exc.text.strip() else ""
        return f"{where}syntax error: {exc.msg}{shown}"
    return None


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def static_problems(submission: PortSubmission, *, existing: Mapping[str, str] | None = None) -> dict[str, str]:
    """Block id -> what is wrong, for Slack to show next to the input (`response_action: "errors"`); nothing runs.

    `existing` holds the files of a task that already has this name, if one does: porting the same source to it
    again is fine, taking its name for another is not (an upload is compared once it is fetched)."""
    problems: dict[str, str] = {}
    if not submission.name:
        problems[NAME] = "Give the task a name, e.g. my_layernorm."
    else:
        try:
            check_name(submission.name)
        except SourceError as exc:
            problems[NAME] = f"{exc} (e.g. my_layernorm)."
    pasted = bool(submission.source.strip())
    kind: str | None = None
    if not pasted and not submission.files:
        problems[SOURCE] = "Paste the kernel here, or upload its file below."
    elif pasted and submission.files:
        problems[FILE] = "Paste the kernel or upload it, not both: remove the file, or clear the box above."
    elif len(submission.files) > 1:
        problems[FILE] = "Upload one file: the module or kernel to port."
    elif submission.files and Path(submission.files[0].name).suffix.lower().lstrip(".") not in FILE_TYPES:
        problems[FILE] = (f"{submission.files[0].name} is not a kernel source kernelbot ports: upload a .py "
                          "(PyTorch or Triton) or a .cu file.")
    elif pasted:
        kind, unknown = source_kind(PASTED, submission.source)
        syntax = _syntax_problem(submission.source, "pasted.py") if kind != "cuda" else None
        if syntax or unknown:
            problems[SOURCE] = syntax or _sentence(str(unknown))
    if submission.torch_reference.strip():
        problems.update(_torch_reference_problem(submission.torch_reference, kind))
    if NAME not in problems and kind:
        taken = name_taken(submission.name, existing, submission.source)
        if taken:
            problems[NAME] = taken
    return problems


def torch_reference_refused(kind: str) -> str | None:
    """Why a PyTorch reference cannot go with a source of this kind, or None."""
    if kind == "pytorch":
        return ("The PyTorch reference is only for a CUDA or Triton source: a PyTorch module is checked against "
                "itself. Clear that box.")
    return None


def _torch_reference_problem(code: str, kind: str | None) -> dict[str, str]:
    refused = torch_reference_refused(kind) if kind else None
    if refused:
        return {TORCH_REFERENCE: refused}
    syntax = _syntax_problem(code, "torch_reference.py")
    if syntax:
        return {TORCH_REFERENCE: syntax}
    found, unknown = source_kind("the PyTorch reference", code)
    if found != "pytorch":
        return {TORCH_REFERENCE: _sentence(unknown) if unknown else
                "The PyTorch reference must be a PyTorch module (class Model(nn.Module)), not CUDA or Triton."}
    return {}
