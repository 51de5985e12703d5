"""Socket Mode for `kernelbot serve`: Bolt's own handler over slack_sdk's builtin WebSocket client (no extra
dependency), connected without blocking so `serve` keeps its own loop, and failing at start with one sentence
that names the setting to fix rather than logging and retrying in the background."""

from __future__ import annotations

import logging
import threading
import urllib.parse

from slack_bolt import App
from slack_bolt.adapter.socket_mode import SocketModeHandler
from slack_sdk.errors import SlackApiError

from bot.slack.app import SlackSettingsError, app_token
from storage.settings import Settings

log = logging.getLogger("kernelbot.slack")

# What to do about each error apps.connections.open can answer; the rest get the generic advice.
OPEN_ERRORS = {
    "invalid_auth": "use the app-level token (xapp-...) from the app's Basic Information page",
    "not_authed": "use the app-level token (xapp-...) from the app's Basic Information page",
    "token_revoked": "generate a new app-level token on the app's Basic Information page",
    "missing_scope": "give the app-level token the connections:write scope",
    "not_allowed_token_type": "use an app-level token (xapp-...), not a bot or user token",
    "socket_mode_not_enabled": "turn Socket Mode on in the app's settings, or run `kernelbot serve --http`",
}


class SocketConnection:
    """The live Socket Mode connection; `close` may be called more than once and from any thread (serve's signal
    handler and its main thread both shut down)."""

    def __init__(self, handler: SocketModeHandler) -> None:
        self.handler = handler
        self._lock = threading.Lock()
        self._closed = False

    def is_connected(self) -> bool:
        return not self._closed and self.handler.client.is_connected()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.handler.close()


def connect(app: App, settings: Settings) -> SocketConnection:
    """Open a Socket Mode connection for `app` (the Web API it calls is the app's client, so
    KERNELBOT_SLACK_API_URL applies); the handler reconnects on its own when Slack asks it to."""
    handler = SocketModeHandler(app, app_token=app_token(settings))
    errors: list[Exception] = []
    handler.client.on_error_listeners.append(errors.append)
    try:
        handler.connect()
    except SlackApiError as exc:
        handler.close()
        raise _refused(exc) from None
    except OSError as exc:  # urllib's URLError included: the Web API is not reachable
        handler.close()
        raise SlackSettingsError(f"cannot reach Slack's Web API at {app.client.base_url} to open a Socket Mode "
                                 f"connection ({exc}): check the network, or KERNELBOT_SLACK_API_URL") from None
    finally:
        handler.client.on_error_listeners.remove(errors.append)
    if not handler.client.is_connected():
        handler.close()
        raise _no_websocket(handler.client.wss_uri, errors)
    return SocketConnection(handler)


def _refused(exc: SlackApiError) -> SlackSettingsError:
    error = str(exc.response.get("error") or "unknown_error")
    hint = OPEN_ERRORS.get(error, "check SLACK_APP_TOKEN and the app's Socket Mode settings")
    return SlackSettingsError(f"Slack refused SLACK_APP_TOKEN at apps.connections.open ({error}): {hint}")


def _no_websocket(url: str | None, errors: list[Exception]) -> SlackSettingsError:
    """The WebSocket did not open; the builtin client logs rather than raises, so the reason comes from its
    error listener. The ticket in the URL is a credential: only the host is named."""
    where = urllib.parse.urlsplit(url or "").netloc or "the address apps.connections.open gave"
    why = f" ({type(errors[-1]).__name__}: {errors[-1]})" if errors else " (the handshake was refused)"
    return SlackSettingsError(f"could not open the Socket Mode WebSocket at {where}{why}: allow outbound WebSocket "
                              "traffic to Slack, or check KERNELBOT_SLACK_API_URL")
