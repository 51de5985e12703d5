"""A compile server: `python -m tpu_runner.sandbox.entry LIMITS tpu_runner.compiler.server`, kept running.

It compiles exported programs (`jax.export`, written by the candidate's or the reference's child) ahead of
time for a TPU topology with libtpu, one request at a time, and never runs candidate or task code: what it
reports - the compiler's errors, cost and memory analysis, and the static cycle profile libtpu writes when
started with `--xla_jf_dump_static_llo_profile_to` - is read where the candidate never ran. libtpu aborts the
whole process when one of its checks fails (its static profiler does so on ordinary bf16 code); the parent
sees the server die, restarts it, and knows which request did it.

Protocol: one JSON line per request on stdin (`protocol.CompileRequest`); the answer (`protocol.CompileReply`) is
`out/<id>/result.json` in the server's scratch directory, with the profile files beside it.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import jax

from tpu_runner.compiler.aot import StaticProfile, target_sharding
from tpu_runner.hardware import get_chip
from tpu_runner.reports import CompileReply, CompileRequest, write_json


def _compile(exported_path: Path, target: str, profile: StaticProfile, keep_in: Path) -> CompileReply:
    exported = jax.export.deserialize(bytearray(exported_path.read_bytes()))
    sharding = target_sharding(get_chip(target))
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in exported.in_avals]
    profile.collect()  # drop anything an earlier, failed compile left behind
    lowered = jax.jit(exported.call).trace(*args).lower()
    t0 = time.perf_counter()
    compiled = lowered.compile()
    seconds = time.perf_counter() - t0
    cost: Any = compiled.cost_analysis() or {}
    if isinstance(cost, list):
        cost = cost[0] if cost else {}
    memory: dict[str, int] = {}
    mem = compiled.memory_analysis()
    if mem is not None:
        for name in ("argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes",
                     "generated_code_size_in_bytes"):
            memory[name] = int(getattr(mem, name, 0) or 0)
    ops = profile.collect(keep_in=keep_in, label="op")
    # The optimised program: the time model reads its ops (`hlo_ops`), in the parent.
    return CompileReply(ok=True, compile_seconds=seconds, ops=ops, memory=memory, hlo_text=compiled.as_text() or "",
                        cost={k: float(v) for k, v in cost.items() if isinstance(v, int | float)},
                        profiled=profile.dump_dir is not None)


def serve(scratch: Path) -> None:
    dump = scratch / "llo_dump"
    profile = StaticProfile(dump if "--xla_jf_dump_static_llo_profile_to" in _libtpu_args() else None)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = CompileRequest.from_json(line)
        out = scratch / "out" / request.id
        out.mkdir(parents=True, exist_ok=True)
        (scratch / "current").write_text(request.id)
        try:
            answer = _compile(Path(request.exported), request.target, profile, out / "llo")
        except Exception as exc:  # noqa: BLE001 - the compiler's refusal is the answer
            answer = CompileReply(ok=False, error_type=type(exc).__name__, error=str(exc),
                                  traceback=traceback.format_exc()[-4000:])
        write_json(out / "result.json", answer)


def _libtpu_args() -> str:
    return os.environ.get("LIBTPU_INIT_ARGS", "")


def main(argv: list[str]) -> int:
    serve(Path.cwd())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
