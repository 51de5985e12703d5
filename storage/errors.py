"""The one tree of errors a person is meant to see. Each class says, in `next_step`, what a person does next; the
message says what is wrong, with its values. The surfaces map from this tree, not from lists of their own: the
terminal prints the message and `next: STEP`, Slack answers `explain(exc)`. Errors that code handles itself
(a candidate that failed, a refused Slack call) stay ordinary exceptions outside it.

Here, at the bottom layer, so that every package may raise them:

    KernelbotError
    ├── storage:    SettingsError, SchemaOutdated, SchemaNewer, JobNotFound, BlobError
    ├── tpu_runner: TaskError (ReferenceStopped), KernelFileError, UnknownTarget, ChipBusy, PortUnavailable
    ├── agents:     BrainError, BrainUnavailable, SearchError, DecisionRejected, SessionStopped, SourceError
    └── bot:        UsageError, ChannelUnavailable, SlackSettingsError, CronError, UploadRefused
"""

from __future__ import annotations


class KernelbotError(Exception):
    """An error with a message for people and the next step they should take. A subclass sets `next_step` for
    every case it raises; a raise that knows better passes `next_step=`."""

    next_step: str = ""

    def __init__(self, *args: object, next_step: str = "") -> None:
        super().__init__(*args)
        if next_step:
            self.next_step = next_step


def explain(exc: KernelbotError) -> str:
    """The message and, on its own line, the next step: what a person reads."""
    return f"{exc}\nNext: {exc.next_step}" if exc.next_step else str(exc)
