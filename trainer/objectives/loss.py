"""One training batch's loss, as the module that DistributedDataParallel wraps.

DDP synchronises the gradients of what its wrapped module's ``forward``
computes. Training calls more of a decoder than its ``forward`` (RL samples
step by step through ``decoder.step``), so the module DDP wraps is this one:
its forward is the whole loss, cross-entropy or a reinforcement objective,
and its only parameters are the decoder's.

Losses divide sums by the global batch's counts (``batch.share``,
trainer/objectives/share.py), so the losses of all ranks add up to the one-process loss.
Statistics follow the same rule, except the ``time_*`` ones, which are this
rank's own seconds.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from trainer.data import TrainBatch
from trainer.decode import SamplingNoise
from trainer.decoders.base import Decoder


def xe_loss(logits: Tensor, targets: Tensor, tokens: int | None = None) -> Tensor:
    """Cross-entropy per real token (targets include <eos>; <pad> ignored): the sum over
    tokens divided by ``tokens`` (the global batch's), or the mean over these tokens."""
    if tokens is None:
        return F.cross_entropy(logits.transpose(1, 2).float(), targets, ignore_index=0)
    return F.cross_entropy(logits.transpose(1, 2).float(), targets, ignore_index=0,
                           reduction="sum") / tokens


class Objective(nn.Module):
    def __init__(self, decoder: Decoder, seq_per_img: int, reinforcement=None):
        super().__init__()
        self.decoder, self.seq_per_img, self.reinforcement = decoder, seq_per_img, reinforcement

    def forward(self, batch: TrainBatch, sample_prob: float = 0.0,
                noise: SamplingNoise | None = None) -> tuple[Tensor, dict]:
        if self.reinforcement is not None:
            loss, stats = self.reinforcement.loss(self.decoder, batch.feats, batch.mask,
                                                  batch.image_ids, batch.share, noise)
        else:
            loss, stats = self.cross_entropy(batch, sample_prob)
        return loss * batch.share.weight, stats

    def cross_entropy(self, batch: TrainBatch, sample_prob: float) -> tuple[Tensor, dict]:
        captions = batch.captions[:, :int((batch.captions != 0).sum(1).max())]  # drop pad columns
        targets = captions[:, 1:]
        output = self.decoder(batch.feats, batch.mask, captions, self.seq_per_img, sample_prob)
        xe = xe_loss(output.logits, targets, batch.share.tokens)
        loc_mask = batch.mask.repeat_interleave(self.seq_per_img, 0)
        loss = xe + self.decoder.regularizer(output, targets, targets != 0, loc_mask, batch.share)
        return loss, {"xe": xe.item() * batch.share.weight}
