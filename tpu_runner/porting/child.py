"""The PyTorch side of `kernelbot port`, in a sandboxed child (`tpu_runner.porting` starts it): the module file
is someone's code, so only this process imports it.

`port` mode: build the module (`Model(*get_init_inputs())`, seeded), run it on `get_inputs()` in PyTorch on the
CPU, run the same module through torchax to get its JAX program with the weights as inputs, write that program
back as a pure-JAX `computation` (`tpu_runner.porting.emit`) with a `get_inputs` drawing inputs and weights like the
module's, and check that the written reference gives PyTorch's outputs on PyTorch's own weights and inputs.
`oracle` mode: the same PyTorch run, then a JAX reference written by someone else (an LLM from CUDA or Triton
source) on those very arrays, compared with PyTorch's outputs.

Writes `port_result.json` beside the request; the stage in progress goes to `stage` first.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MODULE_NAME = "kernelbot_ported_module"
_FLOAT_TOLERANCE = {"float32": 1e-4, "float64": 1e-6, "bfloat16": 2e-2, "float16": 2e-3}
_TASK_TOLERANCE = {"float32": 1e-3, "float64": 1e-6, "bfloat16": 2e-2, "float16": 1e-2}
_DATA_DEPENDENT = ("ConcretizationTypeError", "TracerBoolConversionError", "TracerIntegerConversionError",
                   "NonConcreteBooleanIndexError", "TracerArrayConversionError")


class PortFailed(Exception):
    def __init__(self, kind: str, message: str, line: int | None = None):
        super().__init__(message)
        self.kind, self.message, self.line = kind, message, line


def _port_extra(name: str) -> Any:
    """A module of the port extra (torch, torchax), or a PortFailed saying how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise PortFailed("unavailable", f"{name} cannot be imported here ({exc}): install the port extra, "
                         "`pip install 'kernelbot[port]'`") from exc


@dataclass
class Arg:
    """One argument of the ported computation: an input of forward, or a weight (parameter or buffer)."""

    name: str
    kind: str  # input | weight
    shape: tuple[int, ...]
    dtype: str
    mean: float = 0.0
    std: float = 1.0
    low: int = 0
    high: int = 0

    def describe(self) -> str:
        return f"{self.name}: {self.dtype}[{','.join(map(str, self.shape))}] ({self.kind})"


class Port:
    def __init__(self, request: dict[str, Any], workdir: Path):
        self.request, self.workdir = request, workdir
        self.source_path = str(Path(request["source_path"]).resolve())
        self.source = Path(self.source_path).read_text()
        self.stage("starting")

    def stage(self, doing: str) -> None:
        self.doing = doing
        (self.workdir / "stage").write_text(doing)

    # -- where a failure is in the person's file ----------------------------------------------------------------
    def line_of(self, exc: BaseException) -> int | None:
        from tpu_runner.reports import candidate_line

        if isinstance(exc, SyntaxError) and exc.filename == self.source_path:
            return exc.lineno
        return candidate_line(exc, self.source_path)

    def failed(self, kind: str, exc: BaseException, what: str) -> PortFailed:
        line = self.line_of(exc)
        code = self.source.splitlines()[line - 1].strip() if line and line <= len(self.source.splitlines()) else ""
        where = f" (line {line}: `{code[:120]}`)" if line else ""
        detail = str(exc).strip().splitlines()[0][:600] if str(exc).strip() else ""
        return PortFailed(kind, f"{what}{where}: {type(exc).__name__}{': ' + detail if detail else ''}", line)

    # -- the PyTorch side ---------------------------------------------------------------------------------------
    def load(self) -> tuple[Any, Any, list[Any], list[Any]]:
        """(torch, the built module, forward's tensor inputs, its other arguments)."""
        self.stage("importing torch")
        torch = _port_extra("torch")
        self.stage("importing the module")
        spec = importlib.util.spec_from_file_location(MODULE_NAME, self.source_path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[MODULE_NAME] = module
        try:
            spec.loader.exec_module(module)
        except SyntaxError as exc:
            raise PortFailed("syntax", f"the file is not valid Python (line {exc.lineno}): {exc.msg}",
                             exc.lineno) from exc
        except Exception as exc:
            raise self.failed("module_raised", exc, "importing the file raised") from exc
        model_cls = getattr(module, "Model", None)
        if not (inspect.isclass(model_cls) and issubclass(model_cls, torch.nn.Module)):
            found = [n for n, v in vars(module).items() if inspect.isclass(v) and issubclass(v, torch.nn.Module)
                     and v.__module__ == MODULE_NAME]
            raise PortFailed("no_model", "the file defines no `class Model(nn.Module)`" +
                             (f" (it has {', '.join(found)}; rename the one to port to Model)" if found else
                              ": the module to port must be called Model, with get_inputs() and "
                              "get_init_inputs() beside it"))
        if not callable(getattr(module, "get_inputs", None)):
            raise PortFailed("no_get_inputs", "the file defines no get_inputs(): it must return the list of "
                             "forward's inputs (tensors, and plain numbers for other arguments)")
        torch.manual_seed(int(self.request.get("seed", 0)))
        self.stage("building the module")
        try:
            init = list(module.get_init_inputs()) if callable(getattr(module, "get_init_inputs", None)) else []
            model = model_cls(*init).eval()
        except Exception as exc:
            raise self.failed("module_raised", exc, "building the module (Model(*get_init_inputs())) raised") from exc
        self.stage("making the inputs")
        try:
            args = list(module.get_inputs())
        except Exception as exc:
            raise self.failed("module_raised", exc, "get_inputs() raised") from exc
        count = next((i for i, a in enumerate(args) if not isinstance(a, torch.Tensor)), len(args))
        tensors, others = args[:count], args[count:]
        if not tensors:
            raise PortFailed("bad_inputs", "get_inputs() returned no tensor: it must list forward's input tensors")
        if any(isinstance(a, torch.Tensor) for a in others):
            raise PortFailed("bad_inputs", "get_inputs() must list the tensors first, then any plain arguments")
        return torch, model, tensors, others

    def run_torch(self, torch: Any, model: Any, tensors: list[Any], others: list[Any]) -> list[np.ndarray]:
        self.stage("running the module in PyTorch")
        try:
            with torch.no_grad():
                out = model(*tensors, *others)
        except Exception as exc:
            raise self.failed("module_raised", exc, "the module's forward raised in PyTorch") from exc
        leaves = list(out) if isinstance(out, tuple | list) else [out]
        if not leaves or not all(isinstance(x, torch.Tensor) for x in leaves):
            raise PortFailed("bad_outputs", "forward must return a tensor or a tuple of tensors")
        self.tuple_output = isinstance(out, tuple | list)
        # PyTorch's own dtypes: the arrays below hold bf16 outputs as f32, and tolerances go by the real dtype.
        self.output_dtypes = [str(x.dtype).removeprefix("torch.") for x in leaves]
        return [x.detach().float().numpy() if x.dtype == torch.bfloat16 else x.detach().numpy() for x in leaves]

    # -- the JAX side -------------------------------------------------------------------------------------------
    def trace(self, torch: Any, model: Any, tensors: list[Any], others: list[Any]
              ) -> tuple[Any, Any, list[Arg], list[Any]]:
        """(the closed jaxpr of forward with the weights as inputs, that function, the arguments, their values)."""
        self.stage("importing torchax")
        torchax = _port_extra("torchax")
        import jax

        from tpu_runner.porting.emit import identifier

        self.stage("tracing the module with torchax")
        states, fn = torchax.extract_jax(model, port_environment())
        weight_keys = list(states)
        forward_names = [p for p in inspect.signature(model.forward).parameters][:len(tensors)]
        taken: set[str] = set()
        args = [self._arg(identifier(n, taken), "input", t) for n, t in zip(
            forward_names + [f"x{i}" for i in range(len(forward_names), len(tensors))], tensors, strict=True)]
        args += [self._arg(identifier(k, taken), "weight", states[k]) for k in weight_keys]
        values = [self._jax_array(t) for t in tensors] + [states[k] for k in weight_keys]

        def flat(*xs: Any) -> Any:
            return fn(dict(zip(weight_keys, xs[len(tensors):], strict=True)), (*xs[:len(tensors)], *others))

        try:
            closed = jax.make_jaxpr(flat)(*values)
        except Exception as exc:
            raise self.classified(exc) from exc
        return closed, flat, args, values

    def classified(self, exc: BaseException) -> PortFailed:
        name = type(exc).__name__
        text = str(exc)
        if name == "OperatorNotFound" or "has no lowering" in text or ("not implemented" in text.lower()
                                                                     and "aten" in text):
            op = re.search(r"(aten\.[\w.]+|aten::[\w.]+|torch\.ops\.[\w.]+)", text)
            return self._named("unsupported_op", exc, f"torchax has no JAX lowering for "
                               f"{op.group(1) if op else 'an operator this module uses'}; write that part with "
                               "other torch ops, or port it from CUDA/Triton with an LLM brain")
        if name in _DATA_DEPENDENT:
            return self._named("data_dependent", exc, "the module's shapes or control flow depend on tensor values "
                               "(e.g. boolean masks, .item(), nonzero, if on a tensor), which a fixed-shape kernel "
                               "task cannot have")
        return self.failed("trace_failed", exc, "tracing the module with torchax raised")

    def _named(self, kind: str, exc: BaseException, message: str) -> PortFailed:
        line = self.line_of(exc)
        code = self.source.splitlines()[line - 1].strip() if line else ""
        return PortFailed(kind, message + (f" (line {line}: `{code[:120]}`)" if line else ""), line)

    @staticmethod
    def _jax_array(t: Any) -> Any:
        import jax.numpy as jnp
        import torch

        if t.dtype == torch.bfloat16:
            return jnp.asarray(t.float().numpy(), dtype=jnp.bfloat16)
        return jnp.asarray(t.detach().numpy())

    @staticmethod
    def _arg(name: str, kind: str, value: Any) -> Arg:
        array = np.asarray(value.detach().float().numpy() if hasattr(value, "detach") and str(value.dtype) ==
                           "torch.bfloat16" else (value.detach().numpy() if hasattr(value, "detach") else value))
        dtype = str(value.dtype).replace("torch.", "")
        arg = Arg(name, kind, tuple(int(d) for d in array.shape), dtype)
        if array.size and np.issubdtype(array.dtype, np.floating):
            arg.mean, arg.std = float(array.mean()), float(array.std())
        elif array.size and (np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_):
            arg.low, arg.high = int(array.min()), int(array.max())
        return arg

    # -- the written reference ----------------------------------------------------------------------------------
    def reference_source(self, closed: Any, args: list[Arg]) -> str:
        from tpu_runner.porting.emit import emit_computation

        self.stage("writing the JAX reference")
        try:
            computation = emit_computation(closed, [a.name for a in args], tuple_output=self.tuple_output)
        except ValueError as exc:
            raise PortFailed("unsupported_primitive", f"the traced program cannot be written as JAX source: {exc}") \
                from exc
        original = "\n".join(f"# {line}".rstrip() for line in self.source.strip().splitlines())
        name = self.request["name"]
        header = (f'"""{name}: ported by `kernelbot port` from the PyTorch module below, through torchax; the '
                  "written program was checked\nagainst PyTorch's own outputs on the CPU. computation's arguments "
                  'are forward\'s inputs, then the module\'s weights."""\n\n'
                  f"# The original module:\n#\n{original}\n\n")
        imports = "import jax\nimport jax.numpy as jnp\nimport numpy as np\nfrom jax import lax\n\n\n"
        return header + imports + computation + "\n\n" + get_inputs_source(args)

    def check_written(self, source: str, values: list[Any], expected: list[np.ndarray]) -> float:
        """Run the written reference on PyTorch's own weights and inputs; its largest difference from PyTorch."""
        import jax

        self.stage("checking the written reference against PyTorch")
        namespace: dict[str, Any] = {}
        exec(compile(source, "<written reference>", "exec"), namespace)
        got = jax.jit(namespace["computation"])(*values)
        return compare(got if self.tuple_output else [got], expected, self.output_dtypes, "the written reference")

    # -- the two modes ------------------------------------------------------------------------------------------
    def port(self) -> dict[str, Any]:
        torch, model, tensors, others = self.load()
        expected = self.run_torch(torch, model, tensors, others)
        closed, flat, args, values = self.trace(torch, model, tensors, others)
        import jax

        self.stage("running the module through torchax")
        direct = jax.jit(flat)(*values)
        oracle_err = compare(direct, expected, self.output_dtypes, "torchax's program")
        source = self.reference_source(closed, args)
        written_err = self.check_written(source, values, expected)
        tolerance = max(_TASK_TOLERANCE.get(d, 1e-3) for d in self.output_dtypes)
        yaml_text = task_yaml(self.request["name"], Path(self.request.get("display_name") or self.source_path).name,
                              tolerance, written_err, [a.describe() for a in args])
        return {"ok": True, "files": {"reference.py": source, "kernel_task.yaml": yaml_text},
                "signature": [a.describe() for a in args],
                "outputs": [f"{d}[{','.join(map(str, e.shape))}]" for d, e in zip(self.output_dtypes, expected,
                                                                                    strict=True)],
                "max_abs_err": {"torchax": oracle_err, "reference": written_err}}

    def oracle(self) -> dict[str, Any]:
        torch, model, tensors, others = self.load()
        expected = self.run_torch(torch, model, tensors, others)
        _, _, args, values = self.trace(torch, model, tensors, others)
        import jax

        self.stage("running the JAX reference under test")
        candidate = Path(self.request["reference_path"]).read_text()
        namespace: dict[str, Any] = {}
        try:
            exec(compile(candidate, "<the JAX reference>", "exec"), namespace)
            if not callable(namespace.get("computation")):
                raise PortFailed("bad_reference", "the JAX reference defines no computation()")
            arity = len(inspect.signature(namespace["computation"]).parameters)
            if arity != len(args):
                raise PortFailed("bad_reference", f"the JAX reference's computation takes {arity} arguments; the "
                                 f"PyTorch module has {len(args)}: {', '.join(a.name for a in args)}")
            got = jax.jit(namespace["computation"])(*values)
        except PortFailed:
            raise
        except Exception as exc:
            raise PortFailed("bad_reference", f"the JAX reference raised on the PyTorch module's inputs: "
                             f"{type(exc).__name__}: {str(exc).splitlines()[0][:500] if str(exc) else ''}") from exc
        leaves = list(got) if isinstance(got, tuple | list) else [got]
        try:
            err = compare(leaves, expected, self.output_dtypes, "the JAX reference")
        except PortFailed as mismatch:
            return {"ok": False, "error": {"kind": mismatch.kind, "message": mismatch.message, "line": None},
                    "signature": [a.describe() for a in args]}
        return {"ok": True, "max_abs_err": err, "signature": [a.describe() for a in args]}


def port_environment() -> Any:
    """torchax's environment, except that every tensor forward creates (`torch.ones(t, t)` for a causal mask,
    `torch.arange(n)`, `torch.tensor([...])`) is made as a JAX array. torchax makes the ones created without a
    device CPU tensors, and the first op that mixes one with a traced value fails ("mixed math between XLATensor
    and torch.Tensor"). The module ran on the CPU in PyTorch, so that is the device it meant; and torchax
    consults this only for factory calls made while forward is traced (its own `enabled` flag is not a guide:
    a nested `with env:` inside an op resets it)."""
    from torchax.tensor import Environment

    if not callable(getattr(Environment, "_should_use_torchax_tensor", None)):  # the hook of torchax 0.0.13
        return Environment()

    class PortEnvironment(Environment):
        def _should_use_torchax_tensor(self, device: Any) -> bool:
            return True

    return PortEnvironment()


def compare(got: Any, expected: list[np.ndarray], dtypes: list[str], who: str) -> float:
    """The largest absolute difference of `got` from PyTorch's outputs (`expected`, whose PyTorch dtypes are
    `dtypes`); PortFailed when a floating output comes in another dtype or lies outside its dtype's tolerance,
    naming the output and where."""
    leaves = list(got) if isinstance(got, tuple | list) else [got]
    if len(leaves) != len(expected):
        raise PortFailed("mismatch", f"{who} returns {len(leaves)} outputs; PyTorch returns {len(expected)}")
    worst = 0.0
    for i, (leaf, e, dtype) in enumerate(zip(leaves, expected, dtypes, strict=True)):
        leaf_dtype = str(np.asarray(leaf).dtype)
        if dtype in _FLOAT_TOLERANCE and leaf_dtype != dtype:
            raise PortFailed("mismatch", f"{who}'s output {i} is {leaf_dtype}; PyTorch's is {dtype}")
        g = np.asarray(leaf).astype(np.float64)
        if g.shape != e.shape:
            raise PortFailed("mismatch", f"{who}'s output {i} has shape {g.shape}; PyTorch's has {e.shape}")
        e64 = e.astype(np.float64)
        tol = _FLOAT_TOLERANCE.get(dtype, 0.0)
        diff = np.abs(g - e64)
        allowed = tol + tol * np.abs(e64)
        if diff.size and (np.isnan(g) != np.isnan(e64)).any():
            raise PortFailed("mismatch", f"{who}'s output {i} has NaN where PyTorch's has none (or the reverse)")
        bad = np.argwhere(np.nan_to_num(diff) > allowed)
        if bad.size:
            at = tuple(int(x) for x in bad[0])
            raise PortFailed("mismatch", f"{who} differs from PyTorch: output {i} at {at} is {g[at]:.6g}, PyTorch "
                             f"says {e64[at]:.6g} (|diff| {diff[at]:.3g}, allowed {allowed[at]:.3g}; "
                             f"{len(bad)} of {diff.size} elements off, max |diff| {np.nanmax(diff):.3g})")
        worst = max(worst, float(np.nanmax(diff)) if diff.size else 0.0)
    return worst


def get_inputs_source(args: list[Arg]) -> str:
    """get_inputs(): forward's inputs and the module's weights drawn like the ported module's (mean and spread of
    each float tensor, range of each integer one), from a fixed seed."""
    lines = ["def get_inputs():", f"    keys = jax.random.split(jax.random.key(0), {max(len(args), 1)})"]
    values = []
    for i, a in enumerate(args):
        shape = repr(a.shape)
        if a.dtype.startswith(("float", "bfloat")):
            draw = f"jax.random.normal(keys[{i}], {shape}, jnp.float32)"
            value = f"({a.mean:.6g} + {a.std or 1.0:.6g} * {draw})" if (a.mean, a.std) != (0.0, 1.0) else draw
            values.append(f"{value}.astype(jnp.{a.dtype})")
        elif a.dtype == "bool":
            values.append(f"jax.random.bernoulli(keys[{i}], 0.5, {shape})")
        else:
            values.append(f"jax.random.randint(keys[{i}], {shape}, {a.low}, {a.high + 1}, jnp.{a.dtype})")
    lines.append("    return [" + ",\n            ".join(values) + "], []")
    return "\n".join(lines) + "\n"


def task_yaml(name: str, origin: str, tolerance: float, err: float, signature: list[str]) -> str:
    sig = "\n".join(f"  - {json.dumps(s)}" for s in signature)
    return (f"task_id: {name}\n"
            f"description: Ported from the PyTorch module Model in {json.dumps(origin)} through torchax; the JAX "
            f"reference matches PyTorch on the CPU (max |diff| {err:.3g}).\n"
            f"atol: {tolerance}\nrtol: {tolerance}\n"
            f"ported_from:\n  kind: pytorch\n  file: {json.dumps(origin)}\n  oracle: torchax\n"
            f"  max_abs_err: {err:.6g}\n  arguments:\n{sig}\n")


def main(argv: list[str]) -> int:
    request_path = Path(argv[1])
    request = json.loads(request_path.read_text())
    workdir = request_path.parent
    port = Port(request, workdir)
    try:
        result = port.oracle() if request.get("mode") == "oracle" else port.port()
    except PortFailed as failure:
        result = {"ok": False, "error": {"kind": failure.kind, "message": failure.message, "line": failure.line}}
    except Exception as exc:  # noqa: BLE001 - anything else is reported as what it is, with where it was
        result = {"ok": False, "error": {"kind": "crashed", "message": f"{port.doing}: {type(exc).__name__}: "
                                         f"{str(exc).splitlines()[0][:800] if str(exc) else ''}", "line": None}}
    tmp = workdir / "port_result.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(workdir / "port_result.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
