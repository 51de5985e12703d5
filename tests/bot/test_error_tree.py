"""The one tree of errors people see (`storage.errors`): every class in it names a next step, and both surfaces -
the terminal's `run_command` and Slack's `/kernel` answer - show a tree error's message and next step, while an
ordinary exception stays an unexpected error there."""

from __future__ import annotations

import importlib
import json
import pkgutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import typer

import storage.errors
from bot.cli.common import run_command
from bot.slack.listeners.commands import answer
from storage.errors import KernelbotError, explain

PACKAGES = ("storage", "tpu_runner", "agents", "bot")
MESSAGE = "the value 7 is not one kernelbot takes"


def _import_everything() -> None:
    """Every module of the four packages, so that every subclass of KernelbotError exists to be found."""
    for name in PACKAGES:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, f"{name}."):
            if not module.name.endswith("__main__"):
                importlib.import_module(module.name)


def _subclasses(kind: type) -> Iterator[type]:
    for sub in kind.__subclasses__():
        yield sub
        yield from _subclasses(sub)


_import_everything()
TREE = sorted({kind for kind in _subclasses(KernelbotError) if kind.__module__.split(".")[0] in PACKAGES},
              key=lambda kind: (kind.__module__, kind.__name__))


def test_the_tree_holds_the_errors_both_surfaces_used_to_list() -> None:
    names = {kind.__name__ for kind in TREE}
    assert {"TaskError", "KernelFileError", "ChipBusy", "UnknownTarget", "SettingsError", "SchemaOutdated",
            "SchemaNewer", "JobNotFound", "BrainUnavailable", "SessionStopped", "SlackSettingsError",
            "PortUnavailable", "BrainError", "UsageError", "SearchError", "DecisionRejected",
            "ChannelUnavailable", "SourceError", "CronError"} <= names


@pytest.mark.parametrize("kind", TREE, ids=lambda kind: kind.__name__)
def test_every_error_people_see_names_a_next_step(kind: type[KernelbotError]) -> None:
    assert kind.next_step.strip(), f"{kind.__module__}.{kind.__name__} says nothing about what to do next"
    assert kind(MESSAGE).next_step == kind.next_step
    assert kind.__name__ in (storage.errors.__doc__ or ""), "storage/errors.py lays out the tree: add it there"


def test_the_errors_code_catches_by_their_builtin_kind_still_are_that_kind() -> None:
    kinds = {kind.__name__: kind for kind in TREE}
    assert issubclass(kinds["TaskError"], ValueError) and issubclass(kinds["UnknownTarget"], ValueError)
    assert issubclass(kinds["JobNotFound"], LookupError) and issubclass(kinds["BrainError"], RuntimeError)


def test_a_raise_that_knows_better_names_its_own_next_step() -> None:
    kinds = {kind.__name__: kind for kind in TREE}
    task_error = kinds["TaskError"]("no reference.py in /tmp/x", next_step="write reference.py")
    assert task_error.next_step == "write reference.py" and kinds["TaskError"].next_step != "write reference.py"
    assert explain(task_error) == "no reference.py in /tmp/x\nNext: write reference.py"
    brain_error = kinds["BrainError"]("the key was refused", "check ANTHROPIC_API_KEY")  # its positional form
    assert brain_error.next_step == "check ANTHROPIC_API_KEY" and str(brain_error) == "the key was refused"


# -- the terminal ------------------------------------------------------------------------------------------------

def _fail_with(exc: Exception, *, as_json: bool = False) -> int:
    def body() -> int:
        raise exc
    with pytest.raises(typer.Exit) as exited:
        run_command(body, as_json=as_json)
    return exited.value.exit_code


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KERNELBOT_HOME", str(tmp_path))
    monkeypatch.delenv("KERNELBOT_DEBUG", raising=False)
    return tmp_path


@pytest.mark.parametrize("kind", TREE, ids=lambda kind: kind.__name__)
def test_the_terminal_shows_the_message_and_the_next_step(kind: type[KernelbotError], home: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert _fail_with(kind(MESSAGE)) == 2
    err = capsys.readouterr().err
    assert f"error: {MESSAGE}\nnext: {kind.next_step}\n" in err
    assert "unexpected" not in err and not (home / "logs" / "errors.log").exists()


def test_the_terminal_shows_a_raises_own_next_step_and_says_it_as_json_too(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kinds = {kind.__name__: kind for kind in TREE}
    assert _fail_with(kinds["ChipBusy"](MESSAGE, next_step="wait for job 12"), as_json=True) == 2
    out, err = capsys.readouterr()
    assert "next: wait for job 12" in err
    assert json.loads(out) == {"error": MESSAGE, "next": "wait for job 12", "exit_code": 2}


def test_the_terminal_keeps_an_ordinary_exception_unexpected(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _fail_with(RuntimeError("boom")) == 2
    err = capsys.readouterr().err
    assert "error: unexpected RuntimeError: boom" in err and "next: report error " in err
    assert "Traceback (most recent call last)" in (home / "logs" / "errors.log").read_text()


# -- Slack -------------------------------------------------------------------------------------------------------

@dataclass
class _Raising:
    """KernelCommands as `answer` uses it: running any command raises `exc`."""
    exc: Exception

    def run(self, parsed: object, *, user: str, channel: str) -> str:
        raise self.exc


@dataclass
class _Told:
    status_code: int = 200
    body: str = "ok"


@dataclass
class _ResponseUrl:
    """The command's response_url, taking every answer."""
    answers: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, **message: Any) -> _Told:
        self.answers.append(message)
        return _Told()


def _slack_answer(exc: Exception) -> str:
    from bot.slack.slash import parse

    respond = _ResponseUrl()
    answer(_Raising(exc), parse("status"), user="U1", channel="C1", text="status", client=None,  # type: ignore[arg-type]
           respond=respond)  # type: ignore[arg-type]
    (told,) = respond.answers
    assert told["response_type"] == "ephemeral"
    return told["text"]


@pytest.mark.parametrize("kind", TREE, ids=lambda kind: kind.__name__)
def test_slack_shows_the_message_and_the_next_step(kind: type[KernelbotError]) -> None:
    assert _slack_answer(kind(MESSAGE)) == f"{MESSAGE}\nNext: {kind.next_step}"


def test_slack_keeps_an_ordinary_exception_unexpected(caplog: pytest.LogCaptureFixture) -> None:
    text = _slack_answer(RuntimeError("boom at /srv/secret"))
    assert text == "Something went wrong on our side (RuntimeError); it is in kernelbot's log."
    assert any(record.exc_info for record in caplog.records)  # the traceback went to the log
