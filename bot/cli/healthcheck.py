"""The container health check (`kernelbot healthcheck`, the image's HEALTHCHECK): one answer for either role,
read from the command line the container runs (PID 1's when none is given).

- `serve --http`: `GET /healthz` on its port answers 200 while it serves;
- `runner`: the database is reachable at the schema head and this host's runner heartbeated within one lease
  (`--lease-seconds`, 60 s by default), i.e. before its jobs would be taken over;
- `serve` (Socket Mode): the database is reachable at the schema head, and the Socket Mode connection `serve`
  records every few seconds in the data directory is fresh (not hung) and up, or down for less than a minute;
- anything else (a one-off command): nothing to check.
"""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path

from storage.logs import redact
from storage.settings import Settings


def option(args: list[str], name: str, default: str | None = None) -> str | None:
    """The value of `--name VALUE` or `--name=VALUE` in a command line."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return default


def pid1_command_line() -> list[str]:
    return [a.decode() for a in Path("/proc/1/cmdline").read_bytes().split(b"\0") if a]


def http_health(args: list[str]) -> tuple[bool, str]:
    host = option(args, "--host", "0.0.0.0") or ""
    host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    host = f"[{host}]" if ":" in host else host
    url = f"http://{host}:{option(args, '--port', '3000')}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200, f"{url}: {response.status}"
    except OSError as exc:
        return False, f"{url}: {exc}"


def runner_health(args: list[str], settings: Settings) -> tuple[bool, str]:
    from sqlmodel import Session

    from storage.engine import make_engine
    from storage.runners import get_runners

    name, lease = option(args, "--name", None), float(option(args, "--lease-seconds", "60") or 60)
    if settings.database_url is None and not (settings.home / "kernelbot.db").exists():
        return False, f"no database yet in {settings.home}"
    url = settings.database
    engine = make_engine(url) if url.startswith("sqlite") else make_engine(url, connect_args={"connect_timeout": 5})
    try:
        with Session(engine) as session:
            runners = get_runners(session)
    finally:
        engine.dispose()
    host = socket.gethostname()
    mine = [r for r in runners if (r.name == name if name else r.host == host)]
    ages = sorted(time.time() - r.heartbeat_at for r in mine)
    if not ages:
        return False, f"no active runner registered as {name or 'host ' + host} yet"
    return ages[0] <= lease, f"runner heartbeat {ages[0]:.0f} s ago (a lease lasts {lease:.0f} s)"


def assess(args: list[str], settings: Settings) -> tuple[bool, str]:
    """(healthy, why) for the process this command line starts."""
    role = next((a for a in args if a in ("serve", "runner")), None)
    if role == "serve" and "--http" in args:
        return http_health(args)
    if role is None:
        return True, "not serve or runner: nothing to check"
    from bot.cli.checks.database import check_database

    database = check_database(settings)
    if database.status == "fail":
        return False, redact(database.detail)
    if role == "runner":
        try:
            return runner_health(args, settings)
        except Exception as exc:  # noqa: BLE001 - any failure to look is unhealthy, said in one line
            return False, redact(f"runner heartbeat unreadable: {type(exc).__name__}: {exc}".splitlines()[0])
    return socket_health(settings, database.detail)


def socket_health(settings: Settings, database: str) -> tuple[bool, str]:
    from bot.slack.socket_health import assess, read_state, state_path

    try:
        healthy, why = assess(read_state(state_path(settings.home)), now=time.time())
    except ValueError as exc:
        healthy, why = False, str(exc)
    return healthy, redact(f"{why}; {database}")
