"""The installation and the configuration: Python, kernelbot, jax and its matching libtpu, the settings,
the hardware."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from bot.cli.checks.report import Check
from bot.task_suites import SOURCE_ROOT
from storage.settings import VARIABLES, Settings, SettingsError
from tpu_runner.hardware import PINNED, SUPPORTED, get_chip, supported

MIN_PYTHON = (3, 11)
JAX_PIN = PINNED  # pyproject.toml's jax[tpu] pin, for fix hints when jax's own version is unknown


def installed_version(distribution: str) -> str | None:
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
    return Check("python", "fail", f"{shown} ({executable}) is older than the {need} kernelbot needs",
                 f"install Python {need} or newer; `./kb` builds .venv with one it finds (or set KERNELBOT_PYTHON)")


def check_kernelbot() -> Check:
    version = installed_version("kernelbot")
    if version is None:
        return Check("kernelbot", "warn", f"not installed as a package (running from {SOURCE_ROOT})",
                     f"`pip install -e {SOURCE_ROOT}` (or `./kb`, which does it) gives the `kernelbot` command",
                     needed=False)
    return Check("kernelbot", "ok", f"{version} ({SOURCE_ROOT})", needed=False)


def check_jax() -> Check:
    versions = {name: installed_version(name) for name in ("jax", "jaxlib")}
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
    if not supported(jax.__version__):
        return Check("jax", "warn", f"{shown}; `import jax` works, but kernelbot is tested on jax "
                     f"{' and '.join(SUPPORTED)} only", f"on a host without a TPU: `pip install "
                     f"'jax[tpu]=={JAX_PIN}'`; on a TPU host, its own JAX is used as installed", needed=False)
    return Check("jax", "ok", f"{shown}; `import jax` works ({jax.__version__}, {jax.__file__})")


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

    version = installed_version("libtpu")
    jax_version = installed_version("jax") or JAX_PIN
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


def check_hardware(settings: Settings | None) -> Check:
    """This host's TPU, from its runtime's variables and device files (nothing is opened), or CPU only: then
    results are estimates, which is fine but worth saying."""
    target = settings.host_target if settings else None
    if target is not None and settings is not None:
        chip = get_chip(target)
        if not settings.use_tpu:
            return Check("hardware", "warn", f"a TPU {chip.name} ({chip.device_kind}) is on this host, but "
                         "KERNELBOT_TPU=off: candidates are checked in interpret mode and their times estimated",
                         "unset KERNELBOT_TPU to check and time them on the chip", needed=False)
        return Check("hardware", "ok", f"TPU {chip.name} ({chip.device_kind}) on this host: the default target; "
                     f"candidates for {chip.name} are checked and timed on the chip", needed=False)
    return Check("hardware", "warn", "CPU only (no TPU on this host): kernels are compiled for the target "
                 "with libtpu and checked in interpret mode; their times are `estimated`, not measured",
                 "nothing to fix for estimates; for measured times run `kernelbot runner` on a TPU host",
                 needed=False)
