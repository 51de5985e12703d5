"""Slack: the tokens, the scopes granted against the manifest's, and the connection mode."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bot.cli.checks.report import Check
from bot.task_suites import SOURCE_ROOT
from storage.settings import Settings

MANIFEST = SOURCE_ROOT / "bot" / "slack" / "manifest.yaml"  # beside the bot that needs what it declares
# What the bot calls Slack for; bot/slack/manifest.yaml declares the same list (check_slack_scopes compares).
SLACK_SCOPES = ("commands", "chat:write", "files:write", "files:read", "channels:history", "groups:history",
                "users:read", "usergroups:read", "channels:read", "groups:read", "im:read", "mpim:read",
                "channels:join")
SLACK_TIMEOUT_S = 10


_SLACK_AUTH_FIXES = {
    "invalid_auth": "copy the Bot User OAuth Token (xoxb-...) from the app's OAuth & Permissions page into "
                    "SLACK_BOT_TOKEN",
    "not_authed": "set SLACK_BOT_TOKEN to the Bot User OAuth Token (xoxb-...)",
    "token_revoked": "reinstall the app to the workspace (OAuth & Permissions) and set the new SLACK_BOT_TOKEN",
    "token_expired": "token rotation is on: turn it off for the app or set a fresh SLACK_BOT_TOKEN",
    "account_inactive": "the bot user was deactivated: reinstall the app and set the new SLACK_BOT_TOKEN",
}


def manifest_scopes(path: Path = MANIFEST) -> set[str] | None:
    """The bot scopes bot/slack/manifest.yaml declares; None when the file is not there (an installed wheel)."""
    import yaml

    if not path.is_file():
        return None
    data = yaml.safe_load(path.read_text()) or {}
    return set(((data.get("oauth_config") or {}).get("scopes") or {}).get("bot") or [])


def granted_scopes(headers: Mapping[str, Any]) -> set[str] | None:
    """The token's scopes from auth.test's `x-oauth-scopes` header (any case); None when Slack did not send it."""
    for key, value in headers.items():
        if key.lower() == "x-oauth-scopes":
            raw = value[0] if isinstance(value, list | tuple) else value
            return {s.strip() for s in str(raw).split(",") if s.strip()}
    return None


def check_slack_scopes(granted: set[str] | None, declared: set[str] | None,
                       needed: tuple[str, ...] = SLACK_SCOPES) -> Check:
    """The token's scopes against what the bot needs, and the manifest against the same list."""
    undeclared = [s for s in needed if declared is not None and s not in declared]
    manifest_note = (f"; bot/slack/manifest.yaml does not declare {', '.join(undeclared)}" if undeclared else "")
    manifest_fix = (f"add {', '.join(undeclared)} under oauth_config.scopes.bot in bot/slack/manifest.yaml"
                    if undeclared else "")
    if granted is None:
        return Check("slack scopes", "warn", "Slack did not report the token's scopes (no x-oauth-scopes header on "
                     f"auth.test), so they are not checked; the bot needs {', '.join(needed)}{manifest_note}",
                     "; ".join(f for f in ("check them on the app's OAuth & Permissions page", manifest_fix) if f))
    missing = [s for s in needed if s not in granted]
    if missing:
        return Check("slack scopes", "fail", f"the bot token lacks {', '.join(missing)} (it has "
                     f"{', '.join(sorted(granted)) or 'none'}){manifest_note}",
                     f"add {', '.join(missing)} under OAuth & Permissions -> Bot Token Scopes (or create the app "
                     "from bot/slack/manifest.yaml), reinstall the app to the workspace and set the new SLACK_BOT_TOKEN"
                     + (f"; {manifest_fix}" if manifest_fix else ""))
    if undeclared:
        return Check("slack scopes", "warn", f"the token has all {len(needed)} scopes{manifest_note}", manifest_fix)
    return Check("slack scopes", "ok", f"the token has all {len(needed)} scopes the bot needs"
                 + (" (as bot/slack/manifest.yaml declares)" if declared is not None else ""))


def masked(secret: str) -> str:
    """What may be printed of a secret: its first four characters (the kind of token)."""
    return f"{secret[:4]}..."


def _slack_client(token: str, settings: Settings) -> Any:
    from slack_sdk import WebClient

    return WebClient(token=token, timeout=SLACK_TIMEOUT_S,
                     **({"base_url": settings.slack_api_url} if settings.slack_api_url else {}))


def _slack_error(exc: Exception) -> str:
    from slack_sdk.errors import SlackApiError

    if isinstance(exc, SlackApiError):
        return str(exc.response.get("error") or exc.response.status_code)
    return f"{type(exc).__name__}: {exc}"


def _slack_where(settings: Settings) -> str:
    return f"Slack at {settings.slack_api_url}" if settings.slack_api_url else "Slack"


def check_slack_auth(settings: Settings) -> tuple[Check, set[str] | None]:
    """auth.test with the bot token: the workspace and the bot it names, and the token's scopes."""
    from slack_sdk.errors import SlackApiError

    token = settings.slack_bot_token or ""
    if not token.startswith("xoxb-"):
        return Check("slack", "fail", f"SLACK_BOT_TOKEN starts with {token[:5]!r}, not 'xoxb-': it is not a bot "
                     "token", _SLACK_AUTH_FIXES["invalid_auth"]), None
    try:
        response = _slack_client(token, settings).auth_test()
    except SlackApiError as exc:
        error = _slack_error(exc)
        return Check("slack", "fail", f"{_slack_where(settings)} refuses SLACK_BOT_TOKEN ({masked(token)}): {error}",
                     _SLACK_AUTH_FIXES.get(error, "check SLACK_BOT_TOKEN on the app's OAuth & Permissions page")), None
    except Exception as exc:
        return Check("slack", "fail", f"cannot reach {_slack_where(settings)}: {_slack_error(exc)}",
                     "check the network" + (" and KERNELBOT_SLACK_API_URL" if settings.slack_api_url else "")), None
    data = response.data if isinstance(response.data, dict) else {}
    bot = data.get("user") or "?"
    detail = (f"workspace {data.get('team') or '?'} ({data.get('team_id') or '?'}, {data.get('url') or '?'}), "
              f"bot @{bot} ({data.get('user_id') or '?'})")
    if not data.get("bot_id"):
        return Check("slack", "fail", f"SLACK_BOT_TOKEN belongs to {detail}, which is not a bot user",
                     _SLACK_AUTH_FIXES["invalid_auth"]), None
    return Check("slack", "ok", detail), granted_scopes(response.headers or {})


def check_slack_mode(settings: Settings) -> Check:
    """Socket Mode: an app-level token that apps.connections.open accepts; HTTP mode: a signing secret."""
    from slack_sdk.errors import SlackApiError

    app_token, secret = settings.slack_app_token, settings.slack_signing_secret
    if app_token:
        if not app_token.startswith("xapp-"):
            return Check("slack mode", "fail", f"SLACK_APP_TOKEN starts with {app_token[:5]!r}, not 'xapp-': Socket "
                         "Mode needs an app-level token",
                         "create one with connections:write under Basic Information -> App-Level Tokens")
        try:
            _slack_client(app_token, settings).apps_connections_open(app_token=app_token)
        except SlackApiError as exc:
            error = _slack_error(exc)
            fix = ("turn Socket Mode on (the app's Settings -> Socket Mode), or serve over HTTP: unset "
                   "SLACK_APP_TOKEN, set SLACK_SIGNING_SECRET and run `kernelbot serve --http`"
                   if error == "socket_mode_not_enabled" else
                   "create an app-level token with connections:write (Basic Information -> App-Level Tokens) "
                   "and set it as SLACK_APP_TOKEN")
            return Check("slack mode", "fail", f"{_slack_where(settings)} refuses SLACK_APP_TOKEN for Socket Mode "
                         f"(apps.connections.open: {error})", fix)
        except Exception as exc:
            return Check("slack mode", "fail", f"cannot reach {_slack_where(settings)} for Socket Mode: "
                         f"{_slack_error(exc)}", "check the network")
        also = "; SLACK_SIGNING_SECRET is set too, for `serve --http`" if secret else ""
        return Check("slack mode", "ok", f"Socket Mode: SLACK_APP_TOKEN accepted by apps.connections.open{also}")
    if secret:
        looks_right = len(secret) == 32 and all(ch in "0123456789abcdef" for ch in secret.lower())
        if not looks_right:
            return Check("slack mode", "warn", f"HTTP mode: SLACK_SIGNING_SECRET is {len(secret)} characters, not "
                         "the 32 hex digits Slack issues: every request would be refused (401)",
                         "copy the Signing Secret from the app's Basic Information page")
        return Check("slack mode", "ok", "HTTP mode (`kernelbot serve --http`): SLACK_SIGNING_SECRET is set and "
                     "looks like a Slack signing secret (Slack's requests prove it; it cannot be tested from here)")
    return Check("slack mode", "fail", "neither SLACK_APP_TOKEN (Socket Mode) nor SLACK_SIGNING_SECRET (HTTP mode) "
                 "is set: `kernelbot serve` cannot receive Slack's events",
                 "set SLACK_APP_TOKEN (xapp-..., Basic Information -> App-Level Tokens, with connections:write), or "
                 "SLACK_SIGNING_SECRET for `kernelbot serve --http`")


def check_slack(settings: Settings, manifest: Path = MANIFEST) -> list[Check]:
    if not settings.slack_bot_token:
        others = [name for name, value in (("SLACK_APP_TOKEN", settings.slack_app_token),
                                           ("SLACK_SIGNING_SECRET", settings.slack_signing_secret)) if value]
        if others:
            return [Check("slack", "fail", f"{' and '.join(others)} set but SLACK_BOT_TOKEN is not: the bot "
                          "cannot post", "set SLACK_BOT_TOKEN to the Bot User OAuth Token (xoxb-...) from the app's "
                          "OAuth & Permissions page")]
        return [Check("slack", "skip", "SLACK_BOT_TOKEN is not set: the Slack bot is not configured (only "
                      "`kernelbot serve` needs it)")]
    auth, granted = check_slack_auth(settings)
    if auth.status != "ok":
        return [auth]
    return [auth, check_slack_scopes(granted, manifest_scopes(manifest)), check_slack_mode(settings)]
