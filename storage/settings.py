"""The one reader of the environment (and of the optional configuration file). Entry points build a Settings
and hand it down. `VARIABLES` is the reference of every setting: docs/configuration.md's table is checked against it,
and `kernelbot config` prints it with the values in force."""

from __future__ import annotations

import os
import tomllib
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

from storage.errors import KernelbotError

TARGETS = ("v5e", "v6e", "v5p")  # the TPU generations tpu_runner.hardware.targets knows (a test keeps them in step)
# TPU_ACCELERATOR_TYPE (set by the TPU runtime on a TPU host, e.g. v5litepod-4, v6e-8) -> the target it is.
ACCELERATOR_PREFIXES = (("v5litepod", "v5e"), ("v5lite", "v5e"), ("v5e", "v5e"), ("v6e", "v6e"), ("v5p", "v5p"))
FALLBACK_TARGET = "v6e"  # where the host has no TPU of a known generation


@dataclass(frozen=True)
class Variable:
    name: str
    default: str  # as the reference states it
    meaning: str
    reader: str = "settings"  # settings (load_settings) | kb (the launcher) | anthropic (the SDK) | cli
    secret: bool = False
    choices: tuple[str, ...] = ()  # the values it may take, where there is a set


VARIABLES: tuple[Variable, ...] = (
    Variable("KERNELBOT_CONFIG", "`~/.config/kernelbot/config.toml` when it exists",
             "a TOML file of these settings (`NAME = \"value\"` lines); the environment wins over it"),
    Variable("KERNELBOT_HOME", "the platform's per-user data dir (`~/.local/share/kernelbot`)",
             "all state: artifacts, caches, logs, pasted tasks, the SQLite database"),
    Variable("KERNELBOT_CACHE_DIR", "`$KERNELBOT_HOME/cache`",
             "the references' outputs, programs and compiler figures, kept per task version; runners on one host "
             "may share it"),
    Variable("KERNELBOT_TARGET", "this host's TPU generation, else `v6e`", "default TPU target: " + ", ".join(TARGETS),
             choices=TARGETS),
    Variable("KERNELBOT_TPU", "`auto`", "`auto`: candidates whose target is this host's TPU are checked and timed on "
             "it; `off`: never use the chip (interpret mode and estimates, as on a host without one)",
             choices=("auto", "off")),
    Variable("KERNELBOT_EVAL_WORKERS", "`2`", "parallel evaluations"),
    Variable("KERNELBOT_EVAL_TIMEOUT", "`300`", "wall-clock seconds per evaluation"),
    Variable("KERNELBOT_EVAL_MEMORY_MIB", "`8192`", "resident memory per evaluation"),
    Variable("KERNELBOT_FULL_CHECK_ELEMENTS", "`8388608`", "correctness runs at the production shapes when their "
             "inputs and outputs hold at most this many elements (and the FLOPs below), else at smaller shapes"),
    Variable("KERNELBOT_FULL_CHECK_GFLOPS", "`20`", "the reference GFLOPs up to which production shapes are checked"),
    Variable("KERNELBOT_STATIC_PROFILE", "`fast`", "`fast` or `exact` libtpu static cycle profile, or `off` (faster "
             "compiles; estimates without the compiler's cycles)", choices=("fast", "exact", "off")),
    Variable("KERNELBOT_DATABASE_URL", "SQLite at `$KERNELBOT_HOME/kernelbot.db`",
             "e.g. `postgresql://user@host/kernelbot` (psycopg 3)", secret=True),
    Variable("KERNELBOT_JOB_MODULES", "none",
             "comma-separated modules whose `JOB_KINDS` (a `tpu_runner.jobs.JobKinds`) runners also serve"),
    Variable("ANTHROPIC_API_KEY", "none", "enables the anthropic brain", secret=True),
    Variable("ANTHROPIC_BASE_URL", "Anthropic's own", "another Messages API base URL (a proxy; the tests' fake)",
             reader="anthropic"),
    Variable("KERNELBOT_MODEL", "newest active Opus listed by the API", "the model the anthropic brain uses"),
    Variable("KERNELBOT_MAX_COST_USD", "`10`", "the most one session may spend on the LLM, every request counted "
             "(a session's own `--max-cost` or budget is used when it is lower)"),
    Variable("KERNELBOT_PRICES", "the published list prices",
             "USD per million tokens by model-id fragment, e.g. `opus=5/25,claude-opus-4-1=15/75` (added to or "
             "replacing the built-in table; the longest matching fragment wins)"),
    Variable("SLACK_BOT_TOKEN", "none", "the Slack app's bot token (`xoxb-`), for `serve`", secret=True),
    Variable("SLACK_APP_TOKEN", "none", "the app-level token (`xapp-`) for Socket Mode (`serve` without `--http`)",
             secret=True),
    Variable("SLACK_SIGNING_SECRET", "none", "verifies Slack's HTTP requests (`serve --http`)", secret=True),
    Variable("KERNELBOT_SLACK_API_URL", "Slack's own", "another Slack Web API base URL (the tests' fake)"),
    Variable("KERNELBOT_STEERERS", "none (the owner only)",
             "who else may steer sessions: `anyone`, or comma-separated user (`U...`) and user-group (`S...`) ids"),
    Variable("KERNELBOT_SUITES", "none", "extra task suite directories, `:`-separated (`tasks/` is always there)"),
    Variable("KERNELBOT_DIGEST_CHANNELS", "none", "channel ids (comma-separated) that get the digest by default; "
             "`/kernel digest subscribe` and `unsubscribe` change that without a restart"),
    Variable("KERNELBOT_DIGEST_CRON", "`0 9 * * *`",
             "when the digest goes out (crontab; a sixth, leading field is seconds)"),
    Variable("KERNELBOT_TIMEZONE", "`UTC`", "the time zone of digests and schedules (IANA name)"),
    Variable("KERNELBOT_LOG_LEVEL", "`info` for `serve` and `runner`, `warning` for the rest",
             "`debug`, `info`, `warning` or `error`", choices=("debug", "info", "warning", "error")),
    Variable("KERNELBOT_LOG_FORMAT", "`text`", "`text` (one line an event) or `json` (one object a line)",
             choices=("text", "json")),
    Variable("KERNELBOT_DEBUG", "off", "`1` shows tracebacks instead of a one-line error and an id", reader="cli"),
    Variable("KERNELBOT_PYTHON", "found automatically", "the Python `./kb` builds `.venv` with", reader="kb"),
    Variable("KERNELBOT_HOST_JAX", "on a TPU host whose Python has JAX", "`1`: `./kb` uses the JAX (and libtpu) "
             "the Python it finds already has, as installed; `0`: `.venv` gets the pinned one", reader="kb"),
)
KNOWN = {v.name for v in VARIABLES}
CHOICES = {v.name: v.choices for v in VARIABLES if v.choices}


class SettingsError(KernelbotError, ValueError):
    """A setting has a value kernelbot cannot use; the message names the variable."""
    next_step = "fix the environment variable named above (or its line in the config file)"


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
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


def _money(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw.lstrip("$"))
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an amount in USD (e.g. 10 or 2.5)") from None
    if not value > 0 or value == float("inf"):
        raise SettingsError(f"{name}={raw!r} must be a positive amount")
    return value


def _prices(env: Mapping[str, str], name: str) -> tuple[tuple[str, float, float], ...]:
    """`opus=5/25,claude-opus-4-1=15/75` -> (("opus", 5.0, 25.0), ...)."""
    raw = env.get(name, "").strip()
    out: list[tuple[str, float, float]] = []
    for entry in filter(None, (e.strip() for e in raw.split(","))):
        fragment, _, pair = entry.partition("=")
        try:
            price_in, price_out = (float(x) for x in pair.split("/"))
        except ValueError:
            raise SettingsError(f"{name} entry {entry!r} must be fragment=input/output USD per million tokens, "
                                "e.g. opus=5/25") from None
        if not fragment.strip() or price_in < 0 or price_out < 0:
            raise SettingsError(f"{name} entry {entry!r} needs a model fragment and non-negative prices")
        out.append((fragment.strip(), price_in, price_out))
    return tuple(out)


def _choice(env: Mapping[str, str], name: str, default: str, *, optional: bool = False) -> str:
    value = env.get(name) or default
    if value not in CHOICES[name] and not (optional and value == ""):
        raise SettingsError(f"{name}={value!r} must be one of {', '.join(CHOICES[name])}")
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
    # Correctness runs at the production shapes themselves when they fit these (inputs and outputs together,
    # and the reference's FLOPs), and at smaller shapes that keep the kernel's blocks otherwise.
    full_check_elements: int = 1 << 23
    full_check_gflops: float = 20.0


@dataclass(frozen=True)
class Settings:
    home: Path
    default_target: str = FALLBACK_TARGET
    eval_workers: int = 2
    # "fast": libtpu's fast-forward static profile (seconds per compile); "exact": the unrolled one (slow, heavy).
    static_profile: str = "fast"
    limits: EvalLimits = field(default_factory=EvalLimits)
    use_tpu: bool = True  # KERNELBOT_TPU: evaluate on this host's chip when the target is its generation
    host_target: str | None = None  # this host's TPU generation (None: no TPU of a known generation)
    database_url: str | None = None  # KERNELBOT_DATABASE_URL; None means SQLite in the data directory
    job_modules: tuple[str, ...] = ()  # KERNELBOT_JOB_MODULES: extra job kinds, imported by runners
    anthropic_api_key: str | None = field(default=None, repr=False)  # ANTHROPIC_API_KEY
    model: str | None = None  # KERNELBOT_MODEL; default: the newest active model the API lists
    max_cost_usd: float = 10.0  # KERNELBOT_MAX_COST_USD: the LLM spend cap of one session
    prices: tuple[tuple[str, float, float], ...] = ()  # KERNELBOT_PRICES: (model fragment, in, out) per MTok
    slack_bot_token: str | None = field(default=None, repr=False)  # SLACK_BOT_TOKEN (xoxb-)
    slack_signing_secret: str | None = field(default=None, repr=False)  # SLACK_SIGNING_SECRET (HTTP mode)
    slack_app_token: str | None = field(default=None, repr=False)  # SLACK_APP_TOKEN (xapp-, Socket Mode)
    slack_api_url: str | None = None  # KERNELBOT_SLACK_API_URL: another Web API base URL (the tests' fake)
    steerers: str = ""  # KERNELBOT_STEERERS: who besides a session's owner may steer it (`anyone`, or ids)
    suites: tuple[Path, ...] = ()  # KERNELBOT_SUITES: task suite directories besides tasks/
    digest_channels: tuple[str, ...] = ()  # KERNELBOT_DIGEST_CHANNELS: where the daily digest goes
    digest_cron: str = "0 9 * * *"  # KERNELBOT_DIGEST_CRON: when (crontab; a sixth, leading field is seconds)
    timezone: str = "UTC"  # KERNELBOT_TIMEZONE: the digests' and schedules' time zone
    log_level: str | None = None  # KERNELBOT_LOG_LEVEL; None: the entry point's own default
    log_format: str = "text"  # KERNELBOT_LOG_FORMAT
    config_file: Path | None = None  # the file the settings came from, besides the environment
    cache_root: Path | None = None  # KERNELBOT_CACHE_DIR; None means `cache` in the data directory

    @property
    def database(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'kernelbot.db'}"

    def on_chip(self, target: str) -> bool:
        """Are candidates for `target` run on this host's own TPU?"""
        return self.use_tpu and self.host_target == target

    @property
    def sandbox_dir(self) -> Path:
        """Where sandboxed children get their scratch directories (each removed when its child is done)."""
        return self.home / "sandbox"

    @property
    def artifacts_dir(self) -> Path:
        return self.home / "artifacts"

    @property
    def cache_dir(self) -> Path:
        return self.cache_root or self.home / "cache"

    @property
    def logs_dir(self) -> Path:
        return self.home / "logs"

    def ensure_dirs(self) -> None:
        for path in (self.home, self.artifacts_dir, self.cache_dir, self.logs_dir):
            path.mkdir(parents=True, exist_ok=True)


def _timezone(env: Mapping[str, str]) -> str:
    name = env.get("KERNELBOT_TIMEZONE") or "UTC"
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise SettingsError(f"KERNELBOT_TIMEZONE={name!r} is not a time zone; use an IANA name such as "
                            "Europe/Paris or UTC") from None
    return name


def _cron(env: Mapping[str, str]) -> str:
    value = (env.get("KERNELBOT_DIGEST_CRON") or "0 9 * * *").strip()
    if len(value.split()) not in (5, 6):
        raise SettingsError(f"KERNELBOT_DIGEST_CRON={value!r} must be a crontab line: minute hour day month "
                            "weekday (optionally with seconds first), e.g. '0 9 * * *'")
    return value


def _list(env: Mapping[str, str], name: str, sep: str = ",") -> tuple[str, ...]:
    return tuple(part.strip() for part in env.get(name, "").split(sep) if part.strip())


def target_of_accelerator(accelerator_type: str) -> str | None:
    """The target a TPU runtime's accelerator type names (`v5litepod-4` -> v5e), None for other generations."""
    name = accelerator_type.strip().lower()
    return next((target for prefix, target in ACCELERATOR_PREFIXES if name.startswith(prefix)), None)


def host_target(env: Mapping[str, str], dev: Path = Path("/dev")) -> str | None:
    """This host's TPU generation: its TPU device files (/dev/accelN, /dev/vfio/N) and the accelerator type the TPU
    runtime sets. Nothing is opened: the chip has one holder at a time."""
    chips = dev.is_dir() and (any(dev.glob("accel[0-9]*")) or any((dev / "vfio").glob("[0-9]*")))
    accelerator = env.get("TPU_ACCELERATOR_TYPE", "")
    return target_of_accelerator(accelerator) if chips and accelerator else None


def default_config_file() -> Path:
    return Path(platformdirs.user_config_dir("kernelbot")) / "config.toml"


def config_values(path: Path) -> dict[str, str]:
    """NAME = value lines from a TOML file; an unknown name or a table is refused, naming the file and key."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise SettingsError(f"KERNELBOT_CONFIG={str(path)!r} cannot be read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path} is not valid TOML: {exc}") from None
    values: dict[str, str] = {}
    for key, value in data.items():
        if key not in KNOWN:
            raise SettingsError(f"{path}: unknown setting {key!r}; `kernelbot config` lists the known ones")
        if isinstance(value, dict | list):
            raise SettingsError(f"{path}: {key} must be a single value (a string or a number)")
        values[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return values


def _sources(env: Mapping[str, str], *, look_for_default_file: bool) -> tuple[dict[str, str], Path | None]:
    """The values in force: the environment's (non-empty) over the configuration file's."""
    named = env.get("KERNELBOT_CONFIG")
    path = Path(named).expanduser() if named else default_config_file() if look_for_default_file else None
    if path is not None and not named and not path.is_file():
        path = None
    merged = config_values(path) if path is not None else {}
    merged.update({k: v for k, v in env.items() if v != ""})
    return merged, path


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Settings from `env` (the process environment when None, which also looks for the default config file)."""
    env, config_file = _sources(os.environ if env is None else env, look_for_default_file=env is None)
    home = Path(env.get("KERNELBOT_HOME") or platformdirs.user_data_dir("kernelbot")).expanduser()
    wall_seconds = _int(env, "KERNELBOT_EVAL_TIMEOUT", EvalLimits.wall_seconds)
    limits = EvalLimits(
        wall_seconds=wall_seconds,
        cpu_seconds=max(EvalLimits.cpu_seconds, 3 * wall_seconds),
        memory_mib=_int(env, "KERNELBOT_EVAL_MEMORY_MIB", EvalLimits.memory_mib, minimum=512),
        full_check_elements=_int(env, "KERNELBOT_FULL_CHECK_ELEMENTS", EvalLimits.full_check_elements, minimum=0),
        full_check_gflops=float(_int(env, "KERNELBOT_FULL_CHECK_GFLOPS", int(EvalLimits.full_check_gflops),
                                     minimum=0)),
    )
    on_host = host_target(env)
    return Settings(
        home=home,
        default_target=_choice(env, "KERNELBOT_TARGET", on_host or FALLBACK_TARGET),
        use_tpu=_choice(env, "KERNELBOT_TPU", "auto") == "auto",
        host_target=on_host,
        eval_workers=_int(env, "KERNELBOT_EVAL_WORKERS", 2),
        static_profile=_choice(env, "KERNELBOT_STATIC_PROFILE", "fast"),
        limits=limits,
        database_url=env.get("KERNELBOT_DATABASE_URL") or None,
        anthropic_api_key=env.get("ANTHROPIC_API_KEY") or None,
        model=env.get("KERNELBOT_MODEL") or None,
        max_cost_usd=_money(env, "KERNELBOT_MAX_COST_USD", 10.0),
        prices=_prices(env, "KERNELBOT_PRICES"),
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
        log_level=_choice({"KERNELBOT_LOG_LEVEL": env.get("KERNELBOT_LOG_LEVEL", "").lower()}, "KERNELBOT_LOG_LEVEL",
                          "", optional=True) or None,
        log_format=_choice(env, "KERNELBOT_LOG_FORMAT", "text"),
        config_file=config_file,
        cache_root=Path(env["KERNELBOT_CACHE_DIR"]).expanduser() if env.get("KERNELBOT_CACHE_DIR") else None,
    )


def _masked(secret: str | None) -> str:
    """What may be printed of a secret: its first four characters."""
    return f"{secret[:4]}… (set)" if secret else "none"


def _without_password(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def in_force(settings: Settings) -> dict[str, str]:
    """The value in force of each setting `load_settings` reads, as `kernelbot config` shows it (secrets masked)."""
    lim = settings.limits
    values: dict[str, object] = {
        "KERNELBOT_CONFIG": settings.config_file or "none", "KERNELBOT_HOME": settings.home,
        "KERNELBOT_CACHE_DIR": settings.cache_dir, "KERNELBOT_TARGET": settings.default_target,
        "KERNELBOT_TPU": "auto" if settings.use_tpu else "off", "KERNELBOT_EVAL_WORKERS": settings.eval_workers,
        "KERNELBOT_EVAL_TIMEOUT": lim.wall_seconds, "KERNELBOT_EVAL_MEMORY_MIB": lim.memory_mib,
        "KERNELBOT_FULL_CHECK_ELEMENTS": lim.full_check_elements,
        "KERNELBOT_FULL_CHECK_GFLOPS": f"{lim.full_check_gflops:g}",
        "KERNELBOT_STATIC_PROFILE": settings.static_profile,
        "KERNELBOT_DATABASE_URL": _without_password(settings.database),
        "KERNELBOT_JOB_MODULES": ",".join(settings.job_modules) or "none",
        "ANTHROPIC_API_KEY": _masked(settings.anthropic_api_key),
        "KERNELBOT_MODEL": settings.model or "(the newest the API lists)",
        "KERNELBOT_MAX_COST_USD": f"{settings.max_cost_usd:g}",
        "KERNELBOT_PRICES": ",".join(f"{f}={i:g}/{o:g}" for f, i, o in settings.prices) or "built-in",
        "SLACK_BOT_TOKEN": _masked(settings.slack_bot_token), "SLACK_APP_TOKEN": _masked(settings.slack_app_token),
        "SLACK_SIGNING_SECRET": _masked(settings.slack_signing_secret),
        "KERNELBOT_SLACK_API_URL": settings.slack_api_url or "https://slack.com/api/",
        "KERNELBOT_STEERERS": settings.steerers or "none",
        "KERNELBOT_SUITES": os.pathsep.join(map(str, settings.suites)) or "none",
        "KERNELBOT_DIGEST_CHANNELS": ",".join(settings.digest_channels) or "none",
        "KERNELBOT_DIGEST_CRON": settings.digest_cron, "KERNELBOT_TIMEZONE": settings.timezone,
        "KERNELBOT_LOG_LEVEL": settings.log_level or "(the command's own)", "KERNELBOT_LOG_FORMAT": settings.log_format,
    }
    return {name: str(value) for name, value in values.items()}
