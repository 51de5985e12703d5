"""Attention: scaled dot-product attention, causal or not, with grouped-query heads.

Recognised by structure (two matmuls with a row softmax between them, over (batch, heads, seq, head_dim) inputs),
then confirmed by numbers: the reference and a plain model of attention with the parameters read off the program
are run on the same small inputs, and anything else that merely looks like attention is refused.
The kernel is flash attention: a grid over (batch, head, query block, key block), the key axis last and
'arbitrary', a running max, sum and f32 accumulator in VMEM, query heads mapped to their K/V head by the index
map (no repeated K/V in HBM), and, when causal, key blocks above the diagonal skipped and not even fetched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from agents.offline.expr import NotRecognised
from agents.offline.program import Op, Program, Value

_THROUGH = ("convert_element_type", "reshape", "broadcast_in_dim", "squeeze", "expand_dims")


@dataclass(frozen=True)
class Attention:
    q: int  # input positions
    k: int
    v: int
    batch: int
    heads: int
    kv_heads: int
    seq: int
    kv_seq: int
    head_dim: int
    scale: float
    causal: bool
    dtype: str  # q's dtype
    out_dtype: str
    n_inputs: int
    n_static: int

    family = "attention"
    reduces = True

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    def describe(self) -> str:
        kind = "causal " if self.causal else ""
        heads = f"{self.heads} heads" + (f" sharing {self.kv_heads} K/V heads" if self.group > 1 else "")
        return (f"{kind}attention, batch {self.batch}, {heads}, {self.seq} queries x {self.kv_seq} keys of "
                f"dimension {self.head_dim} ({self.dtype}), scale {self.scale:.4g}")


def _input_behind(program: Program, arg: Any) -> Value:
    while isinstance(arg, Value):
        if any(arg.id == v.id for v in program.inputs):
            return arg
        producer = program.producer(arg)
        if producer is None or producer.prim not in _THROUGH:
            break
        arg = producer.args[0]
    raise NotRecognised("an attention operand is computed inside the reference (not a reshaped or converted input)")


def _depends_on(program: Program, later: Value, earlier: Value) -> bool:
    frontier, seen = [later], set()
    while frontier:
        v = frontier.pop()
        if v.id == earlier.id:
            return True
        if v.id in seen:
            continue
        seen.add(v.id)
        producer = program.producer(v)
        if producer is not None:
            frontier += [a for a in producer.args if isinstance(a, Value)]
    return False


def recognise_attention(program: Program, dots: list[Op], output: Value) -> Attention:
    first, second = dots
    if not _depends_on(program, second.args[0], first.out):  # type: ignore[arg-type]
        raise NotRecognised("two matmuls that are not chained as attention")
    between = program.ops[program.ops.index(first) + 1:program.ops.index(second)]
    if not {"reduce_max", "exp", "reduce_sum"} <= {op.prim for op in between}:
        raise NotRecognised("two chained matmuls without a softmax between them (not attention)")
    q, k = (_input_behind(program, a) for a in first.args)
    v = _input_behind(program, second.args[1])
    if len({q.id, k.id, v.id}) != 3 or not (len(q.shape) == len(k.shape) == len(v.shape) == 4):
        raise NotRecognised("attention whose q, k and v are not three (batch, heads, seq, head_dim) inputs")
    batch, heads, seq, head_dim = q.shape
    _, kv_heads, kv_seq, _ = k.shape
    if k.shape != v.shape or k.shape[0] != batch or k.shape[3] != head_dim or heads % kv_heads:
        raise NotRecognised(f"attention with q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}: the offline "
                            "brain needs k and v alike and query heads a multiple of the K/V heads")
    if output.shape != q.shape:
        raise NotRecognised("attention whose output is not shaped like q")
    scale = 1.0
    for op in between:
        literals = [a for a in op.args if not isinstance(a, Value)]
        if op.prim == "mul" and len(literals) == 1 and isinstance(literals[0], float):
            scale *= literals[0]
        elif op.prim == "div" and len(op.args) == 2 and isinstance(op.args[1], float):
            scale /= op.args[1]
    causal = any(op.prim == "iota" for op in program.ops)
    return Attention(q=program.inputs.index(q), k=program.inputs.index(k), v=program.inputs.index(v), batch=batch,
                     heads=heads, kv_heads=kv_heads, seq=seq, kv_seq=kv_seq, head_dim=head_dim, scale=scale,
                     causal=causal, dtype=q.dtype, out_dtype=output.dtype, n_inputs=len(program.inputs),
                     n_static=len(program.static))


def model(q: Any, k: Any, v: Any, spec: Attention) -> Any:
    """Plain attention with the recognised parameters, in f32 (what the reference must agree with)."""
    import jax.numpy as jnp  # run only in the sandboxed child; recognising and writing attention need no jax

    group = q.shape[1] // k.shape[1]
    kk = jnp.repeat(k.astype(jnp.float32), group, axis=1)
    vv = jnp.repeat(v.astype(jnp.float32), group, axis=1)
    s = jnp.einsum("bhqd,bhkd->bhqk", q.astype(jnp.float32), kk) * spec.scale
    if spec.causal:
        mask = jnp.arange(q.shape[2])[:, None] >= jnp.arange(k.shape[2])[None, :]
        s = jnp.where(mask, s, -jnp.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = jnp.exp(s)
    return jnp.einsum("bhqk,bhkd->bhqd", p / p.sum(axis=-1, keepdims=True), vv)


def confirm(reference: Any, spec: Attention, values: list[Any], static: tuple[Any, ...]) -> None:
    """Run the reference and the model on the same inputs; NotRecognised unless they agree."""
    import jax.numpy as jnp

    want = np.asarray(jnp.asarray(reference(*values, *static), jnp.float32))
    got = np.asarray(model(values[spec.q], values[spec.k], values[spec.v], spec))
    tol = 2e-2 if spec.dtype == "bfloat16" else 1e-4
    worst = float(np.max(np.abs(got - want) / (tol + tol * np.abs(want))))
    if not math.isfinite(worst) or worst > 1.0:
        raise NotRecognised(f"the reference looks like attention ({spec.describe()}) but does not compute it: it "
                            "differs from scaled dot-product attention with those parameters")


def attention_space() -> dict[str, tuple[Any, ...]]:
    return {"BLOCK_Q": (128, 256, 512, 1024), "BLOCK_KV": (128, 256, 512, 1024)}


def attention_params(spec: Attention) -> tuple[dict[str, Any], list[str]]:
    bq = min(512, spec.seq)
    bkv = min(512, spec.kv_seq)
    reasons = [f"Attention does {4 * spec.batch * spec.heads * spec.seq * spec.kv_seq * spec.head_dim / 1e9:.0f} "
               f"GFLOP on {spec.batch * (spec.heads + 2 * spec.kv_heads) * spec.seq * spec.head_dim * 2 / 2**20:.0f} "
               "MiB of q, k and v: compute-bound once the score matrix stays in VMEM.",
               f"Query blocks of {bq} and key blocks of {bkv}: the {bq}x{bkv} f32 score tile and the "
               f"{bq}x{spec.head_dim} accumulator stay in VMEM; K/V blocks are re-read once per query block."]
    if spec.causal:
        reasons.append("Causal: key blocks entirely above the diagonal are skipped, and their index map repeats the "
                       "last needed block so they are not fetched either; about half the work.")
    if spec.group > 1:
        reasons.append(f"{spec.group} query heads share each K/V head: the index map sends head h to K/V head "
                       f"h / {spec.group}, so K and V are never repeated in HBM.")
    return {"BLOCK_Q": bq, "BLOCK_KV": bkv}, reasons


def attention_source(spec: Attention, params: dict[str, Any], header: str, tunable_text: str) -> str:
    args = ", ".join([f"a{i}" for i in range(spec.n_inputs)] + [f"s{i}" for i in range(spec.n_static)])
    p_cast = ".astype(v_ref.dtype)" if spec.dtype in ("bfloat16", "float16") else ""
    causal = spec.causal
    # Causal: the body runs only for key blocks that reach below the diagonal.
    skip_open = ("    @pl.when(kv * block_kv <= qi * block_q + block_q - 1)\n" if causal else "") + \
        "    def _compute():\n"
    run_it = "" if causal else "\n    _compute()\n"
    mask = ('''        rows = qi * block_q + lax.broadcasted_iota(jnp.int32, s.shape, 0)
        cols = kv * block_kv + lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(rows >= cols, s, MASK_VALUE)
''' if causal else "")
    kv_index = ("lax.min(kv, lax.div(qi * block_q + block_q - 1, block_kv))" if causal else "kv")
    return header + tunable_text + f'''
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
SCALE = {spec.scale!r}
CAUSAL = {causal!r}


def _kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, block_q, block_kv):
    qi = pl.program_id(2)
    kv = pl.program_id(3)

    @pl.when(kv == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, MASK_VALUE)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

{skip_open}        s = lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32) * SCALE
{mask}        m_prev = m_ref[...]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        p = jnp.exp(s - m_new)
        alpha = jnp.exp(m_prev - m_new)
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=-1, keepdims=True)
        acc_ref[...] = alpha * acc_ref[...] + lax.dot_general(p{p_cast}, v_ref[...], (((1,), (0,)), ((), ())),
                                                              preferred_element_type=jnp.float32)
        m_ref[...] = m_new
{run_it}
    @pl.when(kv == pl.num_programs(3) - 1)
    def _store():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


def _block(dim, want):
    """All of the sequence when it fits, else the largest multiple of 128 up to `want` that divides it."""
    if dim <= want:
        return dim
    b = max(128, want - want % 128)
    while b > 128 and dim % b:
        b -= 128
    return b


def computation({args}):
    q, k, v = a{spec.q}, a{spec.k}, a{spec.v}
    batch, heads, seq, head_dim = q.shape
    kv_heads, kv_seq = k.shape[1], k.shape[2]
    group = heads // kv_heads
    block_q, block_kv = _block(seq, BLOCK_Q), _block(kv_seq, BLOCK_KV)
    if seq % block_q or kv_seq % block_kv:
        raise ValueError(f"sequence lengths {{seq}}, {{kv_seq}} are not multiples of 128")

    def kv_map(b, h, qi, kv):
        return (b, lax.div(h, group), {kv_index}, 0)

    def kernel(*refs):
        return _kernel(*refs, block_q=block_q, block_kv=block_kv)

    return pl.pallas_call(
        kernel,
        grid=(batch, heads, seq // block_q, kv_seq // block_kv),
        in_specs=[pl.BlockSpec((None, None, block_q, head_dim), lambda b, h, qi, kv: (b, h, qi, 0)),
                  pl.BlockSpec((None, None, block_kv, head_dim), kv_map),
                  pl.BlockSpec((None, None, block_kv, head_dim), kv_map)],
        out_specs=pl.BlockSpec((None, None, block_q, head_dim), lambda b, h, qi, kv: (b, h, qi, 0)),
        out_shape=jax.ShapeDtypeStruct(q.shape, jnp.{spec.out_dtype}),
        scratch_shapes=[pltpu.VMEM((block_q, 1), jnp.float32), pltpu.VMEM((block_q, 1), jnp.float32),
                        pltpu.VMEM((block_q, head_dim), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
        cost_estimate=pl.CostEstimate(
            flops=4 * batch * heads * seq * kv_seq * head_dim // (2 if CAUSAL else 1),
            transcendentals=batch * heads * seq * kv_seq // (2 if CAUSAL else 1),
            bytes_accessed=(q.size + 2 * k.size * (seq // block_q)) * q.dtype.itemsize + q.size * 2),
    )(q, k, v)
'''
