"""`kernelbot doctor`: the installation and configuration checked, each problem explained with its fix.

Each check is a small function returning a `Check`; the CLI runs them in order (`run.run_checks`) and renders them
with the pure `render_checks` / `as_json`. Checks that touch the outside world (the compile, the database, Slack,
Anthropic) take what they need as arguments and never raise: whatever goes wrong becomes a failed Check that
names the value and the next step. The ahead-of-time compile runs in a child process with a timeout, so a
broken libtpu can neither hang nor crash doctor.
"""
