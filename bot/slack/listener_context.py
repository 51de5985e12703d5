"""What every Slack listener is handed: the settings, the database, the task suites, who may steer, where the
bot may post, and a way to wake the notifier after recording something. Built once by the entry point
(`bot.slack.app.build_app`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from bot.slack.channel_access import ChannelAccess
from bot.slack.steering import SteeringPolicy, may_steer
from bot.slack.visibility import ChannelDirectory
from storage import sessions
from storage.models import SlackInbox
from storage.settings import Settings

log = logging.getLogger("kernelbot.slack")
GROUPS_TTL_SECONDS = 300.0


@dataclass
class GroupDirectory:
    """User-group membership, from `usergroups.users.list`, cached for a few minutes."""

    client: WebClient
    _members: dict[str, tuple[float, frozenset[str]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def groups_of(self, user: str, groups: frozenset[str]) -> frozenset[str]:
        return frozenset(g for g in groups if user in self._users(g))

    def _users(self, group: str) -> frozenset[str]:
        with self._lock:
            cached = self._members.get(group)
        if cached and time.monotonic() - cached[0] < GROUPS_TTL_SECONDS:
            return cached[1]
        try:
            users = frozenset(self.client.usergroups_users_list(usergroup=group).get("users") or [])
        except (SlackApiError, SlackClientError, OSError) as exc:
            log.warning("cannot read the members of user group %s (%s); treating it as empty", group, exc)
            return cached[1] if cached else frozenset()
        with self._lock:
            self._members[group] = (time.monotonic(), users)
        return users


@dataclass
class BotContext:
    settings: Settings
    engine: Engine
    suites: list[Path]
    policy: SteeringPolicy
    groups: GroupDirectory
    channels: ChannelAccess
    visibility: ChannelDirectory  # who may see which channel's sessions (bot.slack.visibility)
    notify: Callable[[], None] = lambda: None

    def first_delivery(self, key: str) -> bool:
        """True the first time this inbound delivery (an event, a click) is seen: Slack retries, people
        double-click, and a retry must change nothing."""
        try:
            with Session(self.engine) as s, s.begin():
                s.add(SlackInbox(key=key))
            return True
        except IntegrityError:
            return False

    def may_steer(self, *, user: str, owner: str | None) -> tuple[bool, str]:
        """(allowed, why not) for whatever `owner` started: the policy, with the user's groups looked up only
        when they could matter."""
        groups = self.groups.groups_of(user, self.policy.groups) if self.policy.groups and user != owner \
            else frozenset()
        return may_steer(self.policy, user=user, owner=owner, user_groups=groups)

    def may_steer_session(self, *, user: str, session_id: str) -> tuple[bool, str]:
        """The one owner check of every surface that acts on a session by its id (a button, a modal, a command);
        LookupError when the session is gone, so each caller says so in its own words."""
        with Session(self.engine) as s:
            owner = sessions.get_session(s, session_id=session_id).owner
        return self.may_steer(user=user, owner=owner)
