"""The job-kind contract, shared by whoever defines job kinds (the evaluator's in `runner`, the agents') and the
daemon that runs them (`contract`: what a handler is handed and returns, named sets of handlers, the Evaluation row
and the job result made from an evaluation). It holds no handler and starts nothing."""

from tpu_runner import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "compose": "contract", "evaluation_record": "contract", "FollowUp": "contract", "job_result": "contract",
    "JobContext": "contract", "JobHandler": "contract", "JobKinds": "contract", "JobOutcome": "contract",
    "JobRejected": "contract", "load_job_modules": "contract",
})
