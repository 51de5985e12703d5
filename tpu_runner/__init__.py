"""Everything below the agents that runs kernels and tasks, in sub-packages by the evaluator's stages and concerns,
each importing only those listed before it: `reports` (results, errors, the parent-child protocol), `hardware` (the
chips), `sandbox` (untrusted code under limits), `tasks` (the task formats), `analysis` (programs read without running
them), `compiler` (ahead-of-time compiles), `checking` (correctness), `timing` (estimate, measurement, profile),
`reference` and `candidate` (the two sides of an evaluation), `jobs` (the job-kind contract that handlers and the
daemon share), `evaluation` (the pipeline), `runner` (the daemon and the evaluator's job kinds), and `porting`
(PyTorch modules made tasks).

Each sub-package's `__init__` says what it does and exports the names used outside it (`from tpu_runner.timing import
measure_pair`); callers import those. The exports are lazy (`lazy_exports`): importing a sub-package loads none of its
modules, and a name loads only the module that defines it, so importing one never loads JAX or libtpu for the others
(the sandboxed children and the CLI start on what they need). Inside a sub-package, modules import their siblings by
full path. A module itself is still imported by path where its attributes are read or patched (`from
tpu_runner.timing import calibration`), and so is a function named as its module (`tpu_runner.evaluation.evaluate`'s
`evaluate`): the package's attribute of that name is the module once it is imported."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(package: str, table: Mapping[str, str], *, defined_here: Iterable[str] = ()
                 ) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """A package's `__all__`, `__getattr__` and `__dir__` (PEP 562) for the public names in `table`, each mapped to
    the sub-module that defines it (`{"measure_pair": "measure"}`), plus `defined_here`, those the package's own
    `__init__` defines. A name imports its module on first access and is read from it each time, never copied into
    the package, so it is what the defining module holds now (a test that patches the module is seen)."""
    exports = dict(table)
    names = sorted({*exports, *defined_here})

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}: it exports {', '.join(names)}; "
                                 "other names are imported from the module that defines them")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names})

    return names, __getattr__, __dir__
