"""Surfaces: the command line today, the Slack app later. No agent or evaluation logic lives here."""
