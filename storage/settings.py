"""The one reader of the environment. Entry points build a Settings and hand it down."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs


class SettingsError(ValueError):
    """A setting has a value kernelbot cannot use; the message names the variable."""


def _int(env: dict[str, str], name: str, default: int, minimum: int = 1) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a whole number") from None
    if value < minimum:
        raise SettingsError(f"{name}={value} must be at least {minimum}")
    return value


def _choice(env: dict[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    value = env.get(name) or default
    if value not in choices:
        raise SettingsError(f"{name}={value!r} must be one of {', '.join(choices)}")
    return value


@dataclass(frozen=True)
class EvalLimits:
    """Resource limits for one sandboxed evaluation (a child process)."""

    wall_seconds: int = 300
    cpu_seconds: int = 900
    memory_mib: int = 8192
    output_bytes: int = 1_000_000
    # Interpret mode costs a few ms per grid step on a CPU; above this many steps per call a
    # correctness configuration is too expensive and a smaller one is derived.
    interpret_grid_steps: int = 4096


@dataclass(frozen=True)
class Settings:
    home: Path
    default_target: str = "v6e"
    eval_workers: int = 2
    # "fast": libtpu's fast-forward static profile (seconds per compile); "exact": the unrolled one (slow, heavy).
    static_profile: str = "fast"
    limits: EvalLimits = field(default_factory=EvalLimits)
    database_url: str | None = None  # KERNELBOT_DATABASE_URL; None means SQLite in the data directory
    job_modules: tuple[str, ...] = ()  # KERNELBOT_JOB_MODULES: extra job kinds, imported by runners
    anthropic_api_key: str | None = field(default=None, repr=False)  # ANTHROPIC_API_KEY
    model: str | None = None  # KERNELBOT_MODEL; default: the newest active model the API lists
    slack_bot_token: str | None = field(default=None, repr=False)  # SLACK_BOT_TOKEN (xoxb-)
    slack_signing_secret: str | None = field(default=None, repr=False)  # SLACK_SIGNING_SECRET (HTTP mode)
    slack_app_token: str | None = field(default=None, repr=False)  # SLACK_APP_TOKEN (xapp-, Socket Mode)
    slack_api_url: str | None = None  # KERNELBOT_SLACK_API_URL: another Web API base URL (the tests' fake)
    steerers: str = ""  # KERNELBOT_STEERERS: who besides a session's owner may steer it (`anyone`, or ids)
    suites: tuple[Path, ...] = ()  # KERNELBOT_SUITES: task suite directories besides tasks/
    digest_channels: tuple[str, ...] = ()  # KERNELBOT_DIGEST_CHANNELS: where the daily digest goes
    digest_cron: str = "0 9 * * *"  # KERNELBOT_DIGEST_CRON: when (crontab; a sixth, leading field is seconds)
    timezone: str = "UTC"  # KERNELBOT_TIMEZONE: the digests' and schedules' time zone

    @property
    def database(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'kernelbot.db'}"

    @property
    def artifacts_dir(self) -> Path:
        return self.home / "artifacts"

    @property
    def cache_dir(self) -> Path:
        return self.home / "cache"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    def ensure_dirs(self) -> None:
        for path in (self.home, self.artifacts_dir, self.cache_dir, self.logs_dir):
            path.mkdir(parents=True, exist_ok=True)


def _timezone(env: dict[str, str]) -> str:
    import zoneinfo

    name = env.get("KERNELBOT_TIMEZONE") or "UTC"
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise SettingsError(f"KERNELBOT_TIMEZONE={name!r} is not a time zone; use an IANA name such as "
                            "Europe/Paris or UTC") from None
    return name


def _cron(env: dict[str, str]) -> str:
    value = (env.get("KERNELBOT_DIGEST_CRON") or "0 9 * * *").strip()
    if len(value.split()) not in (5, 6):
        raise SettingsError(f"KERNELBOT_DIGEST_CRON={value!r} must be a crontab line: minute hour day month "
                            "weekday (optionally with seconds first), e.g. '0 9 * * *'")
    return value


def _list(env: dict[str, str], name: str, sep: str = ",") -> tuple[str, ...]:
    return tuple(part.strip() for part in env.get(name, "").split(sep) if part.strip())


def load_settings(env: dict[str, str] | None = None) -> Settings:
    env = dict(os.environ if env is None else env)
    home = Path(env.get("KERNELBOT_HOME") or platformdirs.user_data_dir("kernelbot")).expanduser()
    limits = EvalLimits(
        wall_seconds=_int(env, "KERNELBOT_EVAL_TIMEOUT", EvalLimits.wall_seconds),
        memory_mib=_int(env, "KERNELBOT_EVAL_MEMORY_MIB", EvalLimits.memory_mib, minimum=512),
    )
    limits = EvalLimits(
        wall_seconds=limits.wall_seconds,
        cpu_seconds=max(EvalLimits.cpu_seconds, 3 * limits.wall_seconds),
        memory_mib=limits.memory_mib,
    )
    return Settings(
        home=home,
        default_target=env.get("KERNELBOT_TARGET", "v6e"),
        eval_workers=_int(env, "KERNELBOT_EVAL_WORKERS", 2),
        static_profile=_choice(env, "KERNELBOT_STATIC_PROFILE", "fast", ("fast", "exact")),
        limits=limits,
        database_url=env.get("KERNELBOT_DATABASE_URL") or None,
        anthropic_api_key=env.get("ANTHROPIC_API_KEY") or None,
        model=env.get("KERNELBOT_MODEL") or None,
        slack_bot_token=env.get("SLACK_BOT_TOKEN") or None,
        slack_signing_secret=env.get("SLACK_SIGNING_SECRET") or None,
        slack_app_token=env.get("SLACK_APP_TOKEN") or None,
        slack_api_url=env.get("KERNELBOT_SLACK_API_URL") or None,
        job_modules=_list(env, "KERNELBOT_JOB_MODULES"),
        steerers=env.get("KERNELBOT_STEERERS", "").strip(),
        suites=tuple(Path(p).expanduser() for p in _list(env, "KERNELBOT_SUITES", os.pathsep)),
        digest_channels=_list(env, "KERNELBOT_DIGEST_CHANNELS"),
        digest_cron=_cron(env),
        timezone=_timezone(env),
    )
