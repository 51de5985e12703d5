"""The evaluation pipeline, parent side (`evaluate`: one candidate or many, through the stages of the other packages)
and what `kernelbot tasks` shows of a task (`task_info`)."""
