"""Mixtures of experts computed densely by the reference (every expert's MLP on every token, weighted by a top-k
routing that zeroes all but k): the kernel computes the chosen experts only, as grouped matmuls over rows sorted
by expert.

Modules: `shape` (what was recognised, and the parameters, typed), `recognise`, `source` (the kernel module's
text), `family` (all of it as one FamilySpec).
"""

from agents.offline.moe.family import MoE
from agents.offline.moe.recognise import recognise_moe

__all__ = ["MoE", "recognise_moe"]
