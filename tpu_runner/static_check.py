"""Stage 1: read the candidate's source without running it.

The parent process never imports candidate code; this module only parses it. It refuses what cannot be a
fair kernel: imports outside an allow-list, file/network/process/timer access, dynamic code, monkey-patching,
global state (a cache on inputs), broad exception handlers (a fallback to the reference), and - unless the
task allows pure-JAX rewrites - a module with no `pallas_call` at all.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from tpu_runner.result import EvalError

ALLOWED_IMPORTS = frozenset({
    "jax", "jax.numpy", "jax.lax", "jax.nn", "jax.scipy", "jax.scipy.special", "jax.random",
    "jax.experimental", "jax.experimental.pallas", "jax.experimental.pallas.tpu",
    "functools", "math", "numpy", "dataclasses", "typing", "itertools", "enum", "__future__",
})
FORBIDDEN_CALLS = frozenset({
    "open", "exec", "eval", "compile", "__import__", "globals", "locals", "vars", "getattr", "setattr",
    "delattr", "input", "breakpoint", "id", "memoryview", "exit", "quit", "help",
})
# Attributes that reach host callbacks, process-wide configuration, timing or the profiler.
FORBIDDEN_ATTRIBUTES = frozenset({
    "pure_callback", "io_callback", "callback", "host_callback", "debug", "config", "profiler",
    "block_until_ready", "effects_barrier", "clear_caches", "live_arrays", "device_get", "copy_to_host_async",
    "unsafe_buffer_pointer", "on_device_size_in_bytes",
    # numpy's file and foreign-memory doors
    "load", "save", "savez", "savez_compressed", "fromfile", "tofile", "memmap", "loadtxt", "savetxt",
    "genfromtxt", "fromregex", "DataSource", "ctypeslib", "lib",
})
# Methods that mutate a container in place: called on module-level data from a function, they keep state.
MUTATING_METHODS = frozenset({"update", "setdefault", "append", "extend", "insert", "add", "pop", "popitem",
                              "clear", "remove", "discard"})
BROAD_EXCEPTIONS = frozenset({"Exception", "BaseException"})


@dataclass(frozen=True)
class StaticReport:
    has_pallas_call: bool
    entry_point_params: int | None  # positional parameters of `computation`, None if it takes *args


class StaticViolation(Exception):
    def __init__(self, error: EvalError):
        super().__init__(error.detail)
        self.error = error


def _violation(kind: str, node: ast.AST | None, detail: str) -> StaticViolation:
    return StaticViolation(EvalError(kind=kind, detail=detail, line=getattr(node, "lineno", None),
                                     stage="static"))


def _module_allowed(name: str) -> bool:
    return name in ALLOWED_IMPORTS


def _module_level_names(tree: ast.Module) -> set[str]:
    """Names bound at module level to data (not functions, classes or imports): state a call could mutate."""
    names: set[str] = set()
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Name):
                    names.add(sub.id)
    return names


class _Checker(ast.NodeVisitor):
    def __init__(self, module_names: set[str]):
        self.module_names = module_names
        self.imported: set[str] = set()
        self.has_pallas_call = False
        self.function_depth = 0

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if not _module_allowed(alias.name):
                raise _violation("forbidden_import", node, f"import of {alias.name!r} is not allowed; "
                                 f"allowed: {', '.join(sorted(ALLOWED_IMPORTS))}")
            self.imported.add(alias.asname or alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            raise _violation("forbidden_import", node, "relative imports are not allowed")
        base = node.module or ""
        for alias in node.names:
            full = f"{base}.{alias.name}"
            if not (_module_allowed(base) or _module_allowed(full)):
                raise _violation("forbidden_import", node, f"import of {full!r} is not allowed")
            if alias.name in FORBIDDEN_ATTRIBUTES or alias.name in FORBIDDEN_CALLS:
                raise _violation("forbidden_attribute", node, f"importing {alias.name!r} is not allowed")
            if alias.name == "pallas_call":
                self.has_pallas_call = True
            self.imported.add(alias.asname or alias.name)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (self.function_depth and isinstance(func, ast.Attribute) and func.attr in MUTATING_METHODS
                and isinstance(func.value, ast.Name) and func.value.id in self.module_names):
            raise _violation("global_state", node, f"{func.value.id}.{func.attr}() from a function changes "
                             "module-level state between calls (a cache on inputs); kernels must be pure")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        # Any use, not only a call: `run = eval` would otherwise smuggle the builtin out under another name.
        if node.id in FORBIDDEN_CALLS:
            raise _violation("forbidden_call", node, f"{node.id}() is not allowed in a kernel, nor is naming it")
        if node.id in BROAD_EXCEPTIONS:
            raise _violation("broad_except", node, f"{node.id} catches every failure (a fallback to another "
                             "implementation); catch a specific exception type or let errors surface")
        if node.id in ("__builtins__", "__loader__", "__spec__"):
            raise _violation("forbidden_attribute", node, f"use of {node.id} is not allowed")
        if node.id == "pallas_call":
            self.has_pallas_call = True

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr.startswith("_"):
            raise _violation("forbidden_attribute", node,
                             f"private attribute {node.attr!r}: candidates may only use public APIs")
        if node.attr in FORBIDDEN_ATTRIBUTES:
            raise _violation("forbidden_attribute", node, f"attribute {node.attr!r} is not allowed in a kernel "
                             "(host callbacks, configuration, timing and profiling are the evaluator's)")
        if node.attr in ("pallas_call", "kernel", "core_map"):
            self.has_pallas_call = True
        if isinstance(node.ctx, ast.Store | ast.Del):
            # Any attribute store: through an alias (`N = np; N.abs = ...`) a module is patched just the same,
            # and a kernel has no need to set attributes.
            target = ast.unparse(node)
            raise _violation("monkeypatch", node, f"assigning to {target} changes shared objects (it could patch a "
                             "library or the harness); candidates must not set attributes")
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if (isinstance(node.ctx, ast.Store | ast.Del) and self.function_depth and isinstance(node.value, ast.Name)
                and node.value.id in self.module_names):
            raise _violation("global_state", node, f"writing into module-level {node.value.id!r} from a function "
                             "keeps state between calls (a cache on inputs); kernels must be pure")
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        raise _violation("global_state", node, "'global' statements keep state between calls; kernels must be pure")

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        raise _violation("global_state", node, "'nonlocal' state is not allowed; kernels must be pure")

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        names: list[str] = []
        if node.type is None:
            raise _violation("broad_except", node, "a bare 'except:' hides failures; let errors surface")
        for sub in ast.walk(node.type):
            if isinstance(sub, ast.Name):
                names.append(sub.id)
        if BROAD_EXCEPTIONS & set(names):
            raise _violation("broad_except", node, f"'except {'/'.join(names)}' hides failures (a fallback "
                             "to another implementation); let errors surface")
        self.generic_visit(node)

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        if isinstance(node, ast.AsyncFunctionDef):
            raise _violation("forbidden_call", node, "async functions are not allowed in a kernel")
        self.function_depth += 1
        self.generic_visit(node)
        self.function_depth -= 1

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function
    visit_Lambda = _visit_function


def _entry_point_params(tree: ast.Module) -> tuple[ast.AST | None, int | None]:
    """(node, positional parameter count) of the module-level `computation`, count None for *args."""
    found: tuple[ast.AST | None, int | None] = (None, None)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "computation":
            args = node.args
            count = None if args.vararg else len(args.posonlyargs) + len(args.args)
            found = (node, count)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "computation"
                                                  for t in node.targets):
            found = (node, None)
    return found


def check_source(source: str, *, expected_params: int | None, allow_pure_jax: bool,
                 filename: str = "candidate.py") -> StaticReport:
    """Raise StaticViolation for the first problem found; return what was learned otherwise."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        raise StaticViolation(EvalError(kind="syntax_error", line=exc.lineno, stage="static",
                                        detail=f"{exc.msg} at line {exc.lineno}: {(exc.text or '').strip()}")) from None
    node, params = _entry_point_params(tree)
    if node is None:
        raise _violation("missing_entry_point", None, "the module must define a top-level function `computation`")
    checker = _Checker(_module_level_names(tree))
    checker.visit(tree)
    if expected_params is not None and params is not None and params != expected_params:
        raise _violation("wrong_signature", node, f"computation takes {params} positional parameters; the reference "
                         f"takes {expected_params} (dynamic arrays then static scalars, in the reference's order)")
    if not allow_pure_jax and not checker.has_pallas_call:
        raise _violation("no_pallas_call", None, "no pallas_call found: a candidate must implement the computation "
                         "with Pallas (this task does not allow pure-JAX rewrites)")
    return StaticReport(has_pallas_call=checker.has_pallas_call, entry_point_params=params)


def reference_param_count(reference_source: str) -> int | None:
    """Positional parameters of the reference's `computation`, read from its source."""
    try:
        tree = ast.parse(reference_source)
    except SyntaxError:
        return None
    return _entry_point_params(tree)[1]
