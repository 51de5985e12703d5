"""The Slack app manifest declares what the bot uses: the command, interactivity, events, scopes, Socket Mode."""

from __future__ import annotations

import yaml

from bot.cli.checks.slack import SLACK_SCOPES
from bot.slack.slash import COMMANDS
from tests.conftest import REPO


def test_the_manifest_declares_the_command_scopes_events_and_socket_mode() -> None:
    manifest = yaml.safe_load((REPO / "bot" / "slack" / "manifest.yaml").read_text())
    (command,) = manifest["features"]["slash_commands"]
    assert command["command"] == "/kernel"
    assert all(name in command["usage_hint"] for name in COMMANDS)
    scopes = set(manifest["oauth_config"]["scopes"]["bot"])
    assert {"commands", "chat:write", "files:write", "channels:history", "groups:history"} <= scopes
    assert set(SLACK_SCOPES) <= scopes  # what doctor checks the token for, the manifest asks for
    assert {"channels:read", "groups:read", "im:read", "mpim:read", "channels:join"} <= scopes  # channel_access
    settings = manifest["settings"]
    assert settings["interactivity"]["is_enabled"] and settings["socket_mode_enabled"]
    assert {"message.channels", "message.groups", "app_home_opened"} <= set(settings["event_subscriptions"]
                                                                             ["bot_events"])
    assert manifest["features"]["app_home"]["home_tab_enabled"]
    assert manifest["features"]["app_home"]["messages_tab_enabled"]  # where an owner's undelivered notice goes
