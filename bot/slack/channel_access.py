"""Whether the bot can post in a channel, asked before anything starts there: a session's thread in a channel
the bot cannot post to would run unseen. A public channel the bot is not in is joined; anything else it cannot
post to is refused with a sentence that says what to do. `decide` is the rule, pure; `ChannelAccess` asks Slack
(conversations.info, conversations.join) and remembers the channels it may post to for a few minutes.

When Slack cannot be asked (unreachable, erroring, rate-limited past the client's retries) the session starts:
its posts wait in the outbox until Slack answers again, so nothing is lost; only a clear "no" refuses.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError

from storage.errors import KernelbotError

log = logging.getLogger("kernelbot.slack")
ACCESS_TTL_SECONDS = 300.0
NOTHING_STARTED = "Nothing was started."


class ChannelUnavailable(KernelbotError):
    """The bot cannot post where a session would live; the message says why and what to do."""
    next_step = "do what the message says in Slack (invite the bot, or use a channel it can post in), then run it again"


@dataclass(frozen=True)
class Verdict:
    post: bool = False  # the bot can post there now
    join: bool = False  # a public channel it is not in: joining makes it able to
    problem: str = ""  # otherwise: why not and what to do, a sentence to show


POST = Verdict(post=True)


def _elsewhere(channel: str) -> str:
    if channel.startswith("D"):
        return ("I am not part of this direct message, so I could not post its thread: run the command in a "
                "channel I am in, or in a direct message with me.")
    return ("I am not in this conversation (a private channel or a group message), so I could not post its "
            "thread: invite me with `/invite @kernelbot`, or run it in a channel I am in.")


def _missing_scope(scope: str, what: str, meanwhile: str = "run the command in a channel I am in") -> str:
    return (f"kernelbot's Slack app lacks the {scope} scope, which it needs to {what}: whoever runs kernelbot "
            f"should add it (bot/slack/manifest.yaml) and reinstall the app; meanwhile {meanwhile}.")


def _archived() -> str:
    return "This channel is archived, so I could not post there: run the command in a live channel."


def decide(channel: str, info: Mapping[str, Any] | None, *, error: str | None = None,
           needed: str | None = None) -> Verdict:
    """What conversations.info's answer means for posting in `channel`: its `channel` object, or its error code
    (and the `needed` scope Slack names with missing_scope)."""
    if info is None:
        if error == "missing_scope":
            return Verdict(problem=_missing_scope(needed or "channels:read", "see whether it may post here"))
        if error in ("channel_not_found", "not_in_channel", "method_not_supported_for_channel_type"):
            return Verdict(problem=_elsewhere(channel))
        return Verdict(problem=f"Slack would not tell me about this channel ({error or 'no answer'}), so I may not "
                               "be able to post there; run the command in a channel I am in.")
    if info.get("is_archived"):
        return Verdict(problem=_archived())
    if info.get("is_im") or info.get("is_mpim") or info.get("is_member"):
        return POST  # a direct or group message the bot can see is one it is part of
    if info.get("is_private") or info.get("is_group"):
        return Verdict(problem=_elsewhere(channel))
    return Verdict(join=True)


def decide_join(channel: str, *, error: str | None, needed: str | None = None) -> Verdict:
    """What conversations.join's answer (its error code, None when it joined) means for posting in `channel`."""
    if error is None:
        return POST
    if error == "missing_scope":
        return Verdict(problem=_missing_scope(needed or "channels:join", "join this channel by itself",
                                              "invite me with `/invite @kernelbot`, or run the command in a "
                                              "channel I am in"))
    if error == "is_archived":
        return Verdict(problem=_archived())
    return Verdict(problem=_elsewhere(channel))


class _NoAnswer(Exception):
    """Slack could not be asked (rate-limited past the retries, erroring, unreachable)."""


def _refusal(exc: SlackApiError) -> tuple[str | None, str | None]:
    """(error code, the scope it needs) of a call Slack answered with ok=false; _NoAnswer when it did not answer."""
    if exc.response.status_code == 429 or exc.response.status_code >= 500:
        raise _NoAnswer(f"HTTP {exc.response.status_code}") from exc
    return str(exc.response.get("error") or "") or None, exc.response.get("needed")


@dataclass
class ChannelAccess:
    client: WebClient
    ttl_seconds: float = ACCESS_TTL_SECONDS
    _may_post: dict[str, float] = field(default_factory=dict)  # channel -> when it was last found postable
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def require(self, channel: str, *, outcome: str = NOTHING_STARTED) -> None:
        """Return when the bot can post in `channel` (joining it if it is public); otherwise ChannelUnavailable
        saying why, what to do, and `outcome`."""
        problem = self.problem(channel)
        if problem:
            raise ChannelUnavailable(f"{problem} {outcome}")

    def problem(self, channel: str) -> str | None:
        """Why the bot cannot post in `channel` (a sentence), or None when it can."""
        if not channel:
            return "Slack did not say which channel this came from, so there is nowhere to post."
        with self._lock:
            seen = self._may_post.get(channel)
        if seen is not None and time.monotonic() - seen < self.ttl_seconds:
            return None
        try:
            verdict = self._ask(channel)
        except (_NoAnswer, SlackClientError, OSError, ValueError) as exc:  # ValueError: an outage's HTML page
            log.warning("cannot ask Slack whether the bot may post in %s (%s); starting anyway, the outbox "
                        "retries", channel, exc)
            return None
        if not verdict.post:
            log.info("the bot cannot post in %s: %s", channel, verdict.problem)
            return verdict.problem
        with self._lock:
            self._may_post[channel] = time.monotonic()
        return None

    def _ask(self, channel: str) -> Verdict:
        try:
            verdict = decide(channel, self.client.conversations_info(channel=channel).get("channel") or {})
        except SlackApiError as exc:
            error, needed = _refusal(exc)
            verdict = decide(channel, None, error=error, needed=needed)
        if not verdict.join:
            return verdict
        try:
            self.client.conversations_join(channel=channel)
        except SlackApiError as exc:
            error, needed = _refusal(exc)
            return decide_join(channel, error=error, needed=needed)
        log.info("joined the public channel %s to post a session's thread there", channel)
        return POST
