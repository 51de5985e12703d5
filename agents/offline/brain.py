"""The offline brain: no network, deterministic, behind the same interface as the LLM brains.

It reads the reference's program (agents.offline.program), recognises its family (families), chooses parameters
from the roofline and the VMEM budget (params) and writes the kernel (emit). Each role answers in the same
form an LLM would, so the planner, implementer, self-debugger and analyst sub-agents work unchanged:
- planner: a plan in the fixed sections, with the reasons for each parameter and a `Parameters:` line; a
  revision moves to the next point of its search order, a redirect is read in a small vocabulary (REDIRECTS);
- implementer: the kernel for the plan's parameters (or, for a search expansion, the strategy's move);
- debugger: a repair chosen by the evaluator's error kind (agents.offline.debugger);
- analyst: where the time goes, from the evaluator's profile summary.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from agents import strategies, tunable
from agents.brain import BrainReply, BrainRequest, Usage
from agents.offline import emit
from agents.offline.attention import Attention
from agents.offline.debugger import CannotRepair, repair
from agents.offline.expr import NotRecognised
from agents.offline.families import Matmul, Spec, recognise
from agents.offline.kernel_family import FamilySpec
from agents.offline.params import choose, cost_line
from agents.offline.program import Value
from agents.offline.reading import Reading, read_task
from agents.plan_parameters import LINE, parameters_line
from agents.subagents import AgentAnswerError, code_blocks
from storage.settings import Settings
from tpu_runner.hardware import ChipSpec
from tpu_runner.tasks import Task

REDIRECTS = {
    "block RxC": "block rows (or M) x columns (or N), e.g. 'block 256x512'",
    "block_k N": "the K tile of a matmul, e.g. 'block_k 512'",
    "rows N": "rows per block",
    "vmem N": "the scoped VMEM limit in MiB, e.g. 'vmem 96'",
    "smaller / larger blocks": "one step down / up for every block size",
    "no epilogue fusion / fuse the epilogue": "run a matmul's epilogue as XLA ops after the kernel, or inside it",
    "bf16 accumulation / f32 accumulation": "where a bf16 matmul keeps its running sum",
    "single buffering / double buffering": "how many VMEM buffers each streamed input gets",
}
_TOGGLES = {
    "no epilogue fusion": ("FUSE_EPILOGUE", False), "unfused epilogue": ("FUSE_EPILOGUE", False),
    "fuse the epilogue": ("FUSE_EPILOGUE", True), "fuse epilogue": ("FUSE_EPILOGUE", True),
    "epilogue fusion": ("FUSE_EPILOGUE", True),
    "bf16 accumulation": ("ACC_DTYPE", "bfloat16"), "accumulate in bf16": ("ACC_DTYPE", "bfloat16"),
    "f32 accumulation": ("ACC_DTYPE", "float32"), "accumulate in f32": ("ACC_DTYPE", "float32"),
    "single buffering": ("BUFFERS", 1), "double buffering": ("BUFFERS", 2),
}


def kernel_code(source: str) -> str:
    """The module without its docstring and TUNABLE declaration (whose block sizes end at each configuration's
    own sizes): what must be the same for one kernel to serve several configurations."""
    return re.sub(r"^TUNABLE = \{.*?^\}\n", "", source.split('"""', 2)[2], count=1, flags=re.DOTALL | re.MULTILINE)


def analyse(reading: Reading, chip: ChipSpec) -> Spec:
    """The recognised family of a task, checked on every configuration it has (raises NotRecognised)."""
    programs = reading.programs + reading.tests
    spec = recognise(programs[0])
    if isinstance(spec, Attention) and reading.attention_check != "agrees":
        # Looking like attention is not enough: the numbers must agree with attention's (checked by the reading).
        raise NotRecognised(reading.attention_check or "attention-like, but its numbers were not checked")
    params = choose(spec, chip)[0]
    kernel = kernel_code(emit.source(spec, params))
    for other in programs[1:]:
        # One kernel serves every shape only if the same code comes out for each: same ops, same constants
        # (a mean's row length is kept symbolic), the same roles for the inputs.
        if kernel_code(emit.source(recognise(other), params)) != kernel:
            raise NotRecognised("the reference computes differently for its other input shapes (other ops, or "
                                "constants that depend on the shapes), so one kernel cannot serve them all")
    return spec


def parse_redirect(text: str, params: dict[str, Any], space: dict[str, tuple[Any, ...]]
                   ) -> tuple[dict[str, Any], list[str], list[str]]:
    """Apply a person's redirect: (new parameters, what was done, what was not understood)."""
    out, done, unknown = dict(params), [], []
    rows_key = "BLOCK_M" if "BLOCK_M" in space else "BLOCK_ROWS"
    cols_key = "BLOCK_N" if "BLOCK_N" in space else "BLOCK_COLS"

    def put(key: str, value: Any, what: str) -> None:
        if key not in space or (isinstance(value, (bool, str)) or key == "BUFFERS") and value not in space[key]:
            unknown.append(f"{what} (this kernel has no {key} = {value!r})" if key in space
                           else f"{what} (this kernel has no {key})")
            return
        out[key] = value
        done.append(f"{key} = {value}")

    for clause in [c.strip() for c in re.split(r"[,;\n]|\band\b", text.lower()) if c.strip()]:
        if clause in _TOGGLES:
            put(*_TOGGLES[clause], clause)
        elif m := re.fullmatch(r"(?:use )?blocks? (\d+)\s*[x×]\s*(\d+)", clause):
            put(rows_key, int(m.group(1)), clause)
            put(cols_key, int(m.group(2)), clause)
        elif m := re.fullmatch(r"(?:use )?block[_ ]k (\d+)", clause):
            put("BLOCK_K", int(m.group(1)), clause)
        elif m := re.fullmatch(r"(?:use )?(\d+ rows|rows \d+)(?: per block)?", clause):
            put(rows_key, int(re.search(r"\d+", m.group(1)).group()), clause)  # type: ignore[union-attr]
        elif m := re.fullmatch(r"(?:use )?vmem(?: limit)? (\d+)(?: ?mib)?", clause):
            put("VMEM_LIMIT_BYTES", int(m.group(1)) * 2**20, clause)
        elif clause in ("smaller blocks", "larger blocks", "bigger blocks"):
            moved = tunable.step(out, space, ("BLOCK_M", "BLOCK_N", "BLOCK_K", "BLOCK_ROWS", "BLOCK_COLS"),
                                 -1 if clause.startswith("smaller") else 1)
            if moved:
                out = moved
                done.append(clause)
            else:
                unknown.append(f"{clause} (already at the end of the range)")
        else:
            unknown.append(clause)
    return out, done, unknown


@dataclass
class OfflineBrain:
    task: Task
    chip: ChipSpec
    reading: Reading
    name: str = "offline"
    spec: Spec | None = None
    plans: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    cost: str = ""

    def __post_init__(self) -> None:
        if self.spec is None:
            self.spec = analyse(self.reading, self.chip)
        self.cost = cost_line(self.reading.programs[0], self.chip)

    def source(self, params: dict[str, Any]) -> str:
        """The kernel module for these parameters (carrying the arrays the reference makes itself, if any)."""
        assert self.spec is not None
        return emit.with_drawn(emit.source(self.spec, params), self.reading.programs + self.reading.tests)

    # -- the roles ----------------------------------------------------------------------------------------------
    def ask(self, request: BrainRequest) -> BrainReply:
        handler = {"planner": self._plan, "implementer": self._implement, "debugger": self._debug,
                   "analyst": self._analyse}.get(request.role)
        if handler is None:
            raise AgentAnswerError(f"the offline brain has no {request.role!r} role")
        return BrainReply(text=handler(request.prompt), usage=Usage(requests=1))

    def _order(self) -> list[dict[str, Any]]:
        """The plans in the order this brain tries them: its choice, then one strategy move at a time from it."""
        assert self.spec is not None
        first, _ = choose(self.spec, self.chip)
        space = emit.space_of(self.spec)
        order = [first]
        for strategy in strategies.LIBRARY:
            moved = strategy.apply(first, space)
            if moved is not None and moved not in order:
                order.append(moved)
        return order

    def _plan(self, prompt: str) -> str:
        assert self.spec is not None
        space = emit.space_of(self.spec)
        own, reasons = choose(self.spec, self.chip)
        params, note = own, ""
        # Where the session stands comes from the prompt when the loop says (a runner job starts a fresh brain);
        # this brain's own memory only serves callers that keep one brain for a whole session.
        number = re.search(r"This will be plan (\d+) of the session", prompt)
        if number:
            self.plans = int(number.group(1)) - 1
        last = LINE.search(prompt.split("The last plan:\n", 1)[1]) if "The last plan:\n" in prompt else None
        if last:
            with contextlib.suppress(json.JSONDecodeError):
                self.history = [json.loads(last.group(1))]
        if "redirected the work:" in prompt:
            text = prompt.split("redirected the work:", 1)[1].split("\nFollow it.", 1)[0]
            base = self.history[-1] if self.history else own
            params, done, unknown = parse_redirect(text, base, space)
            note = f"Redirect applied: {', '.join(done) or 'nothing'}."
            if unknown:
                note += (f" Not understood: {'; '.join(repr(u) for u in unknown)}. The offline brain understands: "
                         + "; ".join(f"'{k}' ({v})" for k, v in REDIRECTS.items()) + ".")
        elif "The previous candidate" in prompt:
            order = self._order()
            params = order[min(self.plans, len(order) - 1)]
            note = (f"Revision {self.plans}: trying point {min(self.plans, len(order) - 1) + 1} of {len(order)} in "
                    "this brain's order (its first choice, then one strategy move at a time).")
        self.plans += 1
        self.history.append(params)
        if params != own:
            # The reasons below were for the brain's own choice; say so rather than let them describe other numbers.
            changed = ", ".join(f"{k} {own.get(k)} -> {v}" for k, v in params.items() if own.get(k) != v)
            reasons = [reasons[0], f"This plan departs from the brain's own choice ({changed}). Its own choice "
                       "was reasoned so:", *reasons[1:]]
        return self._render_plan(params, reasons, note)

    def _render_plan(self, params: dict[str, Any], reasons: list[str], note: str) -> str:
        spec = self.spec
        assert spec is not None
        is_matmul = isinstance(spec, Matmul)
        if isinstance(spec, FamilySpec):
            strategy = spec.strategy()
        elif is_matmul:
            strategy = ("One pallas_call: a grid over (M, N, K) tiles with an f32 accumulator in VMEM scratch; the "
                        "epilogue runs on the accumulator at the last K step.")
        else:
            strategy = "One pallas_call over blocks of rows" + (
                " holding whole rows, so every row reduction happens in VMEM in one pass." if spec.reduces
                else " and columns; every op of the chain runs on the block in VMEM.")
        tiling = " ".join(reasons[1:] if len(reasons) > 1 else reasons)
        pipelining = ("Pallas double-buffers each BlockSpec input: the next tile's DMA overlaps this tile's work. "
                      + ("The reduction axis (K, or the key blocks) is last and 'arbitrary'; the others are "
                         "'parallel' so megacore chips split them." if is_matmul or isinstance(spec, Attention)
                         # A family's grid: an axis that carries an accumulator or an output block across steps
                         # is 'arbitrary' (after the others); with none, every axis is 'parallel'.
                         else "Axes that carry an accumulator or an output block from step to step come last and "
                         "are 'arbitrary'; the others are 'parallel' so megacore chips split them."
                         if isinstance(spec, FamilySpec) else "Both grid axes are 'parallel'."))
        return "\n\n".join([
            f"## Analysis\n{spec.describe()} on {self.chip.name}. {self.cost} {reasons[0]}",
            f"## Strategy\n{strategy}",
            f"## Tiling and memory\n{tiling}\n{parameters_line(params)}",
            f"## Pipelining\n{pipelining}",
            "## Expected impact\nOne pass over HBM for the inputs and the output; fusing the whole chain saves the "
            "intermediate round trips XLA may make." + (f"\n{note}" if note else ""),
            "## Risks\nBlocks that do not fit the scoped VMEM fail to compile (the self-debugger then shrinks "
            "them); ragged sizes are padded to whole blocks, which costs a copy.",
        ])

    def _implement(self, prompt: str) -> str:
        assert self.spec is not None
        if "Apply this optimisation strategy" in prompt:
            return self._apply_strategy(prompt)
        found = LINE.findall(prompt)
        if not found:
            raise AgentAnswerError("the plan has no 'Parameters: {...}' line for the offline brain to implement")
        params = {**choose(self.spec, self.chip)[0], **json.loads(found[-1])}
        return f"```python\n{self.source(params)}```"

    def _apply_strategy(self, prompt: str) -> str:
        blocks = code_blocks(prompt)
        if not blocks:
            raise AgentAnswerError("no candidate to apply the strategy to")
        code = blocks[0]
        title = prompt.split("Apply this optimisation strategy to it - ", 1)[1].split(":", 1)[0]
        chosen = next((s for s in strategies.LIBRARY if s.title == title), None)
        space = tunable.space(code)
        moved = chosen.apply(tunable.current(code), space) if chosen and space else None
        if moved is None:
            raise AgentAnswerError(f"the offline brain cannot carry out '{title}' on this kernel")
        return f"```python\n{tunable.with_params(code, moved)}```"

    def _debug(self, prompt: str) -> str:
        blocks = code_blocks(prompt)
        if not blocks:
            raise AgentAnswerError("no candidate to debug")
        program = self.reading.programs[0]
        output = program.outputs[0]
        if not isinstance(output, Value):
            raise AgentAnswerError("the reference returns a constant; the offline brain has nothing to conform to")
        try:
            given = program.inputs[:program.given]  # the wrapper takes the reference's own inputs, not the drawn
            fixed, what = repair(blocks[0], prompt, output, given, self.chip.vmem_bytes)
        except CannotRepair as exc:
            raise AgentAnswerError(str(exc)) from exc
        return f"{what}\n```python\n{fixed}```"

    def _analyse(self, prompt: str) -> str:
        text = prompt.lower()
        bound = "memory" if "memory" in text and "compute" not in text.split("memory")[0][-40:] else "compute"
        roof = re.search(r"(\d+)% of roofline", prompt)
        where = f"at {roof.group(1)}% of the roofline" if roof else "against the roofline"
        advice = ("larger blocks (fewer grid steps, longer DMAs)" if bound == "memory"
                  else "larger M/N tiles for more reuse per byte")
        return f"The kernel is {bound}-bound {where}; next, try {advice}."


def offline_brain(task: Task, chip: ChipSpec, settings: Settings) -> OfflineBrain:
    """The offline brain for a task, or NotRecognised saying why it cannot write one. The task's program is read
    in a sandboxed child (`reading`): this process never runs the task's code."""
    return OfflineBrain(task=task, chip=chip, reading=read_task(task, settings))


__all__ = ["REDIRECTS", "NotRecognised", "OfflineBrain", "analyse", "kernel_code", "offline_brain",
           "parse_redirect"]
