"""The Slack app: listeners, the Block Kit views, outbound delivery, scheduling and the server."""
