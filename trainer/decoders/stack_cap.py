"""Stack-Cap (Gu et al. 2018): a coarse decoder, then Nf fine decoders with stacked attention.

Per step t, with y_{t-1} the previous word's embedding and f(V) the mean feature:

    o0_t, h0_t = LSTM_coarse([f(V); h^{Nf}_{t-1}; y_{t-1}], h0_{t-1})          eqs 1-2
    for i = 1..Nf:
        hhat^{i-1}_t = h^{i-1}_t + sum_n alpha^{i-1,n}_t (W^{i-1}_va V_n + b)      eq 8 (alpha^0 = 0)
        A^{i,n}_t    = tanh(W^i_va V_n + W^i_ha hhat^{i-1}_t)                     eq 7
        alpha^i_t    = softmax(W^i_a A^i_t + b^i_a)                              eq 6
        g^i_t        = sum_n alpha^{i,n}_t (W^i_va V_n + b^i_va)                  eq 5
        o^i_t, h^i_t = LSTM^i_fine([g^i_t; h^{i-1}_t; y_{t-1}], h^i_{t-1})       eqs 3-4
    p_i(y_t) = softmax(W^i_o o^i_t + b^i_o)  for every stage i = 0..Nf

Cross-entropy is the sum of every stage's loss (eq 10): the head stage's
through the objective's cross-entropy, the others through :meth:`StackCap.loss_terms`.

Where the gradients go: eq 2 feeds the last fine stage's previous hidden
state h^{Nf}_{t-1} back into the coarse LSTM, so stage i's loss at step t
reaches, through steps < t, the parameters of every stage, not only
theta_{0:i} as eqs 9-14 write it (the coarse-to-fine reward's eq 14 too).
This follows eq 2, which defines the model; eqs 9-14 describe which losses are
summed, and no stop-gradient appears anywhere in the paper.
Decoding follows the stage in ``head`` (the last by default): each stage's own
caption comes from decoding with that stage as the head. ``stack_cap_star``
(its own file) is the same without the stacking: each stage attends with
h^{i-1}_t alone (hhat = h).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainer.decoders import DECODERS
from trainer.decoders.base import (Context, DecoderConfig, DecoderOutput, LossTerms, StagedDecoder,
                                   State, WordFeed)
from trainer.modules.dropout import Dropout
from trainer.modules.feature_embed import feature_embedding
from trainer.modules.pooling import masked_mean


@dataclass
class StackCapConfig(DecoderConfig):
    embed: int = 512
    hidden: int = 512
    att_hidden: int = 512
    fine_stages: int = 2  # Nf
    dropout: float = 0.5
    stacked: bool = True  # False: Stack-Cap*, an independent attention per stage
    feature_embed: int = 0  # > 0: V_n -> ReLU(W V_n) of this size first (modules/feature_embed.py)


class FineAttention(nn.Module):
    """One fine stage's attention (eqs 5-7); ``value`` is W_va V_n + b, also used by eq 8."""

    def __init__(self, feature_dim: int, hidden: int, att_hidden: int):
        super().__init__()
        self.key = nn.Linear(feature_dim, att_hidden)  # W_va in eq 7
        self.query = nn.Linear(hidden, att_hidden, bias=False)  # W_ha
        self.score = nn.Linear(att_hidden, 1)  # W_a, b_a
        self.value = nn.Linear(feature_dim, hidden)  # W_va, b_va in eqs 5 and 8

    def forward(self, keys: Tensor, values: Tensor, mask: Tensor, query: Tensor):
        """keys [N, L, A], values [N, L, H], query [N, H] -> g [N, H], alpha [N, L]."""
        scores = self.score(torch.tanh(keys + self.query(query)[:, None])).squeeze(2)
        alpha = torch.softmax(scores.masked_fill(~mask, float("-inf")), 1)
        return torch.bmm(alpha[:, None], values).squeeze(1), alpha


@DECODERS.register("stack_cap")
class StackCap(StagedDecoder):
    """Stack-Cap: a coarse LSTM, then Nf fine LSTMs with stacked attention, every stage supervised."""

    Config = StackCapConfig

    def __init__(self, config: StackCapConfig, vocab_size: int, feature_dim: int):
        super().__init__(config, vocab_size, feature_dim)
        e, h, nf = config.embed, config.hidden, config.fine_stages
        self.feature_embed, feature_dim = feature_embedding(feature_dim, config.feature_embed)
        self.word_embed = nn.Embedding(vocab_size, e)
        self.coarse = nn.LSTMCell(feature_dim + h + e, h)
        self.fine = nn.ModuleList(nn.LSTMCell(2 * h + e, h) for _ in range(nf))
        self.attention = nn.ModuleList(FineAttention(feature_dim, h, config.att_hidden)
                                       for _ in range(nf))
        self.outputs = nn.ModuleList(nn.Linear(h, vocab_size) for _ in range(nf + 1))
        self.dropout = Dropout(config.dropout)
        self.head = nf  # the stage whose words decoding follows

    @property
    def stages(self) -> int:
        return self.config.fine_stages + 1

    def encode(self, feats: Tensor, mask: Tensor) -> Context:
        if self.feature_embed is not None:
            feats = self.feature_embed(feats)
        ctx = {"mask": mask, "mean": masked_mean(feats, mask)}
        for i, att in enumerate(self.attention):
            ctx[f"keys{i}"], ctx[f"values{i}"] = att.key(feats), att.value(feats)
        return ctx

    def init_state(self, ctx: Context) -> State:
        zeros = ctx["mean"].new_zeros(ctx["mean"].shape[0], self.config.hidden)
        return (zeros,) * (2 * self.stages)  # (h0, c0, h1, c1, ...)

    def stage_step(self, words: Tensor, state: State, ctx: Context):
        """-> every stage's logits [stages] x [N, V], the next state, every fine alpha."""
        y = self.dropout(self.word_embed(words))
        h_last = state[-2]  # h^{Nf}_{t-1}
        h, c = self.coarse(torch.cat([ctx["mean"], h_last, y], 1), (state[0], state[1]))
        new_state, logits, alphas = [h, c], [self.outputs[0](self.dropout(h))], []
        previous_h, previous_attended = h, None
        for i, (cell, att) in enumerate(zip(self.fine, self.attention)):
            query = previous_h
            if self.config.stacked and previous_attended is not None:
                query = previous_h + previous_attended  # eq 8
            g, alpha = att(ctx[f"keys{i}"], ctx[f"values{i}"], ctx["mask"], query)
            h_i, c_i = cell(torch.cat([g, previous_h, y], 1), (state[2 + 2 * i], state[3 + 2 * i]))
            new_state += [h_i, c_i]
            logits.append(self.outputs[i + 1](self.dropout(h_i)))
            alphas.append(alpha)
            previous_h, previous_attended = h_i, g
        return logits, tuple(new_state), alphas

    def step(self, words: Tensor, state: State, ctx: Context):
        logits, state, alphas = self.stage_step(words, state, ctx)
        return logits[self.head], state, alphas[max(self.head - 1, 0)]

    def forward(self, ctx: Context, captions: Tensor, feed: WordFeed | None = None) -> DecoderOutput:
        state = self.init_state(ctx)
        per_step = []
        for t in range(captions.shape[1] - 1):
            words = captions[:, t]
            if t > 0 and feed is not None:
                words = feed(words, per_step[-1][0][self.head])
            logits, state, alphas = self.stage_step(words, state, ctx)
            per_step.append((logits, alphas))
        stage_logits = torch.stack([torch.stack([s[0][i] for s in per_step], 1)
                                    for i in range(self.stages)])  # [stages, N, T, V]
        stage_alphas = torch.stack([torch.stack([s[1][i] for s in per_step], 1)
                                    for i in range(self.config.fine_stages)])  # [Nf, N, T, L]
        return DecoderOutput(stage_logits[self.head], stage_alphas[max(self.head - 1, 0)],
                             {"stage_logits": stage_logits, "stage_alphas": stage_alphas})

    def loss_terms(self, output: DecoderOutput, targets: Tensor, target_mask: Tensor,
                   loc_mask: Tensor) -> LossTerms:
        """Intermediate supervision: the cross-entropy of every stage but the head (eq 10), summed
        over tokens."""
        terms = super().loss_terms(output, targets, target_mask, loc_mask)
        losses = [F.cross_entropy(logits.transpose(1, 2).float(), targets, ignore_index=0,
                                  reduction="sum")
                  for i, logits in enumerate(output.extras["stage_logits"]) if i != self.head]
        terms.summed = terms.summed + torch.stack(losses).sum()
        return terms
