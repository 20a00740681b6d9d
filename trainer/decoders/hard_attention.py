"""Show, Attend and Tell, stochastic "hard" attention.

In training, one location is sampled per step, s_t ~ Multinoulli(alpha_t),
and the context is the sampled annotation itself, z_t = sum_i s_ti a_i = a_{s_t}
(the paper's hard rule: the gating scalar beta is soft attention's, section
4.2.1; ``gate: true`` adds it, as arctic-captions' ``selector`` option can).
The gradient is the paper's estimator (eq 12):

    d log p(y|s)/dW + lambda_r (log p(y|s) - b) d log p(s)/dW + lambda_e dH[s]/dW

with the moving-average baseline b_k = 0.9 b_{k-1} + 0.1 log p(y|s_k) (a buffer,
so it is checkpointed). Xu et al.'s further variance reduction: "with
probability 0.5 for a given image, we set the sampled attention location s~ to
its expected value alpha" (``expectation``, 0 to switch off): such a caption
is trained on the expected context, like soft attention, and has no REINFORCE
term. The baseline moves only in :meth:`HardAttention.update`, which the
objective calls once per optimiser step with the mean log p(y|s) of the global
batch's sampled captions: computing the loss twice does not move it. At test
time the context is the expected one, sum_i alpha_ti a_i (the soft decoder's
step), as arctic-captions decodes its stochastic model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from trainer.decoders import DECODERS
from trainer.decoders.base import Context, DecoderOutput, LossTerms, WordFeed
from trainer.decoders.soft_attention import SoftAttention, SoftAttentionConfig


@dataclass
class HardAttentionConfig(SoftAttentionConfig):
    doubly_stochastic: float = 0.0
    gate: bool = False  # the hard rule has no beta
    reinforce: float = 1.0  # lambda_r
    entropy: float = 0.01  # lambda_e
    baseline_decay: float = 0.9
    expectation: float = 0.5  # per caption, the chance of training on the expected context


@DECODERS.register("hard_attention")
class HardAttention(SoftAttention):
    """Show-Attend-Tell hard attention: a location sampled per step, REINFORCE, moving baseline."""

    Config = HardAttentionConfig
    baseline: Tensor  # a buffer: b_k

    def __init__(self, config: HardAttentionConfig, vocab_size: int, feature_dim: int):
        super().__init__(config, vocab_size, feature_dim)
        self.register_buffer("baseline", torch.zeros(()))

    def forward(self, ctx: Context, captions: Tensor,
                feed: WordFeed | None = None) -> DecoderOutput:
        if not self.training:
            return super().forward(ctx, captions, feed)
        n = captions.shape[0]
        state = self.init_state(ctx, n)
        image = torch.arange(n, device=captions.device) // (n // ctx["feats"].shape[0])
        expected = torch.rand(n, device=captions.device) < self.config.expectation  # [N]
        ahead = self.embed_words(captions[:, :-1].t()) if feed is None else None  # [T, N, ...]
        logits: list[Tensor] = []
        hiddens, step_alphas, locations = [], [], []
        for t in range(captions.shape[1] - 1):
            if ahead is not None:
                inputs = ahead[t]
            else:  # scheduled sampling: the words depend on the previous step's logits
                assert feed is not None, "words are embedded ahead only without a feed"
                inputs = self.embed_words(captions[:, t] if t == 0
                                          else feed(captions[:, t], logits[-1]))
            context, alpha, beta = self.attend(state[0], ctx)
            location = torch.multinomial(alpha.detach().float(), 1)  # [N, 1]
            sampled = ctx["feats"][image, location[:, 0]]  # a_{s_t}, [N, D]
            hidden, state = self.advance(inputs, state,
                                         beta * torch.where(expected[:, None], context, sampled))
            hiddens.append(hidden)
            if ahead is None:
                logits.append(self.readout(hidden))
            step_alphas.append(alpha)
            locations.append(location)
        alphas = torch.stack(step_alphas, 1)  # [N, T, L]
        log_alpha = torch.log(alphas.clamp(min=1e-12))
        return DecoderOutput(
            self.readout(torch.stack(hiddens, 1)) if ahead is not None else torch.stack(logits, 1),
            alphas, {"location_logp": log_alpha.gather(2, torch.stack(locations, 1)).squeeze(2),
                     "entropy": -(alphas * log_alpha).sum(2), "sampled": ~expected})

    def loss_terms(self, output: DecoderOutput, targets: Tensor, target_mask: Tensor,
                   loc_mask: Tensor) -> LossTerms:
        """-(lambda_r (log p(y|s) - b) log p(s) + lambda_e H[s]) per caption (the REINFORCE term
        for sampled captions only), with the baseline as it stands; ``observed`` holds what
        :meth:`update` moves it towards."""
        terms = super().loss_terms(output, targets, target_mask, loc_mask)
        if "location_logp" not in output.extras:  # evaluation: the expected context
            return terms
        c = self.config
        mask = target_mask.float()
        sampled = output.extras["sampled"].float()  # [N]
        token_logp = -F.cross_entropy(output.logits.transpose(1, 2).float(), targets,
                                      reduction="none")  # [N, T]
        sentence_logp = (token_logp * mask).sum(1).detach()  # log p(y | s), [N]
        advantage = (sentence_logp - self.baseline) * sampled
        locations = (output.extras["location_logp"] * mask).sum(1)  # log p(s), [N]
        entropy = (output.extras["entropy"] * mask).sum(1)
        terms.summed = terms.summed - (c.reinforce * advantage * locations
                                       + c.entropy * entropy).sum()
        terms.observed["sentence_logp"] = (sentence_logp * sampled).sum()
        terms.observed["sampled"] = sampled.sum()
        return terms

    @torch.no_grad()
    def update(self, observed: dict[str, Tensor]) -> None:
        """b_k = decay * b_{k-1} + (1 - decay) * mean log p(y | s) of the step's sampled captions
        (``observed`` holds global means per caption: their ratio is the sampled ones' mean)."""
        if observed.get("sampled", 0) > 0:
            decay = self.config.baseline_decay
            mean = observed["sentence_logp"] / observed["sampled"]
            self.baseline.mul_(decay).add_((1 - decay) * mean)
