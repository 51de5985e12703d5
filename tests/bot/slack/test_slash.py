"""`/kernel` command parsing: every command, its options, and clear errors with the closest match."""

from __future__ import annotations

import pytest

from bot.slack.slash import COMMANDS, Command, UsageError, help_text, parse


def test_commands_parse_with_their_arguments_and_options() -> None:
    assert parse("") == Command("help", {}, {})
    assert parse("new softmax --target v5e") == Command("new", {"task": "softmax"}, {"target": "v5e"})
    assert parse("new") == Command("new", {}, {})
    assert parse("search matmul_bf16 --strategy=parallel --budget 20") == Command(
        "search", {"task": "matmul_bf16"}, {"strategy": "parallel", "budget": 20})
    assert parse("AUTO softmax --brain offline").options == {"brain": "offline"}
    assert parse("schedule add softmax '0 2 * * *'").args == {"action": "add", "task": "softmax",
                                                              "cron": "0 2 * * *"}
    assert parse("digest preview").args == {"action": "preview"}
    assert parse("digest subscribe").args == {"action": "subscribe"} and parse("digest").args == {}


@pytest.mark.parametrize("text, message", [
    ("serch softmax", "Did you mean `search`?"),
    ("search", "needs a task"),
    ("search softmax --budjet 3", "Did you mean `--budget`?"),
    ("auto softmax --budget many", "positive whole number"),
    ("new softmax --target v7x", "must be one of v5e, v6e, v5p"),
    ("search softmax --strategy bean", "Did you mean `beam`?"),
    ("show", "needs a session"),
    ("cancel a b", "takes 1 argument(s), not 2"),
    ("new 'unclosed", "could not read"),
    ("search softmax --budget", "needs a value"),
])
def test_malformed_commands_get_a_message_that_helps(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(text)


def test_help_lists_every_command() -> None:
    text = help_text()
    assert all(f"/kernel {name}" in text for name in COMMANDS)
    assert "mentions me" in text and "`redirect:`" in text  # how a thread reply steers, and that others do not
