"""An optional learned embedding of the cached features before a decoder's LSTMs see them.

The papers' equations feed the raw CNN features (post-ReLU, values up to ~20)
into the LSTMs; the reference implementations embed them first (Linear + ReLU,
``att_embed``). With the raw features, RL fine-tuning of the recurrent weights
that read them lowers the greedy decode on the shapes data (top_down: SCST
moved val CIDEr 0.488 -> 0.41; with a 256-d embedding, in the run that found it, the XE
start was 0.575 and SCST lifted it to 0.599), so decoders that read raw features offer it.
"""

from __future__ import annotations

from torch import nn


def feature_embedding(feature_dim: int, size: int) -> tuple[nn.Module | None, int]:
    """(Linear(feature_dim, size) + ReLU, size), or (None, feature_dim) when size is 0."""
    if not size:
        return None, feature_dim
    return nn.Sequential(nn.Linear(feature_dim, size), nn.ReLU()), size
