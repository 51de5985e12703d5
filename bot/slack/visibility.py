"""Who may see a session, and where it may be shown. `visible` is the rule, pure: a session lives in the channel it
was started from, and

- a session of a public channel is visible to everyone in the workspace; one of a private channel, a direct or
  a group message only to that conversation's members; one with no channel (started from a terminal) counts as
  public;
- an answer that appears in a channel (a listing, a digest) shows a session only when that channel is the
  session's own or the session's channel is public: a digest posted in C never shows another private channel's
  sessions. Whoever reads it there is in that channel (a command's asker typed there), so such an answer is
  fit for all of them however it is delivered;
- what Slack cannot tell is taken as private: hide rather than show.

`ChannelDirectory` asks Slack what the rule needs (conversations.info for whether a channel is private,
conversations.members for who is in it) and keeps the answers for a few minutes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError

log = logging.getLogger("kernelbot.slack")
FACTS_TTL_SECONDS = 300.0
FAILURE_TTL_SECONDS = 30.0  # a Slack that did not answer is asked again after this, not at every line
MEMBERS_PAGE = 1000

Audience = Callable[[str | None], bool]  # may a session of this channel be shown here, to them?


@dataclass(frozen=True)
class ChannelFacts:
    """What Slack says of a conversation: private (a private channel, a direct or group message) or not, and for a
    private one its members (None for a public one: everyone may see it)."""

    private: bool
    members: frozenset[str] | None = None


def visible(channel: str | None, facts: ChannelFacts | None, *, viewer: str | None, where: str | None) -> bool:
    """May a session of `channel` be shown in `where` (the conversation an answer appears in), or with `where`
    None in a place of `viewer`'s own (the App Home)? `facts` are Slack's about `channel`, None when Slack could
    not say."""
    if channel is None:
        return True  # started from a terminal: public
    public = facts is not None and not facts.private
    if where is not None:
        return channel == where or public  # another conversation's private session never shows in this one
    return public or (viewer is not None and facts is not None and viewer in (facts.members or ()))


def facts_of(info: Mapping[str, Any], members: frozenset[str] | None) -> ChannelFacts:
    """conversations.info's `channel` object (and a private one's members) as facts: public only when Slack says
    `is_private: false` of a channel that is no direct or group message."""
    private = info.get("is_private") is not False or bool(info.get("is_im") or info.get("is_mpim"))
    return ChannelFacts(private=private, members=members if private else None)


@dataclass
class ChannelDirectory:
    client: WebClient
    ttl_seconds: float = FACTS_TTL_SECONDS
    _facts: dict[str, tuple[float, ChannelFacts | None]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def facts(self, channel: str) -> ChannelFacts | None:
        """Slack's facts about `channel`, cached; None when Slack cannot answer (or will not: a private channel
        the bot is not in does not exist for it)."""
        with self._lock:
            cached = self._facts.get(channel)
        if cached is not None:
            ttl = self.ttl_seconds if cached[1] is not None else min(self.ttl_seconds, FAILURE_TTL_SECONDS)
            if time.monotonic() - cached[0] < ttl:
                return cached[1]
        try:
            found: ChannelFacts | None = self._ask(channel)
        except (SlackApiError, SlackClientError, OSError) as exc:
            log.warning("cannot tell who may see channel %s (%s); its sessions stay hidden for now", channel, exc)
            found = None
        with self._lock:
            self._facts[channel] = (time.monotonic(), found)
        return found

    def _ask(self, channel: str) -> ChannelFacts:
        info = self.client.conversations_info(channel=channel).get("channel") or {}
        if facts_of(info, None).private is False:
            return facts_of(info, None)
        if info.get("is_im"):  # a direct message with the bot: the person it is with
            return facts_of(info, frozenset([str(info["user"])]) if info.get("user") else frozenset())
        members: set[str] = set()
        cursor = None
        while True:
            page = self.client.conversations_members(channel=channel, limit=MEMBERS_PAGE,
                                                     **({"cursor": cursor} if cursor else {}))
            members.update(page.get("members") or [])
            cursor = (page.get("response_metadata") or {}).get("next_cursor")
            if not cursor:
                return facts_of(info, frozenset(members))

    def allows(self, channel: str | None, *, viewer: str | None, where: str | None) -> bool:
        """`visible` with Slack's facts about `channel`."""
        return visible(channel, self.facts(channel) if channel else None, viewer=viewer, where=where)


def audience(directory: ChannelDirectory | None, *, viewer: str | None = None, where: str | None = None) -> Audience:
    """The test a session's channel must pass to be shown to `viewer` in `where`; without a directory (nothing
    to ask Slack with) as if Slack could not answer."""
    if directory is None:
        return lambda channel: visible(channel, None, viewer=viewer, where=where)
    return lambda channel: directory.allows(channel, viewer=viewer, where=where)
