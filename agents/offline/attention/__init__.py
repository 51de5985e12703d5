"""Attention: scaled dot-product attention, causal or not, with grouped-query heads, in any head layout, with an
additive score bias.

Recognised by structure: two chained matmuls with a row softmax between them. Each axis of the two dots gets a
role label (batch, heads, query or key position, head dimension) from the dots' dimension numbers, and the labels
are carried back through the reshapes, transposes, repeats and casts to the inputs and forward to the output; so
(batch, heads, seq, dim) and (batch, seq, heads, dim) inputs, `jnp.repeat`ed K/V heads and query heads reshaped
into groups are all the same family. The ops on the scores before the softmax (a scale, an added bias input, a
mask built from positions) are kept in order and replayed on each score tile. Then confirmed by numbers: the
reference and a plain model of attention with what was read off the program are run on the same small inputs,
and anything else that merely looks like attention is refused.

The kernel is flash attention: a grid over (batch, head group, query block, key block), the key axis last and
'arbitrary', a running max, sum and f32 accumulator in VMEM. Query heads that share a K/V head are processed
together (HEADS_PER_STEP of them stacked as rows of one tile), so each K/V block is fetched once for the group; a
(batch, seq, heads, dim) array is read in place, its heads side by side on the lanes (no transpose in HBM). Within a
block the scores are computed CHUNK_ROWS query rows at a time (a rolled loop), so the f32 tile the scheduler works on
is a chunk's, not the block's. When causal, key blocks above the diagonal are skipped and not even fetched, the mask
is applied on the diagonal blocks only, and there each chunk of rows multiplies only the keys up to its last row.

Modules: `shape` (what was recognised), `recognise` (by structure), `confirm` (by numbers, in the sandboxed
child), `params` (the TUNABLE space and the brain's choice, typed), `source` (the kernel module's text),
`helpers` (the kernel's fixed helpers as real functions), `family` (all of it as one FamilySpec).
"""

from agents.offline.attention.confirm import confirm_attention, model
from agents.offline.attention.family import Attention
from agents.offline.attention.params import AttentionParams, attention_space, choose_params
from agents.offline.attention.recognise import recognise_attention
from agents.offline.attention.shape import AttentionShape, ScoreOp

__all__ = ["Attention", "AttentionParams", "AttentionShape", "ScoreOp", "attention_space", "choose_params",
           "confirm_attention", "model", "recognise_attention"]
