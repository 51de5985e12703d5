"""Kernel tasks: the formats read unchanged (`task`: kernelbot's own; `jaxbench`, `kernelbench`), the entry point a
task or candidate is called by (`entry_point`), evaluator-owned inputs (`inputs`), safe parsing of Python source
(`pysource`), and checking a pasted reference before a session starts on it (`reference_check`, whose sandboxed
child is `check_child`)."""

from tpu_runner import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "abstract_configurations": "task", "ArgSpec": "task", "concrete_configurations": "task", "config_from_json": "task",
    "config_to_json": "task", "Configuration": "task", "discover_tasks": "task", "has_test_inputs": "task",
    "import_reference": "task", "input_bounds": "task", "KNOWN_FAMILIES": "task", "load_task": "task",
    "split_configurations": "task", "Task": "task", "TaskError": "task", "with_input_bounds": "task",
    "with_values": "task",
    "entry_point_params": "entry_point", "ENTRY_POINTS": "entry_point", "reference_param_count": "entry_point",
    "Case": "inputs", "case_inputs": "inputs", "drawn_ahead": "inputs", "EVALUATOR_CASES": "inputs",
    "TIMING_CASES": "inputs", "CASES_BY_NAME": "inputs", "LARGE_SCALE": "inputs", "DRAW_CHUNK": "inputs",
    "DRAW": "inputs",
    "parse": "pysource",
    "add_checked_task": "reference_check", "AddedTask": "reference_check", "check_reference": "reference_check",
    "CHECK_SECONDS": "reference_check", "files_digest": "reference_check", "read_task_files": "reference_check",
    "ReferenceCheck": "reference_check", "write_task": "reference_check",
})
