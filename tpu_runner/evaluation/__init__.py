"""The evaluation pipeline, parent side (`evaluate`: one candidate or many, through the stages of the other packages)
and what `kernelbot tasks` shows of a task (`task_info`).

The functions named as their modules are imported from those modules (`from tpu_runner.evaluation.evaluate import
evaluate`, `from tpu_runner.evaluation.task_info import task_info`): once a module is loaded, the package's attribute
of its name is the module, so the package cannot export a function of that name."""

from tpu_runner import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "checker_ran_out": "evaluate", "describe_tasks": "evaluate", "EvalRequest": "evaluate", "evaluate_many": "evaluate",
    "headline": "evaluate", "KernelFileError": "evaluate", "KernelSource": "evaluate", "task_beyond_limits": "evaluate",
    "prepare_libtpu_env": "task_info", "TaskInfo": "task_info",
})
