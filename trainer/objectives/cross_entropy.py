"""Cross-entropy (teacher forcing), with optional scheduled sampling, plus the decoder's own terms.

    L = (sum over captions of [ sum_t -log p(y_t | y_<t, V)  +  the decoder's terms ]) / tokens

with the target tokens of the global batch (trainer/batch.py): each term
weighs against a caption's -log P(y|x) as in the paper's per-caption loss. Scheduled
sampling (Bengio et al.; the reference implementations' ``ss_prob``) feeds,
with a probability rising by epoch, the model's own sample of the previous
step instead of the caption's word.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from trainer.bounds import MAX_EPOCHS, bounded
from trainer.decoders.base import Decoder
from trainer.objectives import OBJECTIVES
from trainer.objectives.base import Objective, StepKey
from trainer.objectives.token_cross_entropy import output_cross_entropy


@dataclass
class CrossEntropyConfig:
    scheduled_sampling_start: int = bounded(-1, -1, MAX_EPOCHS)  # epoch; -1 disables
    scheduled_sampling_increase_every: int = bounded(5, 1, MAX_EPOCHS)  # epochs
    scheduled_sampling_increase: float = bounded(0.05, 0, 1)
    scheduled_sampling_max: float = bounded(0.25, 0, 1)  # a probability

    def probability(self, epoch: int) -> float:
        """The chance that an input word is the model's own sample, in ``epoch``."""
        if self.scheduled_sampling_start < 0 or epoch < self.scheduled_sampling_start:
            return 0.0
        rises = (epoch - self.scheduled_sampling_start) // max(
            self.scheduled_sampling_increase_every, 1)
        return min(self.scheduled_sampling_increase * rises, self.scheduled_sampling_max)


class ScheduledSampling:
    """A decoder's word feed: each input word is, with probability ``prob``, the model's own
    sample from the previous step's logits instead of the caption's word."""

    def __init__(self, prob: float):
        self.prob = prob

    def __call__(self, words: Tensor, previous_logits: Tensor) -> Tensor:
        use_sample = torch.rand(words.shape[0], device=words.device) < self.prob
        probs = torch.softmax(previous_logits.detach().float(), -1)
        return torch.where(use_sample, torch.multinomial(probs, 1).squeeze(1), words)


@OBJECTIVES.register("xe")
class CrossEntropy(Objective):
    """Cross-entropy of the reference captions (teacher forcing), plus the decoder's own terms."""

    Config = CrossEntropyConfig
    label = "XE"
    family = "cross-entropy"

    def __init__(self, config: CrossEntropyConfig, setting):
        super().__init__(config, setting)
        self._observed: dict[str, Tensor] = {}

    def loss(self, decoder: Decoder, batch, key: StepKey) -> tuple[Tensor, dict]:
        captions = batch.captions[:, :batch.width]  # drop pad columns
        targets = captions[:, 1:]
        ctx = decoder.encode(batch.feats, batch.mask)
        prob = self.config.probability(key.epoch)
        output = decoder(ctx, captions, ScheduledSampling(prob) if prob > 0 else None)
        share = batch.share
        xe = output_cross_entropy(output, targets) / share.tokens
        terms = decoder.loss_terms(output, targets, targets != 0,
                                   batch.mask.repeat_interleave(batch.seq_per_img, 0))
        self._observed = {k: v.detach() for k, v in terms.observed.items()}
        loss = xe + terms.summed / share.tokens
        return loss, {"xe": xe.detach() * share.weight}  # to the host with the step's loss

    def after_step(self, decoder: Decoder, batch, key: StepKey) -> dict:
        """The decoder's state follows the global batch's means of what its terms observed."""
        if self._observed:
            share = batch.share
            decoder.update({k: share.total(v * share.weight) / share.captions
                            for k, v in self._observed.items()})
            self._observed = {}
        return {}
