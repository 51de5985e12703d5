"""What reaches Slack unasked: the notifier's outbox, the paced sender, thread rendering, digests."""
