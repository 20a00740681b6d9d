"""What every decoder is: ``encode`` once per image, ``init_state``, then ``step`` per word.

Teacher forcing (:meth:`Decoder.forward`), greedy decoding, sampling and beam
search (``trainer/decode.py``) all drive the same ``step``. A context is a dict
and a state a tuple of tensors whose first dimension is the caption (or beam):
so expanding an image to its ``seq_per_img`` captions or to K beams, and
reordering beams, is the same ``index_select`` for every decoder.

Shapes: N captions (or beams), L locations, D feature dim, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from trainer.objectives.share import Share

Context = dict[str, Tensor]
State = tuple[Tensor, ...]


@dataclass
class DecoderOutput:
    logits: Tensor  # [N, T, V]
    alphas: Tensor | None  # [N, T, L], None for decoders without attention
    extras: dict[str, Tensor] = field(default_factory=dict)


def expand_context(ctx: Context, n: int) -> Context:
    """Each image's context repeated for its n captions (or beams): [B, ...] -> [B*n, ...]."""
    return {k: v.repeat_interleave(n, dim=0) for k, v in ctx.items()}


def select(tensors, index: Tensor):
    """Rows ``index`` of every tensor of a state tuple or context dict."""
    if isinstance(tensors, dict):
        return {k: v.index_select(0, index) for k, v in tensors.items()}
    return tuple(t.index_select(0, index) for t in tensors)


class Decoder(nn.Module):
    """Subclasses set ``Config`` (a dataclass) and implement encode, init_state and step."""

    Config: type
    has_attention: bool = True

    def __init__(self, config, vocab_size: int, feature_dim: int):
        super().__init__()
        self.config, self.vocab_size, self.feature_dim = config, vocab_size, feature_dim

    def encode(self, feats: Tensor, mask: Tensor) -> Context:
        """Per image, what every step reads: feats [B, L, D], mask [B, L] bool."""
        raise NotImplementedError

    def init_state(self, ctx: Context) -> State:
        raise NotImplementedError

    def step(self, words: Tensor, state: State, ctx: Context) -> tuple[Tensor, State, Tensor | None]:
        """words [N] -> logits [N, V], the next state, attention [N, L] (or None)."""
        raise NotImplementedError

    def forward(self, feats: Tensor, mask: Tensor, captions: Tensor, seq_per_img: int = 1,
                sample_prob: float = 0.0) -> DecoderOutput:
        """Teacher forcing over captions [B*S, T+1] (<bos> first): logits for positions 1..T.

        ``sample_prob`` > 0 is scheduled sampling: each input word is, with that
        probability, the model's own sample from the previous step instead.
        """
        ctx = expand_context(self.encode(feats, mask), seq_per_img)
        state = self.init_state(ctx)
        logits, alphas = [], []
        for t in range(captions.shape[1] - 1):
            words = captions[:, t]
            if t > 0 and sample_prob > 0:
                words = self._scheduled_words(words, logits[-1], sample_prob)
            step_logits, state, alpha = self.step(words, state, ctx)
            logits.append(step_logits)
            alphas.append(alpha)
        return DecoderOutput(torch.stack(logits, 1),
                             torch.stack(alphas, 1) if alphas[0] is not None else None)

    @staticmethod
    def _scheduled_words(words: Tensor, prev_logits: Tensor, prob: float) -> Tensor:
        use_sample = torch.rand(words.shape[0], device=words.device) < prob
        if not use_sample.any():
            return words
        sampled = torch.multinomial(torch.softmax(prev_logits.detach().float(), -1), 1).squeeze(1)
        return torch.where(use_sample, sampled, words)

    def regularizer(self, output: DecoderOutput, targets: Tensor, target_mask: Tensor,
                    loc_mask: Tensor, share: Share | None = None) -> Tensor:
        """A decoder's own loss terms beyond cross-entropy (0 unless overridden).

        targets [N, T] word ids, target_mask [N, T] bool, loc_mask [N, L] bool.
        Per-token and per-caption terms divide their sums by ``share``'s counts of
        the global batch (trainer/objectives/share.py); without one, by these captions' own.
        """
        return output.logits.new_zeros(())


def divisors(target_mask: Tensor, share: Share | None) -> tuple[int, int]:
    """(tokens, captions) a regularizer divides its sums by."""
    if share is None:
        return max(int(target_mask.sum()), 1), target_mask.shape[0]
    return share.tokens, share.captions
