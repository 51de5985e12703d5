"""Everything below the agents that runs kernels and tasks: the evaluator (`evaluate` and the sandboxed processes
it supervises: the candidate's child, the reference's child, the compile servers, speaking `protocol`), the
generic job daemon a runner runs (`daemon`, with the registry of job kinds in `job_kinds`), the task format
(`tasks`, `jaxbench`) and porting kernels a team already has into tasks (`porting`)."""
