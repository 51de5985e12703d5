"""Durable state and what every layer reads: settings, logging, the database (engines, schema, migrations) and
the repository functions over it - sessions, the job queue, runners, schedules, digests and the outbox
the surfaces deliver from. Callers pass their session and own the transaction."""
