"""check_source on candidate modules: what passes, and every rejection kind with the line it names."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from tpu_runner.candidate import StaticReport, StaticViolation, check_source
from tpu_runner.reports import EvalError
from tpu_runner.tasks import reference_param_count

REPO = Path(__file__).resolve().parents[2]
MARK = "# <-"

GOOD = textwrap.dedent("""\
    import functools

    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl


    def _add_one_kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0  # [rows, cols]


    def computation(x):
        return pl.pallas_call(
            _add_one_kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        )(x)
""")


def _module(body: str, *, header: str = "import jax\nfrom jax.experimental import pallas as pl\n") -> str:
    """A module whose `computation` calls pallas_call, with `body` appended (dedented). The functions `body`
    defines are named in `__all__`, so none is dead code the check would skip."""
    entry = "\n\ndef computation(x):\n    return pl.pallas_call(lambda x_ref, o_ref: None, out_shape=x)(x)\n"
    entry += "\n"
    body = textwrap.dedent(body)
    try:
        names = sorted({n.name for n in ast.walk(ast.parse(body)) if isinstance(n, ast.FunctionDef)})
    except SyntaxError:
        names = []
    return header + entry + body + (f"\n__all__ = {names!r}\n" if names else "")


def _marked_line(source: str) -> int:
    lines = [i for i, text in enumerate(source.splitlines(), start=1) if MARK in text]
    assert len(lines) == 1, f"exactly one line must carry {MARK!r}"
    return lines[0]


def _reject(source: str, *, expected_params: int | None = 1, allow_pure_jax: bool = False) -> EvalError:
    with pytest.raises(StaticViolation) as info:
        check_source(source, expected_params=expected_params, allow_pure_jax=allow_pure_jax)
    error = info.value.error
    assert error.stage == "static"
    assert str(info.value) == error.detail
    return error


def _assert_rejected_at_mark(source: str, kind: str, **kwargs) -> EvalError:
    error = _reject(source, **kwargs)
    assert (error.kind, error.line) == (kind, _marked_line(source)), error
    return error


# --- what passes --------------------------------------------------------------------------------------------


def test_good_pallas_module_passes_and_reports_pallas_call():
    report = check_source(GOOD, expected_params=1, allow_pure_jax=False)
    assert report == StaticReport(has_pallas_call=True, entry_point_params=1)


def test_shipped_softmax_solution_passes():
    source = (REPO / "tasks/softmax/solutions/pallas.py").read_text()
    report = check_source(source, expected_params=1, allow_pure_jax=False)
    assert report.has_pallas_call
    assert report.entry_point_params == 1


def test_pallas_call_imported_by_name_counts():
    source = "from jax.experimental.pallas import pallas_call\n\n"
    source += "def computation(x):\n    return pallas_call(x)\n"
    assert check_source(source, expected_params=1, allow_pure_jax=False).has_pallas_call


def test_varargs_entry_point_skips_the_signature_check():
    source = _module("").replace("def computation(x):", "def computation(*args):")
    report = check_source(source, expected_params=3, allow_pure_jax=False)
    assert report.entry_point_params is None


def test_entry_point_bound_by_assignment_is_accepted_with_unknown_arity():
    source = GOOD + "\n\ncomputation = functools.partial(computation)\n"
    assert check_source(source, expected_params=2, allow_pure_jax=False).entry_point_params is None


def test_narrow_except_is_accepted():
    source = _module("""\
        def helper(n):
            try:
                return int(n)
            except ValueError:
                return 0
    """)
    assert check_source(source, expected_params=1, allow_pure_jax=False).has_pallas_call


def test_local_dict_written_inside_a_function_is_not_global_state():
    source = _module("""\
        def helper(n):
            table = {}
            table[n] = n
            return table
    """)
    check_source(source, expected_params=1, allow_pure_jax=False)


def test_module_level_dict_written_at_module_level_is_allowed():
    source = _module("""\
        TABLE = {}
        TABLE["v5e"] = 128
    """)
    check_source(source, expected_params=1, allow_pure_jax=False)


def test_pure_jax_module_passes_when_the_task_allows_it():
    source = "import jax.numpy as jnp\n\ndef computation(x):\n    return jnp.exp(x)\n"
    report = check_source(source, expected_params=1, allow_pure_jax=True)
    assert report == StaticReport(has_pallas_call=False, entry_point_params=1)


# --- rejections ---------------------------------------------------------------------------------------------


def test_syntax_error_names_its_line():
    source = "import jax\n\ndef computation(x):\n    return x +\n"
    error = _reject(source)
    assert error.kind == "syntax_error"
    assert error.line == 4
    assert "line 4" in error.detail


def test_missing_entry_point():
    source = "from jax.experimental import pallas as pl\n\ndef kernel(x):\n    return pl.pallas_call(x)\n"
    error = _reject(source)
    assert error.kind == "missing_entry_point"
    assert error.line is None
    assert "computation" in error.detail


def test_nested_computation_is_not_an_entry_point():
    source = "def outer():\n    def computation(x):\n        return x\n    return computation\n"
    assert _reject(source).kind == "missing_entry_point"


@pytest.mark.parametrize(("signature", "count"), [("x, y", 2), ("", 0), ("x, /, y, z", 3)])
def test_wrong_signature_when_param_count_differs(signature, count):
    source = _module("").replace("def computation(x):", f"def computation({signature}):  {MARK}")
    error = _assert_rejected_at_mark(source, "wrong_signature", expected_params=1)
    assert f"takes {count} positional parameters" in error.detail
    assert "the reference takes 1" in error.detail


def test_keyword_only_params_do_not_count_towards_the_signature():
    source = _module("").replace("def computation(x):", "def computation(x, *, block=128):")
    assert check_source(source, expected_params=1, allow_pure_jax=False).entry_point_params == 1


def test_signature_not_checked_without_expected_params():
    source = _module("").replace("def computation(x):", "def computation(x, y, z):")
    assert check_source(source, expected_params=None, allow_pure_jax=False).entry_point_params == 3


@pytest.mark.parametrize("statement", [
    "import os",
    "import socket",
    "import subprocess",
    "import threading",
    "import multiprocessing",
    "import time",
    "import ctypes",
    "import importlib",
    "import os.path",
    "from os import path",
    "from . import helpers",
    "from .helpers import tile",
    "import jax, os",
    "from jax._src import dispatch",
    "import jax._src.config",
    "from jax._src.lib import _private",
])
def test_forbidden_import(statement):
    source = _module(f"{statement}  {MARK}\n")
    error = _assert_rejected_at_mark(source, "forbidden_import")
    assert "not allowed" in error.detail


def test_forbidden_import_message_lists_the_allow_list():
    error = _reject(_module("import pickle\n"))
    assert "'pickle'" in error.detail
    assert "jax.experimental.pallas" in error.detail


@pytest.mark.parametrize("call", ['open("/etc/passwd")', 'exec("x = 1")', 'eval("1 + 1")', '__import__("os")',
                                  "getattr(x, x.name)", "id(x)", "globals()", "breakpoint()"])
def test_forbidden_call(call):
    source = _module(f"""\
        def helper(x):
            return {call}  {MARK}
    """)
    name = call.split("(")[0]
    error = _assert_rejected_at_mark(source, "forbidden_call")
    assert f"{name}()" in error.detail


def test_forbidden_call_inside_a_kernel_argument_is_found():
    source = _module(f"""\
        def helper(x):
            return jax.numpy.sum(x, axis=eval("0"))  {MARK}
    """)
    _assert_rejected_at_mark(source, "forbidden_call")


def test_async_function_is_rejected():
    source = _module(f"""\
        async def helper(x):  {MARK}
            return x
    """)
    _assert_rejected_at_mark(source, "forbidden_call")


@pytest.mark.parametrize(("snippet", "attribute"), [
    ("jax.pure_callback(print, x, x)", "pure_callback"),
    ("jax.debug.print('{}', x)", "debug"),
    ("jax.config.update('jax_enable_x64', True)", "config"),
    ("jax.block_until_ready(x)", "block_until_ready"),
    ("jax.profiler.start_trace('/tmp/t')", "profiler"),
])
def test_forbidden_attribute(snippet, attribute):
    source = _module(f"""\
        def helper(x):
            return {snippet}  {MARK}
    """)
    error = _assert_rejected_at_mark(source, "forbidden_attribute")
    assert repr(attribute) in error.detail


@pytest.mark.parametrize("statement", ["from jax.experimental import io_callback",
                                       "from jax import debug",
                                       "from jax.experimental import io_callback as cb"])
def test_forbidden_attribute_by_import(statement):
    source = _module(f"{statement}  {MARK}\n")
    _assert_rejected_at_mark(source, "forbidden_attribute")


@pytest.mark.parametrize("snippet", ["jax.numpy._x", "x._value", "jax.numpy.__dict__"])
def test_private_attribute_access(snippet):
    source = _module(f"""\
        def helper(x):
            return {snippet}  {MARK}
    """)
    error = _assert_rejected_at_mark(source, "forbidden_attribute")
    assert "private attribute" in error.detail


def test_dunder_builtins_name_is_rejected():
    source = _module(f"def helper():\n    return __builtins__  {MARK}\n")
    _assert_rejected_at_mark(source, "forbidden_attribute")


@pytest.mark.parametrize(("header", "statement", "patched"), [
    ("import jax\n", "jax.jit = lambda f, **kw: f", "jax.jit"),
    ("import jax.numpy as jnp\n", "jnp.dot = lambda a, b: a", "jnp.dot"),
    ("import numpy as np\n", "np.abs = lambda a: 0 * a", "np.abs"),
    ("import jax\n", "jax.numpy.dot = None", "jax.numpy.dot"),
    ("import jax\n", "del jax.jit", "jax.jit"),
])
def test_monkeypatch_of_an_imported_module(header, statement, patched):
    source = _module(f"{statement}  {MARK}\n", header=header + "from jax.experimental import pallas as pl\n")
    error = _assert_rejected_at_mark(source, "monkeypatch")
    assert patched in error.detail


def test_monkeypatch_inside_a_function_is_rejected():
    source = _module(f"""\
        def install():
            jax.lax.dot = None  {MARK}
    """)
    _assert_rejected_at_mark(source, "monkeypatch")


def test_global_statement_is_global_state():
    source = _module(f"""\
        CALLS = 0

        def helper(x):
            global CALLS  {MARK}
            CALLS += 1
            return x
    """)
    _assert_rejected_at_mark(source, "global_state")


def test_nonlocal_statement_is_global_state():
    source = _module(f"""\
        def outer():
            seen = 0
            def inner():
                nonlocal seen  {MARK}
                seen += 1
            return inner
    """)
    _assert_rejected_at_mark(source, "global_state")


@pytest.mark.parametrize("write", ["CACHE[key] = value", "CACHE[key] += value", "del CACHE[key]"])
def test_function_writing_into_a_module_level_dict_is_global_state(write):
    source = _module(f"""\
        CACHE = {{}}

        def remember(key, value):
            {write}  {MARK}
            return value
    """)
    error = _assert_rejected_at_mark(source, "global_state")
    assert "'CACHE'" in error.detail


def test_annotated_module_level_dict_is_tracked():
    source = _module(f"""\
        CACHE: dict = {{}}

        def remember(key, value):
            CACHE[key] = value  {MARK}
    """)
    _assert_rejected_at_mark(source, "global_state")


def test_lambda_counts_as_a_function_for_global_state():
    source = _module(f"""\
        SEEN = {{}}
        remember = lambda k: SEEN.__setitem__(k, k)  {MARK}
    """)
    # __setitem__ is private, so this is caught first as a private attribute.
    _assert_rejected_at_mark(source, "forbidden_attribute")


@pytest.mark.parametrize("handler", ["except:", "except Exception:", "except Exception as exc:",
                                     "except (ValueError, BaseException):", "except BaseException:"])
def test_broad_except(handler):
    source = _module(f"""\
        def helper(x):
            try:
                return int(x)
            {handler}  {MARK}
                return 0
    """)
    _assert_rejected_at_mark(source, "broad_except")


def test_no_pallas_call_unless_pure_jax_allowed():
    source = "import jax.numpy as jnp\n\ndef computation(x):\n    return jnp.exp(x)\n"
    error = _reject(source, allow_pure_jax=False)
    assert error.kind == "no_pallas_call"
    assert error.line is None
    assert check_source(source, expected_params=1, allow_pure_jax=True).has_pallas_call is False


def test_mentioning_pallas_in_a_string_is_not_a_pallas_call():
    source = 'def computation(x):\n    """uses pl.pallas_call"""\n    return x\n'
    assert _reject(source).kind == "no_pallas_call"


def test_first_violation_wins():
    source = _module(f"""\
        import os  {MARK}

        def helper():
            return eval("1")
    """)
    _assert_rejected_at_mark(source, "forbidden_import")


# --- gaps: each of these bypasses a rule the module documents -----------------------------------------------


def test_aliased_forbidden_builtin_is_rejected():
    source = _module(f"""\
        run = eval  {MARK}

        def helper(x):
            return run("__import__('os').getpid()")
    """)
    error = _reject(source)
    assert error.kind == "forbidden_call"


def test_monkeypatch_through_a_module_alias_is_rejected():
    source = _module(f"""\
        N = np
        N.abs = lambda a: 0 * a  {MARK}
    """, header="import numpy as np\nfrom jax.experimental import pallas as pl\n")
    error = _reject(source)
    assert (error.kind, error.line) == ("monkeypatch", _marked_line(source))


def test_broad_except_through_an_alias_is_rejected():
    source = _module(f"""\
        Broad = Exception

        def helper(x):
            try:
                return int(x)
            except Broad:  {MARK}
                return 0
    """)
    assert _reject(source).kind == "broad_except"


def test_function_updating_a_module_level_dict_by_method_is_global_state():
    source = _module(f"""\
        CACHE = {{}}

        def remember(key, value):
            CACHE.update({{key: value}})  {MARK}
            return value
    """)
    assert _reject(source).kind == "global_state"


# --- reference_param_count ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("source", "count"), [
    ("def computation(x, gamma, beta, eps):\n    return x\n", 4),
    ("def computation(x, /, y):\n    return x\n", 2),
    ("def computation(*args):\n    return args\n", None),
    ("computation = len\n", None),
    ("def other(x):\n    return x\n", None),
    ("def computation(x:\n", None),
])
def test_reference_param_count(source, count):
    assert reference_param_count(source) == count


def test_reference_param_count_of_every_shipped_task_matches_its_solution():
    for solution in sorted(REPO.glob("tasks/*/solutions/pallas.py")):
        reference = solution.parent.parent / "reference.py"
        expected = reference_param_count(reference.read_text())
        assert expected is not None, reference
        report = check_source(solution.read_text(), expected_params=expected, allow_pure_jax=False)
        assert report.has_pallas_call, solution


# --- what real kernels are written with ---------------------------------------------------------------------

REAL_PYTHON = {
    "typing imports": "from collections.abc import Callable, Sequence\nfrom typing import Any, NamedTuple\n",
    "JAX's own Pallas ops": ("from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask\n"
                             "from jax.experimental.pallas.ops.tpu.megablox import common\n"
                             "from jax.experimental.pallas.ops.tpu.paged_attention import quantization_utils\n"
                             "import jax.experimental.pallas.ops.tpu.flash_attention as fa\n"),
    "a helper class with private state": textwrap.dedent("""\
        class Buffers:
            def __init__(self, shape, **kwargs):
                self._vmem_buffer = shape
                self.kwargs = kwargs

            def _size(self):
                return self._vmem_buffer[0]

            @property
            def size(self):
                return self._size()
        """),
    "NamedTuple's own API": textwrap.dedent("""\
        class Blocks(NamedTuple):
            q: int
            k: int

        def smaller(b):
            return b._replace(q=b.q // 2)._asdict()
        """),
    "decorators and custom rules": textwrap.dedent("""\
        @functools.partial(jax.jit, static_argnames=["block"])
        def scaled(x, block=128):
            return x * block

        @jax.custom_vjp
        def f(x):
            return x

        def f_fwd(x):
            return x, None

        def f_bwd(_, g):
            return (g,)

        f.defvjp(f_fwd, f_bwd)
        """),
    "a dataclass that checks itself": textwrap.dedent("""\
        @dataclasses.dataclass(frozen=True)
        class BlockSizes:
            block_q: int

            def __post_init__(self):
                if self.block_q % 128:
                    raise ValueError(f"{self.block_q=} must be a multiple of 128")
        """),
}


@pytest.mark.parametrize("name", list(REAL_PYTHON))
def test_ordinary_python_of_real_kernels_passes(name):
    header = ("import dataclasses\nimport functools\nfrom typing import NamedTuple\n\nimport jax\n"
              "from jax.experimental import pallas as pl\n")
    check_source(_module(REAL_PYTHON[name], header=header), expected_params=1, allow_pure_jax=False)


def test_a_wrapper_of_a_jax_pallas_op_counts_as_a_kernel():
    source = textwrap.dedent("""\
        from jax.experimental.pallas.ops.tpu import flash_attention

        def computation(q, k, v):
            return flash_attention.flash_attention(q, k, v, causal=True)
    """)
    assert check_source(source, expected_params=3, allow_pure_jax=False).has_pallas_call


@pytest.mark.parametrize(("snippet", "kind"), [
    ("from jax.experimental.pallas.ops.tpu import _private  # <-", "forbidden_import"),
    ("import jax.experimental.host_callback  # <-", "forbidden_import"),
    ("from jax import ffi  # <-", "forbidden_attribute"),
    ("def f(x):\n    return x.__class__.__subclasses__()  # <-", "forbidden_attribute"),
    ("def f(x):\n    return jax.numpy._internal  # <-", "forbidden_attribute"),
    ("class H:\n    pass\n\nh = H()\nh.x = 1  # <-", "monkeypatch"),
    ("def f(obj):\n    obj.weights = None  # <-", "monkeypatch"),
    ("class H:\n    def f(self):\n        jax.jit = None  # <-", "monkeypatch"),
    ("d = jax.debug  # <-\n\ndef f(x):\n    return d.print('{}', x)", "forbidden_attribute"),
    ("j = jax\n\ndef f(x):\n    return j.config  # <-", "forbidden_attribute"),
    ("def f(x):\n    x.tofile('/tmp/x')  # <-", "forbidden_attribute"),
])
def test_what_real_python_still_may_not_do(snippet, kind):
    _assert_rejected_at_mark(_module(snippet + "\n"), kind)


# -- judged by what it does, not by the names it contains -----------------------------------------------------

ALLOWED_NOW = {
    "an unused set_weights helper": """\
        class Model:
            def __init__(self, w):
                self.w = w

            def set_weights(self, weights):
                for name, value in weights.items():
                    setattr(self, name, value)
        """,
    "a frozen dataclass setting a field in __post_init__": """\
        import dataclasses

        @dataclasses.dataclass(frozen=True)
        class BlockSizes:
            block_q: int

            def __post_init__(self):
                object.__setattr__(self, "block_q", max(self.block_q, 128))
        """,
    "JAX's own internals": """\
        from jax._src import dtypes
        import jax._src.core

        def bits(x):
            return dtypes.bit_width(x.dtype), jax._src.core.get_aval(x)
        """,
    "reflection with a constant name": """\
        def rows(x):
            return getattr(x, "shape")[0] if hasattr(x, "shape") else 0
        """,
    "reflection on its own object": """\
        class Config:
            def get(self, name):
                return getattr(self, name)
        """,
    "a helper nothing calls, with a name no kernel uses": """\
        class Model:
            def save(self, path):
                with open(path, "w") as f:
                    f.write("weights")
        """,
}


DEAD = {"an unused set_weights helper", "a helper nothing calls, with a name no kernel uses"}


@pytest.mark.parametrize("case", sorted(ALLOWED_NOW))
def test_ordinary_python_of_third_party_kernels_passes(case: str) -> None:
    body = textwrap.dedent(ALLOWED_NOW[case])
    if case not in DEAD:
        names = sorted({n.name for n in ast.walk(ast.parse(body)) if isinstance(n, ast.FunctionDef)})
        body += f"\n__all__ = {names!r}\n"  # used, so checked
    source = "import jax\nfrom jax.experimental import pallas as pl\n\n\ndef computation(x):\n" \
             "    return pl.pallas_call(lambda x_ref, o_ref: None, out_shape=x)(x)\n\n\n" + body
    check_source(source, expected_params=1, allow_pure_jax=False)


@pytest.mark.parametrize(("body", "kind"), [
    (f"setattr(jax, 'jit', lambda f: f)  {MARK}", "monkeypatch"),
    (f"def patch(name):\n    setattr(jax.numpy, name, None)  {MARK}", "forbidden_call"),
    (f"def debug():\n    return getattr(jax, 'debug')  {MARK}", "forbidden_attribute"),
    (f"def dunder(f):\n    return getattr(f, '__globals__')  {MARK}", "forbidden_attribute"),
    (f"def escape(obj, name):\n    return getattr(obj, name)  {MARK}", "forbidden_call"),
    (f"peek = getattr  {MARK}", "forbidden_call"),
    (f"def trace():\n    return jax._src.profiler  {MARK}", "forbidden_attribute"),
    (f"class Frozen:\n    def thaw(self):\n        object.__setattr__(jax, 'jit', None)  {MARK}",
     "forbidden_attribute"),
])
def test_reflection_is_checked_where_it_could_reach_a_library(body: str, kind: str) -> None:
    _assert_rejected_at_mark(_module(body), kind)


def test_a_helper_called_by_name_is_checked_like_any_code() -> None:
    source = _module(f"""\
        class Model:
            def save(self, path):
                return open(path)  {MARK}

        def run(m):
            return m.save("/tmp/x")
    """)
    _assert_rejected_at_mark(source, "forbidden_call")
