"""Cross-entropy: each row's log-sum-exp over a vocabulary minus its label's logit, from logits that are an input
or a matmul's output (a language model's head), per row or averaged.

Recognised by structure and then by numbers: the row max, the exponential of the logits minus it and its row sum,
the log, and the label's logit or log-probability picked (a gather, or a one-hot made from an iota times the row,
summed) are matched op by op; what the reference does with those per-row values after (the sign, the sum, the mean)
is evaluated with numpy on drawn values and must equal the model's loss.

The kernel streams the vocabulary: a grid over (row blocks, vocabulary blocks), the vocabulary last and
'arbitrary'; per block the logits tile (read, or computed on the MXU from the rows' hidden states and a block of
the weights), an online max and sum of exponentials, and the label's logit picked by comparing the block's column
positions with the labels, in VMEM. Neither the logits nor their log-softmax reach HBM.

Modules: `shape` (what was recognised, the parameters), `recognise`, `source` (the kernel module's text),
`family` (all of it as one FamilySpec).
"""

from agents.offline.crossentropy.family import CrossEntropy
from agents.offline.crossentropy.recognise import recognise_cross_entropy
from agents.offline.crossentropy.shape import CrossEntropyParams, CrossEntropyShape

__all__ = ["CrossEntropy", "CrossEntropyParams", "CrossEntropyShape", "recognise_cross_entropy"]
