"""Stage 1: read the candidate's source without running it.

The parent process never imports candidate code; this module only parses it. What protects the verdict is
isolation (the candidate runs in a sandboxed child that can write only its scratch directory; outputs are
compared, and the compiler's results read, where it never ran), so this stage refuses only what a fair kernel
has no use for: file, network, process and foreign-code access, dynamic code, JAX internals, patching imported
modules, state kept between calls, broad exception handlers (a fallback to the reference) and - unless the task
allows pure-JAX rewrites - a module with no Pallas kernel at all. Ordinary Python that real kernels are written
with passes: typing, collections.abc, dataclasses, NamedTuple, helper classes with private attributes set in
their own methods, and JAX's public modules including its own Pallas TPU ops.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from tpu_runner.reports import EvalError
from tpu_runner.tasks import ENTRY_POINTS, entry_point_params
from tpu_runner.tasks import parse as parse_source

# Modules a candidate may import, by exact name or (PREFIX_IMPORTS) with any submodule.
ALLOWED_IMPORTS = frozenset({
    "__future__", "abc", "collections", "collections.abc", "dataclasses", "enum", "functools", "itertools",
    "math", "numbers", "operator", "typing", "typing_extensions", "numpy", "numpy.typing", "jax", "ml_dtypes",
})
PREFIX_IMPORTS = ("jax.",)  # public JAX: jax.numpy, jax.lax, jax.experimental.pallas.ops.tpu.splash_attention, ...
# Parts of JAX that reach the host, the process, foreign code or the harness's own tools - public and private
# alike: host work escapes the timed region, configuration changes how the reference runs beside the candidate,
# the profiler and export are how the candidate is timed and compiled. The rest of `jax._src` is JAX's own code,
# which its packaged Pallas kernels import.
FORBIDDEN_MODULES = ("jax.experimental.host_callback", "jax.experimental.compilation_cache",
                     "jax.experimental.jax2tf", "jax.experimental.serialize_executable",
                     "jax.experimental.colocated_python", "jax.experimental.multihost_utils", "jax.profiler",
                     "jax.debug", "jax.monitoring", "jax.ffi",
                     "jax.extend", "jax.distributed", "jax.export", "jax.experimental.buffer_callback",
                     "jax.experimental.mosaic.gpu", "jax.interpreters",
                     "jax._src.profiler", "jax._src.config", "jax._src.callback", "jax._src.debugging",
                     "jax._src.ffi", "jax._src.export", "jax._src.compilation_cache", "jax._src.monitoring",
                     "jax._src.distributed", "jax._src.dispatch", "jax._src.interpreters", "jax._src.xla_bridge",
                     "jax._src.compiler", "jax._src.cache_key", "jax._src.stages", "jax._src.api_util")
JAX_INTERNALS = "jax._src"  # the one private path a candidate may import from (see FORBIDDEN_MODULES)
# Builtins refused wherever they are named, each for a harm isolation cannot contain: `open` reads files, which not
# every host confines (gVisor has no Landlock); dynamic code (`exec`, `eval`, `compile`, `__import__`) and the
# namespaces (`globals`, `locals`, `vars`) hide from this check what they reach - a library to patch in the process
# that is checked and timed; `id` keys caches on objects; the rest wait on or talk to a person.
FORBIDDEN_CALLS = frozenset({
    "open", "exec", "eval", "compile", "__import__", "globals", "locals", "vars", "input", "breakpoint", "id",
    "memoryview", "exit", "quit", "help",
})
# Reflection, allowed as a direct call where this check sees its target: a constant name is checked as `obj.name`
# would be; a computed one only on the candidate's own object (`self` in a method: a `set_weights` helper). Named
# anywhere else (passed around, aliased) it would reach attributes this check cannot see.
REFLECTION = frozenset({"getattr", "setattr", "delattr", "hasattr"})
# Functions called without being named in the module: dunders, JAX's pytree protocol, and what the evaluator calls
# on a KernelBench-style module (its model's forward, its get_init_inputs).
IMPLICITLY_CALLED = frozenset({"tree_flatten", "tree_unflatten", "forward", "get_inputs", "get_init_inputs"})
# Attributes that reach host callbacks, process-wide configuration, timing, the profiler or files, when taken
# from an imported module (jax.config, np.load): a class of the candidate's may well have a `config`.
MODULE_ATTRIBUTES = frozenset({
    "pure_callback", "io_callback", "callback", "host_callback", "debug", "config", "profiler", "effects_barrier",
    "clear_caches", "live_arrays", "device_get", "load", "save", "savez", "savez_compressed", "fromfile",
    "memmap", "loadtxt", "savetxt", "genfromtxt", "fromregex", "DataSource", "ctypeslib", "lib",
    "ffi", "ffi_call", "export", "experimental_io_callback",
})
# On any object: blocking on or reading device buffers from the host, and writing arrays to files.
ANY_ATTRIBUTES = frozenset({"block_until_ready", "unsafe_buffer_pointer", "copy_to_host_async",
                            "on_device_size_in_bytes", "tofile", "device_buffer", "addressable_data"})
# Dunders that lead out of the language's sandbox (to builtins, globals, code objects, every class).
DANGEROUS_DUNDERS = frozenset({
    "__globals__", "__builtins__", "__subclasses__", "__code__", "__closure__", "__dict__", "__getattribute__",
    "__setattr__", "__delattr__", "__import__", "__loader__", "__spec__", "__base__", "__bases__", "__mro__",
    "__func__", "__self__", "__module__", "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__",
    "__init_subclass__", "__class_getitem__", "__wrapped__", "__defaults__", "__kwdefaults__", "__file__",
    "__path__", "__cached__", "__traceback__", "__frame__", "__setitem__", "__delitem__", "__set__", "__delete__",
    "__iadd__", "__ior__", "__ixor__", "__iand__", "__isub__", "__imul__",
})
NAMEDTUPLE_API = frozenset({"_replace", "_fields", "_asdict", "_make", "_field_defaults"})
# Methods that mutate a container in place: called on module-level data from a function, they keep state.
MUTATING_METHODS = frozenset({"update", "setdefault", "append", "extend", "insert", "add", "pop", "popitem",
                              "clear", "remove", "discard"})
BROAD_EXCEPTIONS = frozenset({"Exception", "BaseException"})
KERNEL_NAMES = frozenset({"pallas_call", "kernel", "core_map"})
PALLAS_OPS = "jax.experimental.pallas.ops"  # JAX's own kernels: importing one brings its pallas_calls


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


def _forbidden(name: str) -> bool:
    inside = name == JAX_INTERNALS or name.startswith(JAX_INTERNALS + ".")
    parts = name.split(".")[2:] if inside else name.split(".")
    return (any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN_MODULES)
            or any(part.startswith("_") for part in parts if part != "__future__"))


def module_allowed(name: str) -> bool:
    return not _forbidden(name) and (name in ALLOWED_IMPORTS or name.startswith(PREFIX_IMPORTS))


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


def _own_private_names(tree: ast.Module) -> set[str]:
    """Private names the candidate defines itself: its classes' methods and fields, `self._x = ...` targets."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name.startswith("_"):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr.startswith("_"):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id.startswith("_"):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not (n.startswith("__") and n.endswith("__"))}


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _is_attribute_chain(node: ast.expr) -> bool:
    """`a`, `a.b.c`: a name or a plain attribute path (no call, no subscript)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def _referenced(tree: ast.Module) -> set[str]:
    """Every name the module uses, as a name, an attribute or a string (`getattr(self, "helper")`)."""
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            used.add(node.id)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            used.add(node.value)
    return used


def dead_functions(tree: ast.Module) -> set[ast.AST]:
    """Module-level functions and methods that nothing in the module calls or names (undecorated, not dunders or
    the pytree protocol, not an entry point): code that never runs, which this check does not hold against the
    candidate. Boilerplate helpers (`set_weights`, `save`) are such."""
    used = _referenced(tree)
    bodies = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    bodies += [m for c in tree.body if isinstance(c, ast.ClassDef) for m in c.body if isinstance(m, ast.FunctionDef)]
    return {f for f in bodies if f.name not in used and not f.decorator_list and f.name not in ENTRY_POINTS
            and not (f.name.startswith("__") and f.name.endswith("__")) and f.name not in IMPLICITLY_CALLED}


class _Checker(ast.NodeVisitor):
    def __init__(self, module_names: set[str], own_private: set[str], dead: set[ast.AST] = frozenset()):
        self.module_names = module_names
        self.own_private = own_private
        self.dead = dead
        self.modules: set[str] = set()  # names bound to imported modules (or to attribute paths into them)
        self.jax_names: set[str] = set()  # names bound to the jax package itself (`jax._src` is theirs)
        self.has_pallas_call = False
        self.function_depth = 0
        self.class_depth = 0

    # -- imports ---------------------------------------------------------------------------------------------
    def _check_module(self, node: ast.AST, name: str) -> None:
        if not module_allowed(name):
            raise _violation("forbidden_import", node, f"import of {name!r} is not allowed; allowed: "
                             f"{', '.join(sorted(ALLOWED_IMPORTS))} and public jax.* modules such as jax.numpy, "
                             "jax.experimental.pallas and its ops, and JAX's own jax._src (not host callbacks, "
                             "configuration, the profiler, FFI or export, public or private)")
        if name.startswith(PALLAS_OPS):
            self.has_pallas_call = True

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(node, alias.name)
            self.modules.add(alias.asname or alias.name.split(".")[0])
            if alias.name == "jax" or (alias.asname is None and alias.name.startswith("jax.")):
                self.jax_names.add(alias.asname or "jax")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            raise _violation("forbidden_import", node, "relative imports are not allowed")
        base = node.module or ""
        self._check_module(node, base)
        for alias in node.names:
            if alias.name == "*":
                raise _violation("forbidden_import", node, f"'from {base} import *' hides what is imported")
            full = f"{base}.{alias.name}"
            if alias.name in MODULE_ATTRIBUTES or alias.name in FORBIDDEN_CALLS or alias.name in ANY_ATTRIBUTES:
                raise _violation("forbidden_attribute", node, f"importing {alias.name!r} is not allowed")
            if _forbidden(full):  # the base is allowed; `from jax import _src` or a forbidden submodule is not
                raise _violation("forbidden_import", node, f"import of {full!r} is not allowed")
            if alias.name in KERNEL_NAMES or full.startswith(PALLAS_OPS):
                self.has_pallas_call = True
            self.modules.add(alias.asname or alias.name)

    # -- names and attributes --------------------------------------------------------------------------------
    def _from_module(self, node: ast.expr) -> bool:
        root = _root(node)
        return isinstance(root, ast.Name) and root.id in self.modules

    def visit_Assign(self, node: ast.Assign) -> None:
        # `N = np` or `d = jax.debug`: the new name reaches the module just as the old one did.
        if _is_attribute_chain(node.value) and self._from_module(node.value):
            for target in node.targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        self.modules.add(sub.id)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (self.function_depth and isinstance(func, ast.Attribute) and func.attr in MUTATING_METHODS
                and isinstance(func.value, ast.Name) and func.value.id in self.module_names):
            raise _violation("global_state", node, f"{func.value.id}.{func.attr}() from a function changes "
                             "module-level state between calls (a cache on inputs); kernels must be pure")
        if isinstance(func, ast.Name) and func.id in REFLECTION:
            self._check_reflection(node, func.id)
            for arg in [*node.args, *node.keywords]:
                self.visit(arg)
            return
        if self._own_object_setattr(node):  # a frozen dataclass setting its own field: object.__setattr__(self, ...)
            for arg in [*node.args, *node.keywords]:
                self.visit(arg)
            return
        self.generic_visit(node)

    def _own(self, node: ast.expr) -> bool:
        """Is this the candidate's own object: `self` or `cls` inside one of its classes' methods?"""
        return isinstance(node, ast.Name) and node.id in ("self", "cls") and bool(self.class_depth) \
            and bool(self.function_depth)

    def _own_object_setattr(self, node: ast.Call) -> bool:
        func = node.func
        return (isinstance(func, ast.Attribute) and func.attr == "__setattr__" and isinstance(func.value, ast.Name)
                and func.value.id == "object" and bool(node.args) and self._own(node.args[0]))

    def _check_reflection(self, node: ast.Call, name: str) -> None:
        """getattr/setattr/delattr/hasattr: a constant name is checked as the attribute itself would be; a computed
        one only on the candidate's own object; nothing set or deleted on a module."""
        if len(node.args) < 2 or node.keywords:
            raise _violation("forbidden_call", node, f"{name}() needs an object and an attribute name, as arguments")
        target, attr = node.args[0], node.args[1]
        if isinstance(attr, ast.Constant) and isinstance(attr.value, str):
            ctx: ast.expr_context = ast.Store() if name in ("setattr", "delattr") else ast.Load()
            self.visit_Attribute(ast.copy_location(ast.Attribute(value=target, attr=attr.value, ctx=ctx), node))
            return
        if not self._own(target):
            raise _violation("forbidden_call", node, f"{name}() with a computed attribute name is allowed on the "
                             "candidate's own object (self in a method) only: elsewhere it reaches attributes this "
                             "check cannot see (a library's, to patch the process that is checked and timed)")

    def visit_Name(self, node: ast.Name) -> None:
        # Any use, not only a call: `run = eval` would otherwise smuggle the builtin out under another name.
        if node.id in FORBIDDEN_CALLS:
            raise _violation("forbidden_call", node, f"{node.id}() is not allowed in a kernel, nor is naming it")
        if node.id in REFLECTION:  # direct calls are checked in visit_Call and never reach here
            raise _violation("forbidden_call", node, f"{node.id} may only be called directly (passed around, it "
                             "reaches attributes this check cannot see)")
        if node.id in BROAD_EXCEPTIONS:
            raise _violation("broad_except", node, f"{node.id} catches every failure (a fallback to another "
                             "implementation); catch a specific exception type or let errors surface")
        if node.id in ("__builtins__", "__loader__", "__spec__"):
            raise _violation("forbidden_attribute", node, f"use of {node.id} is not allowed")
        if node.id in KERNEL_NAMES:
            self.has_pallas_call = True

    def visit_Attribute(self, node: ast.Attribute) -> None:
        attr = node.attr
        from_module = self._from_module(node.value)
        if attr in DANGEROUS_DUNDERS:
            raise _violation("forbidden_attribute", node, f"private attribute {attr!r}: it leads to the "
                             "interpreter's internals, which a kernel has no use for")
        private = attr.startswith("_") and not (attr.startswith("__") and attr.endswith("__"))
        if attr == "_src" and isinstance(node.value, ast.Name) and node.value.id in self.jax_names:
            private = False  # JAX's own code, as importable (its forbidden parts are checked as paths below)
        if from_module and _is_attribute_chain(node) and isinstance(_root(node), ast.Name) and \
                _root(node).id in self.jax_names:  # type: ignore[attr-defined]
            path = "jax" + ast.unparse(node)[len(_root(node).id):]  # type: ignore[attr-defined]
            if path.startswith(JAX_INTERNALS) and _forbidden(path):
                raise _violation("forbidden_attribute", node, f"{path} is one of JAX's parts a kernel may not use "
                                 "(host callbacks, configuration, the profiler, FFI, export)")
        if private and (from_module or not (attr in self.own_private or attr in NAMEDTUPLE_API)):
            raise _violation("forbidden_attribute", node, f"private attribute {attr!r}: candidates may use "
                             "private names of their own classes, not those of libraries or arrays")
        if attr in ANY_ATTRIBUTES or (from_module and attr in MODULE_ATTRIBUTES):
            raise _violation("forbidden_attribute", node, f"attribute {attr!r} is not allowed in a kernel "
                             "(host callbacks, configuration, timing, files and profiling are the evaluator's)")
        if attr in KERNEL_NAMES:
            self.has_pallas_call = True
        if isinstance(node.ctx, ast.Store | ast.Del):
            self._check_store(node)
        self.generic_visit(node)

    def _check_store(self, node: ast.Attribute) -> None:
        """`self.x = ...` in a class's own method is its business; anything else that sets an attribute could
        patch a library or the harness (`jax.jit = ...`, `N = np; N.abs = ...`) or keep state between calls."""
        root = _root(node)
        own = (isinstance(root, ast.Name) and root.id in ("self", "cls") and self.class_depth
               and self.function_depth)
        if not own:
            target = ast.unparse(node)
            raise _violation("monkeypatch", node, f"assigning to {target} changes shared objects (it could patch "
                             "a library or the harness); only a class's own methods may set its attributes")

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

    # -- scopes ----------------------------------------------------------------------------------------------
    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        if isinstance(node, ast.AsyncFunctionDef):
            raise _violation("forbidden_call", node, "async functions are not allowed in a kernel")
        if node in self.dead:
            return  # never called: what it names cannot run
        self.function_depth += 1
        self.generic_visit(node)
        self.function_depth -= 1

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function
    visit_Lambda = _visit_function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        depth = self.function_depth
        self.class_depth += 1
        self.function_depth = 0  # a method is a function of its class, whatever encloses the class
        self.generic_visit(node)
        self.function_depth = depth
        self.class_depth -= 1


def check_source(source: str, *, expected_params: int | None, allow_pure_jax: bool,
                 filename: str = "candidate.py") -> StaticReport:
    """Raise StaticViolation for the first problem found; return what was learned otherwise."""
    try:
        tree = parse_source(source, filename=filename)
    except SyntaxError as exc:
        raise StaticViolation(EvalError(kind="syntax_error", line=exc.lineno, stage="static",
                                        detail=f"{exc.msg} at line {exc.lineno}: {(exc.text or '').strip()}")) from None
    node, params = entry_point_params(tree)
    if node is None:
        raise _violation("missing_entry_point", None, "the module must define a top-level function `computation` "
                                                    "(or JAXBench's `workload`, or a KernelBench-style class "
                                                    "ModelNew with forward)")
    checker = _Checker(_module_level_names(tree), _own_private_names(tree), dead_functions(tree))
    checker.visit(tree)
    if expected_params is not None and params is not None and params != expected_params:
        raise _violation("wrong_signature", node, f"computation takes {params} positional parameters; the reference "
                         f"takes {expected_params} (dynamic arrays then static scalars, in the reference's order)")
    if not allow_pure_jax and not checker.has_pallas_call:
        raise _violation("no_pallas_call", None, "no pallas_call found: a candidate must implement the computation "
                         "with Pallas (this task does not allow pure-JAX rewrites)")
    return StaticReport(has_pallas_call=checker.has_pallas_call, entry_point_params=params)
