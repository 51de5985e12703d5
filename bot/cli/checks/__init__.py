"""`kernelbot doctor`: the installation and configuration checked, each problem explained with its fix.

Each check is a small function returning a `Check`; the CLI runs them in order (`run_checks`) and renders them
with the pure `render_checks` / `as_json`. Checks that touch the outside world (the compile, the database, Slack,
Anthropic) take what they need as arguments and never raise: whatever goes wrong becomes a failed Check that
names the value and the next step. The ahead-of-time compile runs in a child process with a timeout, so a
broken libtpu can neither hang nor crash doctor.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from storage.settings import VARIABLES, Settings, SettingsError
from tpu_runner.hardware import ChipSpec, get_chip

Status = Literal["ok", "warn", "fail", "skip"]

MIN_PYTHON = (3, 12)
REPO = Path(__file__).resolve().parents[3]
MANIFEST = REPO / "slack" / "manifest.yaml"
# What the bot calls Slack for; slack/manifest.yaml declares the same list (check_slack_scopes compares).
SLACK_SCOPES = ("commands", "chat:write", "files:write", "files:read", "channels:history", "groups:history",
                "users:read", "usergroups:read")
SLACK_TIMEOUT_S = 10
ANTHROPIC_TIMEOUT_S = 20.0
COMPILE_TIMEOUT_S = 180.0
DATABASE_TIMEOUT_S = 5
JAX_PIN = "0.12.0.1"  # pyproject.toml's jax[tpu] pin, for fix hints when jax's own version is unknown
_COMPILE_MARKER = "kernelbot-doctor-compile: "
_COMPILE_CHILD = "import sys; from bot.cli.checks import compile_probe; compile_probe(sys.argv[1])"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""
    needed: bool = True  # a failure of a needed check makes doctor exit 1

    @property
    def blocking(self) -> bool:
        return self.status == "fail" and self.needed


# -- rendering (pure) --------------------------------------------------------------------------------------------

_LABELS = {"ok": "ok", "warn": "warn", "fail": "FAIL", "skip": "skip"}


def exit_code(checks: Iterable[Check]) -> int:
    """1 when any needed check failed, else 0 (warnings and skips never fail doctor)."""
    return 1 if any(c.blocking for c in checks) else 0


def summary(checks: list[Check]) -> str:
    counts = {s: sum(c.status == s for c in checks) for s in _LABELS}
    blocking = [c.name for c in checks if c.blocking]
    verdict = (f"not ready: {', '.join(blocking)} failed" if blocking
               else "ready" + (" (with warnings)" if counts["warn"] or counts["fail"] else ""))
    plural = "" if counts["warn"] == 1 else "s"
    return (f"{counts['ok']} ok, {counts['warn']} warning{plural}, {counts['fail']} failed, {counts['skip']} "
            f"skipped: {verdict}")


def render_checks(checks: list[Check]) -> str:
    """One line per check (status, name, detail), then `fix: ...` under each check that is not ok or skipped."""
    width = max((len(c.name) for c in checks), default=0)
    lines = []
    for c in checks:
        lines.append(f"{_LABELS[c.status]:<4}  {c.name:<{width}}  {c.detail}")
        if c.fix and c.status in ("warn", "fail"):
            lines.append(f"{'':<4}  {'':<{width}}  fix: {c.fix}")
    lines.append(summary(checks))
    return "\n".join(lines)


def as_json(checks: list[Check]) -> dict[str, Any]:
    return {"ready": exit_code(checks) == 0, "exit_code": exit_code(checks), "summary": summary(checks),
            "checks": [{**asdict(c), "blocking": c.blocking} for c in checks]}


# -- the installation --------------------------------------------------------------------------------------------

def _version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def check_python(version: tuple[int, ...] | None = None, executable: str = sys.executable) -> Check:
    version = version or tuple(sys.version_info[:3])
    shown = ".".join(map(str, version))
    need = ".".join(map(str, MIN_PYTHON))
    if tuple(version[:2]) >= MIN_PYTHON:
        return Check("python", "ok", f"{shown} ({executable})")
    return Check("python", "fail", f"{shown} ({executable}) is older than the {need} jax 0.12 needs",
                 f"install Python {need} or newer; `./kb` builds .venv with one it finds (or set KERNELBOT_PYTHON)")


def check_kernelbot() -> Check:
    version = _version("kernelbot")
    if version is None:
        return Check("kernelbot", "warn", f"not installed as a package (running from {REPO})",
                     f"`pip install -e {REPO}` (or `./kb`, which does it) gives the `kernelbot` command", needed=False)
    return Check("kernelbot", "ok", f"{version} ({REPO})", needed=False)


def check_jax() -> Check:
    versions = {name: _version(name) for name in ("jax", "jaxlib")}
    missing = [name for name, v in versions.items() if v is None]
    if missing:
        return Check("jax", "fail", f"{' and '.join(missing)} not installed",
                     f"`pip install 'jax[tpu]=={JAX_PIN}'` (pyproject.toml pins it; `./kb` installs it)")
    shown = f"jax {versions['jax']}, jaxlib {versions['jaxlib']}"
    try:
        import jax  # importing does not start libtpu; the compile check does that, in a child
    except Exception as exc:
        return Check("jax", "fail", f"{shown} installed, but `import jax` fails: {type(exc).__name__}: {exc}",
                     f"reinstall matching versions: `pip install --force-reinstall 'jax[tpu]=={versions['jax']}'`")
    return Check("jax", "ok", f"{shown}; `import jax` works ({jax.__version__})")


def libtpu_requirement(jax_requires: Iterable[str]) -> str | None:
    """The libtpu version pattern jax's `tpu` extra pins (`0.0.50.*`), from jax's metadata; None if unpinned."""
    for line in jax_requires:
        spec, _, marker = line.partition(";")
        spec = spec.replace(" ", "")
        if spec.startswith("libtpu==") and '"tpu"' in marker:
            return spec.removeprefix("libtpu==")
    return None


def version_matches(version: str, pattern: str) -> bool:
    """`==pattern` as pip reads it, for the two forms jax uses: exact, or a trailing `.*` prefix."""
    if pattern.endswith(".*"):
        return version == pattern[:-2] or version.startswith(pattern[:-1])
    return version == pattern


def check_libtpu() -> Check:
    from importlib import metadata
    from importlib.util import find_spec

    version = _version("libtpu")
    jax_version = _version("jax") or JAX_PIN
    reinstall = f"`pip install 'jax[tpu]=={jax_version}'` (it pins the matching libtpu)"
    if version is None:
        return Check("libtpu", "fail", "libtpu is not installed: kernelbot compiles for TPU topologies with it",
                     reinstall)
    spec = find_spec("libtpu")
    library = Path(os.environ.get("TPU_LIBRARY_PATH") or (Path(spec.origin).parent / "libtpu.so" if spec and
                                                            spec.origin else ""))
    if not library.is_file():
        return Check("libtpu", "fail", f"libtpu {version} is installed but its library {library} is missing",
                     f"reinstall: {reinstall}" + (" (or unset TPU_LIBRARY_PATH)" if "TPU_LIBRARY_PATH" in os.environ
                                                 else ""))
    try:
        pattern = libtpu_requirement(metadata.requires("jax") or [])
    except metadata.PackageNotFoundError:
        pattern = None
    if pattern and not version_matches(version, pattern):
        return Check("libtpu", "fail", f"libtpu {version} does not match jax {jax_version}, which needs "
                     f"libtpu=={pattern}", reinstall)
    return Check("libtpu", "ok", f"{version} ({library})")


# -- the configuration -------------------------------------------------------------------------------------------

def variable_named(message: str) -> str | None:
    """The first known setting a SettingsError's message names."""
    hits = [(message.find(v.name), v.name) for v in VARIABLES if v.name in message]
    return min(hits)[1] if hits else None


def check_settings(load: Callable[[], Settings]) -> tuple[Check, Settings | None]:
    try:
        settings = load()
    except SettingsError as exc:
        name = variable_named(str(exc))
        where = f"correct or unset {name}" if name else "correct the setting named"
        return Check("settings", "fail", str(exc), f"{where} (in the environment, or in the KERNELBOT_CONFIG "
                     "file); `kernelbot config` lists every setting and its allowed values"), None
    source = f"from {settings.config_file} and the environment" if settings.config_file else \
        "from the environment (no config file)"
    return Check("settings", "ok", f"loaded {source}; home {settings.home}, target {settings.default_target}"), \
        settings


def check_hardware(host: str | None = None) -> Check:
    """TPU chips present, or CPU only: then results are estimates, which is fine but worth saying."""
    from tpu_runner.evaluate import detect_host

    host = host or detect_host()
    if host == "tpu":
        dev = Path("/dev")
        chips = sorted(p.name for p in [*dev.glob("accel[0-9]*"), *(dev / "vfio").glob("[0-9]*")])
        return Check("hardware", "ok", f"TPU chips on this host ({', '.join(chips) or 'found'}): times on the "
                     "host's own generation are measured", needed=False)
    return Check("hardware", "warn", "CPU only (no TPU chips on this host): kernels are compiled for the target "
                 "with libtpu and checked in interpret mode; their times are `estimated`, not measured",
                 "nothing to fix for estimates; for measured times run `kernelbot runner` on a TPU host",
                 needed=False)


# -- the database ------------------------------------------------------------------------------------------------

def _shown_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _sqlite_path(url: str) -> Path | None:
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def _writable_dir(path: Path) -> Path | None:
    """The nearest existing directory at or above `path` if it can be written in, else None."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate if candidate.is_dir() and os.access(candidate, os.W_OK | os.X_OK) else None
    return None


def check_database(settings: Settings) -> Check:
    """Reachable and at the schema head. SQLite upgrades itself; a server database must be upgraded by hand."""
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from storage.engine import make_engine
    from storage.migrate import current_revision, head_revision, known_revision

    url = settings.database
    variable = "KERNELBOT_DATABASE_URL" if settings.database_url else "KERNELBOT_HOME"
    try:
        shown = _shown_url(url)
    except ArgumentError:
        return Check("database", "fail", f"{variable} is not a database URL", "set it like "
                     "postgresql://user@host:5432/kernelbot, or unset it for SQLite in KERNELBOT_HOME")
    sqlite_file = _sqlite_path(url)
    sqlite = url.startswith("sqlite")
    if sqlite_file is not None and not sqlite_file.exists():
        place = _writable_dir(sqlite_file.parent)
        if place is None:
            return Check("database", "fail", f"SQLite {sqlite_file} cannot be created: no writable directory on "
                         "its path", f"make {sqlite_file.parent} writable, or set {variable} to another place")
        return Check("database", "ok", f"SQLite {sqlite_file} (not created yet: it is created and migrated to "
                     f"{head_revision()} on first use)")
    engine = None
    try:
        engine = make_engine(url) if sqlite else make_engine(url, connect_args={"connect_timeout": DATABASE_TIMEOUT_S})
        current = current_revision(engine)
    except (SQLAlchemyError, ImportError) as exc:  # ImportError: a driver kernelbot does not ship
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        return Check("database", "fail", f"cannot reach {shown}: {reason}",
                     f"check {variable} (a postgresql:// or sqlite:/// URL; is the server running and the database "
                     "created?)" if variable == "KERNELBOT_DATABASE_URL" else
                     f"check that {variable} ({settings.home}) holds a kernelbot SQLite database or none")
    finally:
        if engine is not None:
            engine.dispose()
    head = head_revision()
    if current == head:
        return Check("database", "ok", f"{shown} at the schema head {head}")
    if current is not None and not known_revision(current):
        return Check("database", "fail", f"{shown} is at revision {current}, which this kernelbot does not know "
                     f"(its head is {head}): a newer kernelbot migrated it",
                     f"upgrade kernelbot to the version the others use, or set {variable} to another database")
    at = f"at {current}" if current else "empty (no schema)"
    if sqlite:
        return Check("database", "ok", f"{shown} {at}; it upgrades itself to {head} at the next start")
    return Check("database", "fail", f"{shown} is {at}, the code needs {head}: processes refuse to start on it",
                 "run `kernelbot db upgrade` (with the same KERNELBOT_DATABASE_URL), then doctor again")


# -- the ahead-of-time compile -----------------------------------------------------------------------------------

def _add_one_kernel(x_ref: Any, o_ref: Any) -> None:
    o_ref[...] = x_ref[...] + 1.0  # [8, 128] f32: one (8, 128) tile in VMEM


def compile_probe(target: str) -> None:
    """In the child: lower and compile a tiny Pallas kernel for the target's topology; print one marked line."""
    from tpu_runner.task_info import prepare_libtpu_env

    chip = get_chip(target)
    prepare_libtpu_env(chip)  # before libtpu starts
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the host side; libtpu still compiles for the topology
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    from tpu_runner.compile import target_sharding

    t0 = time.perf_counter()
    sharding = target_sharding(chip)
    kernel = pl.pallas_call(_add_one_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32))
    lowered = jax.jit(kernel).trace(jax.ShapeDtypeStruct((8, 128), jnp.float32, sharding=sharding)).lower()
    compiled = lowered.compile()
    memory = compiled.memory_analysis()
    report = {"target": target, "topology": chip.topology, "seconds": round(time.perf_counter() - t0, 2),
              "device_kind": sharding.mesh.devices.flat[0].device_kind,
              "mosaic": "tpu_custom_call" in lowered.as_text(), "argument_bytes": memory.argument_size_in_bytes}
    print(_COMPILE_MARKER + json.dumps(report), flush=True)


def compile_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: the host side on the CPU, libtpu loadable beside other compiling processes."""
    env = dict(base)
    env.update(ALLOW_MULTIPLE_LIBTPU_LOAD="1", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
               JAX_ENABLE_COMPILATION_CACHE="false", PYTHONPATH=os.pathsep.join(
                   p for p in (str(REPO), base.get("PYTHONPATH", "")) if p))
    return env


def compile_command(target: str) -> list[str]:
    return [sys.executable, "-c", _COMPILE_CHILD, target]


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b.*")


def error_summary(text: str, count: int = 3, limit: int = 600) -> str:
    """The child's own error: the last exception line of a traceback, else its last few meaningful lines."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip().strip("~^ ")]
    exceptions = [line for line in lines if _EXCEPTION_LINE.match(line)]
    return (exceptions[-1] if exceptions else " | ".join(lines[-count:]))[-limit:]


def compile_verdict(chip: ChipSpec, *, returncode: int | None, stdout: str, stderr: str, seconds: float,
                    timeout: float) -> Check:
    """What the child's ending says about libtpu (returncode None: it was stopped at the timeout)."""
    import shlex
    import signal

    by_hand = f"`{shlex.join(compile_command(chip.name))}`"
    reinstall = f"`pip install --force-reinstall 'jax[tpu]=={_version('jax') or JAX_PIN}'`"
    if returncode is None:
        return Check("compile", "fail", f"the {chip.name} ({chip.topology}) compile did not finish within "
                     f"{timeout:g} s and was stopped", f"run it by hand to see where it stops: {by_hand}; a host "
                     "this slow or busy needs a longer --compile-timeout (or --skip-compile)")
    reports = [line.removeprefix(_COMPILE_MARKER) for line in stdout.splitlines() if line.startswith(_COMPILE_MARKER)]
    if returncode == 0 and reports:
        report = json.loads(reports[-1])
        if not report["mosaic"]:
            return Check("compile", "fail", f"the Pallas kernel compiled for {chip.name} without a Mosaic call: "
                         "kernels would not be checked as the TPU compiles them", reinstall)
        done = (f"a Pallas kernel compiled ahead of time for {chip.name} ({chip.topology}) with libtpu in "
                f"{report['seconds']:.1f} s ({seconds:.1f} s with start-up)")
        if report["device_kind"] != chip.device_kind:
            return Check("compile", "warn", f"{done}, but libtpu calls the chip {report['device_kind']!r} where "
                         f"kernelbot expects {chip.device_kind!r}",
                         f"check that libtpu {_version('libtpu')} is the one jax pins; {reinstall}")
        return Check("compile", "ok", done)
    if returncode < 0:
        try:
            how = f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"was killed by signal {-returncode}"
    else:
        how = f"exited with status {returncode}"
    tail = error_summary(stderr) or error_summary(stdout) or "no output"
    return Check("compile", "fail", f"the {chip.name} ({chip.topology}) compile {how}: {tail}",
                 f"see the whole error with {by_hand}; a broken or mismatched libtpu is fixed by {reinstall}")


def check_compile(target: str, *, timeout: float = COMPILE_TIMEOUT_S,
                  env: Mapping[str, str] | None = None) -> Check:
    """A tiny Pallas kernel lowered and compiled for the target topology, in a child with a timeout."""
    chip = get_chip(target)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(compile_command(target), capture_output=True, text=True, timeout=timeout,
                              env=compile_environment(os.environ if env is None else env), cwd=REPO)
    except subprocess.TimeoutExpired:
        return compile_verdict(chip, returncode=None, stdout="", stderr="", seconds=time.perf_counter() - t0,
                               timeout=timeout)
    return compile_verdict(chip, returncode=proc.returncode, stdout=proc.stdout, stderr=proc.stderr,
                           seconds=time.perf_counter() - t0, timeout=timeout)


# -- Slack -------------------------------------------------------------------------------------------------------

_SLACK_AUTH_FIXES = {
    "invalid_auth": "copy the Bot User OAuth Token (xoxb-...) from the app's OAuth & Permissions page into "
                    "SLACK_BOT_TOKEN",
    "not_authed": "set SLACK_BOT_TOKEN to the Bot User OAuth Token (xoxb-...)",
    "token_revoked": "reinstall the app to the workspace (OAuth & Permissions) and set the new SLACK_BOT_TOKEN",
    "token_expired": "token rotation is on: turn it off for the app or set a fresh SLACK_BOT_TOKEN",
    "account_inactive": "the bot user was deactivated: reinstall the app and set the new SLACK_BOT_TOKEN",
}


def manifest_scopes(path: Path = MANIFEST) -> set[str] | None:
    """The bot scopes slack/manifest.yaml declares; None when the file is not there (an installed wheel)."""
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
    manifest_note = (f"; slack/manifest.yaml does not declare {', '.join(undeclared)}" if undeclared else "")
    manifest_fix = (f"add {', '.join(undeclared)} under oauth_config.scopes.bot in slack/manifest.yaml"
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
                     "from slack/manifest.yaml), reinstall the app to the workspace and set the new SLACK_BOT_TOKEN"
                     + (f"; {manifest_fix}" if manifest_fix else ""))
    if undeclared:
        return Check("slack scopes", "warn", f"the token has all {len(needed)} scopes{manifest_note}", manifest_fix)
    return Check("slack scopes", "ok", f"the token has all {len(needed)} scopes the bot needs"
                 + (" (as slack/manifest.yaml declares)" if declared is not None else ""))


def _masked(secret: str) -> str:
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
        return Check("slack", "fail", f"{_slack_where(settings)} refuses SLACK_BOT_TOKEN ({_masked(token)}): {error}",
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


# -- Anthropic ---------------------------------------------------------------------------------------------------

def check_anthropic(settings: Settings) -> list[Check]:
    """The key lists models; the configured KERNELBOT_MODEL (or the default choice) is among them."""
    if not settings.anthropic_api_key:
        return [Check("anthropic", "skip", "ANTHROPIC_API_KEY is not set: the agents use the offline brain")]
    import anthropic

    from agents.anthropic_brain import BrainError, choose_model

    client = anthropic.Anthropic(api_key=settings.anthropic_api_key, max_retries=0, timeout=ANTHROPIC_TIMEOUT_S)
    where = f"the Messages API at {client.base_url}"
    key = f"ANTHROPIC_API_KEY ({_masked(settings.anthropic_api_key)})"
    base_fix = " (ANTHROPIC_BASE_URL points elsewhere: check it too)" if os.environ.get("ANTHROPIC_BASE_URL") else ""
    try:
        models = list(client.models.list(limit=100))
    except (anthropic.AuthenticationError, anthropic.PermissionDeniedError) as exc:
        return [Check("anthropic", "fail", f"{where} refuses {key}: {exc.status_code} {_api_message(exc)}",
                      "create or copy a key at console.anthropic.com -> API keys and set ANTHROPIC_API_KEY"
                      + base_fix)]
    except anthropic.APIConnectionError as exc:
        return [Check("anthropic", "fail", f"cannot reach {where}: {exc}", "check the network" + base_fix)]
    except anthropic.APIStatusError as exc:
        return [Check("anthropic", "fail", f"{where} answered {exc.status_code} to GET /v1/models: "
                      f"{_api_message(exc)}", "try again later; status.anthropic.com says whether it is down")]
    ids = [m.id for m in models]
    key_check = Check("anthropic", "ok", f"{key} lists {len(ids)} models at {where}")
    try:
        model = choose_model(client, settings.model)
    except (BrainError, anthropic.APIError) as exc:
        return [key_check, Check("anthropic model", "fail", f"no default model: {exc}",
                                 f"set KERNELBOT_MODEL to one of {', '.join(ids) or 'the models your key can use'}")]
    return [key_check, model_verdict(model, configured=settings.model is not None,
                                     lifecycles={m.id: getattr(m, "lifecycle", "active") for m in models})]


def _api_message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        return str((body.get("error") or {}).get("message") or exc)
    return str(exc)


def model_verdict(model: str, *, configured: bool, lifecycles: Mapping[str, str]) -> Check:
    """The model the anthropic brain would use, against the models the key lists (id -> lifecycle)."""
    how = f"KERNELBOT_MODEL={model!r}" if configured else f"{model} (the newest active Opus listed)"
    active = sorted(m for m, life in lifecycles.items() if life == "active")
    choose = f"set KERNELBOT_MODEL to one of {', '.join(active)}, or unset it for the newest active Opus"
    if model not in lifecycles:
        return Check("anthropic model", "fail", f"{how} is not among the {len(lifecycles)} models this key can use "
                     f"({', '.join(sorted(lifecycles)) or 'none'})", choose)
    life = lifecycles[model] or "active"
    if life == "active":
        return Check("anthropic model", "ok", f"{how} is available")
    if life == "deprecated":
        return Check("anthropic model", "warn", f"{how} is deprecated: it still answers, with a warning, until it "
                     "is retired", choose)
    return Check("anthropic model", "fail", f"{how} is {life}", choose)


# -- all of them -------------------------------------------------------------------------------------------------

def run_checks(load: Callable[[], Settings], *, skip_compile: bool = False,
               compile_timeout: float = COMPILE_TIMEOUT_S) -> list[Check]:
    checks = [check_python(), check_kernelbot(), check_jax(), check_libtpu()]
    settings_check, settings = check_settings(load)
    checks += [settings_check, check_hardware()]
    if settings is None:
        return checks + [Check(name, "skip", "not checked: the settings did not load")
                         for name in ("database", "compile", "slack", "anthropic")]
    checks.append(check_database(settings))
    if skip_compile:
        checks.append(Check("compile", "skip", f"skipped (--skip-compile); the {settings.default_target} compile "
                            "is not checked"))
    elif any(c.blocking for c in checks if c.name in ("jax", "libtpu")):
        checks.append(Check("compile", "fail", "not tried: jax or libtpu is missing (above)",
                            "fix jax and libtpu first"))
    else:
        checks.append(check_compile(settings.default_target, timeout=compile_timeout))
    return checks + check_slack(settings) + check_anthropic(settings)
