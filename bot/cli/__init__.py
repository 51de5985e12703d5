"""The terminal: `kernelbot`'s command groups (one module each, wired in `app`), their shared options, rendering
and the installation checks."""
