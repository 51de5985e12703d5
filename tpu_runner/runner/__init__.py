"""The TPU runner daemon (`daemon`: claims jobs, runs them, heartbeats, records results) and the job kinds it serves
(`job_kinds`: the evaluator's own; the contract every package's kinds follow is `tpu_runner.jobs`)."""
