"""What recognising cross-entropy found (where the logits, or the matmul that makes them, and the labels are
among the inputs, the sizes, how the per-row losses are reduced), and the kernel's parameters, typed."""

from __future__ import annotations

from dataclasses import dataclass

MiB = 2**20


@dataclass(frozen=True)
class CrossEntropyShape:
    labels: int  # input positions
    logits: int | None  # the logits as an input, or None when a matmul makes them
    hidden: int | None  # the matmul's rows (rows x model)
    weight: int | None  # its weight: (model x vocabulary), or (vocabulary x model) when transposed
    weight_transposed: bool
    rows: int
    vocab: int
    model: int  # the matmul's contraction (0 without one)
    dtype: str  # the logits' or the matmul operands' dtype
    reduce: str  # "none" (a loss per row), "mean" or "sum" over the rows
    # How the label's value is picked, which decides a label outside the vocabulary: a gather ("gather": negative
    # labels count from the end, others give NaN), or a one-hot ("one_hot": nothing is picked) of the logit
    # (picked "x": the loss is the log-sum-exp) or of the log-probability ("logp": the loss is 0).
    by: str
    picked: str
    out_dtype: str
    n_inputs: int
    n_static: int

    @property
    def matmul(self) -> bool:
        return self.hidden is not None

    def describe(self) -> str:
        source = (f"the logits of a {self.rows}x{self.model} @ {self.model}x{self.vocab} matmul ({self.dtype})"
                  if self.matmul else f"{self.dtype} logits [{self.rows}, {self.vocab}]")
        reduced = {"none": "a loss per row", "mean": "the mean loss", "sum": "the summed loss"}[self.reduce]
        return f"cross-entropy over a vocabulary of {self.vocab} from {source}, {reduced}"


@dataclass(frozen=True, kw_only=True)
class CrossEntropyParams:
    """The kernel's TUNABLE values, typed (agents.offline.kernel_family.as_tunable gives the dict the plans carry)."""

    block_rows: int
    block_vocab: int
    vmem_limit_bytes: int

    def __post_init__(self) -> None:
        if self.block_rows < 8 or self.block_vocab < 128:
            raise ValueError(f"blocks of at least 8 rows and 128 columns: {self.block_rows=}, {self.block_vocab=}")
