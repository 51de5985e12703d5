"""The epilogue as block code on a convolution's (channels, positions) tile: per-channel values are rows, and
spatial reductions mask the wide positions out."""

from __future__ import annotations

from dataclasses import dataclass

from agents.offline.conv.shape import FULL, ROW, value_kind
from agents.offline.expr import BlockCode, NotRecognised
from agents.offline.program import Op, Value

REDUCTIONS = {"reduce_sum": ("jnp.sum", "0.0", "+"), "reduce_max": ("jnp.max", "-jnp.inf", "jnp.maximum"),
               "reduce_min": ("jnp.min", "jnp.inf", "jnp.minimum")}


@dataclass
class ConvCode(BlockCode):
    """Block code on a (channels, positions) tile: FULL is the tile, ROW one value per channel row."""

    conv_main: tuple[int, ...] = ()

    def _kind(self, op: Op) -> str | None:
        if op.prim == "broadcast_in_dim" and isinstance(op.args[0], Value) and op.out.shape == self.conv_main:
            source = op.args[0]
            dims = tuple(op.params.get("broadcast_dimensions", ()))
            lands = {dims[a] for a, d in enumerate(source.shape) if d > 1}
            if not lands <= {0, 1} and self.kind(source) != FULL:
                return None  # broadcast along a spatial axis: not per channel
        return value_kind(op.out.shape, self.conv_main)

    def emit(self, op: Op) -> None:
        if op.prim in REDUCTIONS:
            self.bind(op.out, self.reduction(op), ROW)
            return
        super().emit(op)

    def reduction(self, op: Op, into_f32: bool = False) -> str:
        """A masked reduction over the tile's valid positions (the wide ones are left out); `into_f32`: a partial
        in f32 (a chunk's, combined with the others' before anything is rounded to the reference's dtype)."""
        source = op.args[0]
        spatial = tuple(range(2, len(self.conv_main)))
        if tuple(op.params.get("axes", ())) != spatial or self.kind(source) != FULL:
            raise NotRecognised(f"the reference's {op.prim} over axes {list(op.params.get('axes', ()))} of "
                                f"{list(getattr(source, 'shape', ()))}; the offline brain's convolutions reduce "
                                f"over all the spatial axes {list(spatial)} of the convolution's output")
        reduce, identity, _ = REDUCTIONS[op.prim]
        masked = f"jnp.where(mask, {self.ref(source)}, {identity})"
        if into_f32:
            return f"{reduce}({masked}.astype(jnp.float32), axis=-1, keepdims=True)"
        return self.reduced(op.prim, masked)


def depends_on_reduction(ops: list[Op]) -> set[int]:
    """Ids of the values computed from a spatial reduction."""
    tainted: set[int] = set()
    for op in ops:
        if op.prim in REDUCTIONS or any(isinstance(a, Value) and a.id in tainted for a in op.args):
            tainted.add(op.out.id)
    return tainted


