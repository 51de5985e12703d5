"""The terminal: `kernelbot`'s command groups (one module each, wired in `app`), their shared options, rendering
and the installation checks.

Each command imports what only it needs (jax, the evaluator, the agents, the Slack server) inside its function:
`kernelbot --help` and the light commands start in half a second instead of the seconds jax and the SDKs take."""
