# syntax=docker/dockerfile:1
# kernelbot: one image for `kernelbot serve` (the Slack app) and `kernelbot runner` (one per TPU VM); CMD picks.
#   docker build -t kernelbot .
#   docker run -d --env-file /etc/kernelbot/serve.env -v kernelbot-data:/data kernelbot                  # serve
#   docker run -d --env-file /etc/kernelbot/runner.env -v kernelbot-data:/data --privileged --net=host \
#       --stop-timeout 360 kernelbot runner --target v6e --grace-seconds 300                               # runner
# docs/operations.md has the rest: secrets, TPU devices, upgrades, backups, logs, health.
# Needs BuildKit (the default builder since Docker 23): the pip cache mounts and the heredoc below use it.

# An exact release, never a moving tag. To pin the very bytes as well, append the digest the registry serves:
#   docker buildx imagetools inspect python:3.12.15-slim-bookworm        (the "Digest: sha256:..." line)
#   FROM python:3.12.15-slim-bookworm@sha256:<that digest>
FROM python:3.12.15-slim-bookworm

# Nothing secret is set here: Slack tokens, the Anthropic key and the database URL come at run time
# (docker run --env-file, a systemd EnvironmentFile), never in a layer.
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    ALLOW_MULTIPLE_LIBTPU_LOAD=1 \
    KERNELBOT_HOME=/data

# tini as PID 1: passes SIGTERM to kernelbot alone (a runner then stops claiming and lets running jobs finish
# within --grace-seconds; serve drains) and reaps whatever orphans evaluation children leave behind.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini=0.19.0-1+b3 \
    && rm -rf /var/lib/apt/lists/*

# A fixed uid/gid so volumes and bind mounts can be prepared on the host (chown 10001:10001). The user owns only
# its home (matplotlib's cache) and /data (KERNELBOT_HOME); the code under /app stays root's and read-only.
RUN groupadd --system --gid 10001 kernelbot \
    && useradd --system --uid 10001 --gid kernelbot --home-dir /home/kernelbot --create-home \
        --shell /usr/sbin/nologin kernelbot \
    && install -d -o kernelbot -g kernelbot -m 0750 /data

WORKDIR /app

# The dependencies first, read from pyproject.toml alone: this layer (jax[tpu] and its libtpu, about 1 GB) is
# rebuilt only when pyproject.toml changes, and pip's downloads stay in BuildKit's cache, never in a layer.
# EXTRAS names optional dependency groups: `aot` is the pinned jax[tpu] and its libtpu (the image brings its own
# JAX, TPU VM or not); add `port` for `kernelbot port` and `/kernel port` (`--build-arg EXTRAS=aot,port`: torch and
# torchax, about 4 GB more).
ARG EXTRAS="aot"
COPY pyproject.toml ./
RUN --mount=type=cache,target=/root/.cache/pip \
    python -c 'import os, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; extras = [e for e in os.environ.get("EXTRAS", "").split(",") if e]; print("\n".join(p["dependencies"] + [d for e in extras for d in p["optional-dependencies"][e]]))' \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# Then the source: every package [tool.setuptools.packages.find] includes (bot/ with the Slack app's manifest, which
# doctor compares with the scopes the bot needs), the built-in task suite, and the README (the package's metadata names it). Editable on purpose: the CLI finds the built-in suite
# at <source root>/tasks (REPO_TASKS in bot/task_suites.py), and sessions record task paths that serve and every
# runner must resolve alike (/app/tasks/... in each container); a plain install would put bot/ in site-packages with
# no tasks/ beside it. Bytecode is compiled now because /app is read-only to the user at run time.
COPY bot/ bot/
COPY agents/ agents/
COPY tpu_runner/ tpu_runner/
COPY storage/ storage/
COPY tasks/ tasks/
COPY README.md ./
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install --no-deps -e . \
    && python -m compileall -q /app \
    && kernelbot --help > /dev/null

# The health check, for either role, read from PID 1's command line (`kernelbot healthcheck` in bot/cli/healthcheck.py):
#   serve --http  GET /healthz on its --port (200 while it serves);
#   runner        the database is reachable at the schema head and this host's runner heartbeated within one
#                 lease (--lease-seconds, 60 s by default), i.e. before its jobs would be taken over;
#   serve         (Socket Mode) the database is reachable at the schema head.
# `kernelbot healthcheck serve --http --port 3000` runs it by hand; exit 0 is healthy.

# HOME only now: while building as root it stays /root, where pip's cache mount is.
ENV HOME=/home/kernelbot
USER 10001:10001
VOLUME ["/data"]
EXPOSE 3000
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=20s --start-period=180s --retries=3 \
    CMD ["kernelbot", "healthcheck"]
ENTRYPOINT ["/usr/bin/tini", "--", "kernelbot"]
CMD ["serve"]
