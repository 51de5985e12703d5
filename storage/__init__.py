"""Durable state: settings, the data directory and (in later issues) the database and the job queue."""
