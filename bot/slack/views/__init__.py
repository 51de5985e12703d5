"""Every Block Kit payload, built by pure `build_*`-style functions from plain data."""
