"""The TPU runner daemon (`daemon`: claims jobs, runs them, heartbeats, records results) and the job kinds it serves
(`job_kinds`: the evaluator's own; the contract every package's kinds follow is `tpu_runner.jobs`)."""

from tpu_runner import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "describe_host": "daemon", "install_signal_handlers": "daemon", "RunnerConfig": "daemon", "RunnerDaemon": "daemon",
    "EVALUATION_KINDS": "job_kinds", "production_check_job": "job_kinds", "production_check_wanted": "job_kinds",
})
