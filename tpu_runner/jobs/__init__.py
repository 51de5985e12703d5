"""The job-kind contract, shared by whoever defines job kinds (the evaluator's in `runner`, the agents') and the
daemon that runs them (`contract`: what a handler is handed and returns, named sets of handlers, the Evaluation row
and the job result made from an evaluation). It holds no handler and starts nothing."""
