"""Surfaces: the command line (`bot/cli`) and the Slack app (`bot/slack`). No agent or evaluation logic lives here."""
