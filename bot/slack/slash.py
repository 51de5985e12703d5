"""`/kernel` command text -> a parsed command, or a usage error that names the closest match.

Pure: no Slack here. The Slack app (`bot.slack.listeners.commands`) acks with the error's text as an ephemeral
message, or records the command and enqueues its work.
"""

from __future__ import annotations

import difflib
import shlex
from dataclasses import dataclass, field

from agents.search_decide import SEARCH_STRATEGIES
from bot.slack.thread_replies import REDIRECT_KEYWORD
from storage.errors import KernelbotError
from tpu_runner.hardware import CHIPS


@dataclass(frozen=True)
class Spec:
    usage: str
    summary: str
    positional: tuple[str, ...] = ()  # names of positional arguments, in order
    required: int = 0  # how many of them must be given
    options: dict[str, str] = field(default_factory=dict)  # --option -> kind: int | target | brain | strategy | text


_COMMON = {"--target": "target", "--brain": "brain"}
COMMANDS: dict[str, Spec] = {
    "help": Spec("help", "what /kernel can do"),
    "new": Spec("new [TASK] [--budget N] [--target T] [--brain B]", "start a HITL session in a thread (no task: "
                "paste a reference in a form)", ("task",), 0, {**_COMMON, "--budget": "int"}),
    "auto": Spec("auto TASK [--budget N] [--target T] [--brain B]", "optimise a task without people",
                 ("task",), 1, {**_COMMON, "--budget": "int"}),
    "search": Spec(f"search TASK [--strategy {'|'.join(SEARCH_STRATEGIES)}] [--budget N] [--target T] [--brain B]",
                   "search a graph of candidates", ("task",), 1, {**_COMMON, "--budget": "int",
                                                                  "--strategy": "strategy"}),
    "port": Spec("port", "turn a PyTorch module or a CUDA/Triton kernel into a task (opens a form)"),
    "status": Spec("status [SESSION]", "where a session (or every active one) stands", ("session",)),
    "list": Spec("list", "recent sessions"),
    "show": Spec("show SESSION", "a session's steps and best kernel", ("session",), 1),
    "cancel": Spec("cancel SESSION", "stop a session", ("session",), 1),
    "tasks": Spec("tasks", "the task suites"),
    "runners": Spec("runners", "the runner fleet"),
    "schedule": Spec('schedule [list] | add TASK "CRON" [--strategy S] [--budget N] [--target T] [--brain B] | '
                     "remove ID", "recurring autonomous searches", ("action", "task", "cron"), 0,
                     {**_COMMON, "--strategy": "strategy", "--budget": "int"}),
    "digest": Spec("digest [list] | subscribe | unsubscribe | preview | now", "where the daily digest goes; "
                   "subscribe or unsubscribe this channel; the digest so far (preview), or post it here now",
                   ("action",)),
}
_CHOICES = {"target": tuple(CHIPS), "brain": ("offline", "anthropic"), "strategy": SEARCH_STRATEGIES}


class UsageError(KernelbotError, ValueError):
    """A malformed command; the message is what the person sees (with the closest match when there is one)."""
    next_step = "`/kernel help` lists the commands and how to write them"


@dataclass(frozen=True)
class Command:
    name: str
    args: dict[str, str]
    options: dict[str, str | int]


def closest(word: str, choices: list[str]) -> str:
    """' Did you mean `X`?' for the choice nearest a mistyped word, or ''."""
    near = difflib.get_close_matches(word, choices, n=1, cutoff=0.5)
    return f" Did you mean `{near[0]}`?" if near else ""


def help_text() -> str:
    lines = ["*/kernel* - agents that write and tune TPU kernels in JAX Pallas:"]
    lines += [f"• `/kernel {spec.usage}` - {spec.summary}" for spec in COMMANDS.values()]
    lines.append(f"• In a session's thread, a reply that mentions me (`@kernelbot use rows of 64`) or starts with "
                 f"`{REDIRECT_KEYWORD}` redirects the agent; other replies are conversation and left alone")
    return "\n".join(lines)


def parse(text: str) -> Command:
    """Parse the text after `/kernel`. Raises UsageError with a message fit to show."""
    try:
        words = shlex.split(text.strip())
    except ValueError as exc:
        raise UsageError(f"I could not read that command ({exc}). Try `/kernel help`.") from None
    if not words:
        return Command("help", {}, {})
    name, rest = words[0].lower(), words[1:]
    spec = COMMANDS.get(name)
    if spec is None:
        raise UsageError(f"`{name}` is not a /kernel command.{closest(name, list(COMMANDS))} "
                         "`/kernel help` lists them.")
    positional: list[str] = []
    options: dict[str, str | int] = {}
    i = 0
    while i < len(rest):
        word = rest[i]
        if word.startswith("--"):
            option = word.split("=", 1)[0]
            if option not in spec.options:
                raise UsageError(f"`{name}` has no option `{option}`.{closest(option, list(spec.options))} "
                                 f"Usage: `/kernel {spec.usage}`")
            value = word.split("=", 1)[1] if "=" in word else (rest[i + 1] if i + 1 < len(rest) else None)
            if value is None:
                raise UsageError(f"`{option}` needs a value. Usage: `/kernel {spec.usage}`")
            i += 1 if "=" in word else 2
            options[option.lstrip("-")] = _value(option, spec.options[option], value, spec)
            continue
        positional.append(word)
        i += 1
    if len(positional) < spec.required:
        missing = spec.positional[len(positional)]
        raise UsageError(f"`{name}` needs a {missing}. Usage: `/kernel {spec.usage}`")
    if len(positional) > len(spec.positional):
        raise UsageError(f"`{name}` takes {len(spec.positional) or 'no'} argument(s), not "
                         f"{len(positional)}. Usage: `/kernel {spec.usage}`")
    return Command(name, dict(zip(spec.positional, positional, strict=False)), options)


def _value(option: str, kind: str, value: str, spec: Spec) -> str | int:
    if kind == "int":
        if not value.isdigit() or int(value) < 1:
            raise UsageError(f"`{option}` must be a positive whole number, not `{value}`. "
                             f"Usage: `/kernel {spec.usage}`")
        return int(value)
    choices = _CHOICES.get(kind)
    if choices and value not in choices:
        raise UsageError(f"`{option}` must be one of {', '.join(choices)}, not `{value}`."
                         f"{closest(value, list(choices))}")
    return value
