"""A task's (or a candidate's) entry point, read from its source: the function the evaluator calls, and how many
positional arguments it takes."""

from __future__ import annotations

import ast

from tpu_runner.tasks import kernelbench
from tpu_runner.tasks.pysource import parse as parse_source

# The module-level function a candidate (or a reference) is called by: this project's name, then JAXBench's.
ENTRY_POINTS = ("computation", "workload")


def entry_point_params(tree: ast.Module) -> tuple[ast.AST | None, int | None]:
    """(node, positional parameter count) of the module-level entry point, count None for *args: `computation`,
    JAXBench's `workload`, or the `forward` of a KernelBench-style module's ModelNew (or Model)."""
    found: dict[str, tuple[ast.AST | None, int | None]] = {}
    model = kernelbench.model_forward(tree)
    if model is not None:
        found["forward"] = (model[1], kernelbench.forward_params(model[1]))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in ENTRY_POINTS:
            args = node.args
            found[node.name] = (node, None if args.vararg else len(args.posonlyargs) + len(args.args))
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in ENTRY_POINTS:
                    found[target.id] = (node, None)
    return next((found[name] for name in (*ENTRY_POINTS, "forward") if name in found), (None, None))


def reference_param_count(reference_source: str) -> int | None:
    """Positional parameters of the reference's `computation`, read from its source."""
    try:
        tree = parse_source(reference_source)
    except SyntaxError:
        return None
    return entry_point_params(tree)[1]
