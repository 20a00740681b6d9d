"""Show, Attend and Tell (Xu et al. 2015), deterministic "soft" attention.

Per step, with h_{t-1} the previous hidden state:

    e_ti = f_att(a_i, h_{t-1}),  alpha_t = softmax(e_t)
    beta_t = sigmoid(f_beta(h_{t-1}))             gating scalar
    z_t = beta_t * sum_i alpha_ti a_i             expected context
    h_t, c_t = LSTM([E y_{t-1}; z_t], h_{t-1}, c_{t-1})
    p(y_t) ~ exp(L_o(E y_{t-1} + L_h h_t + L_z z_t))      deep output layer

with c_0 = f_init,c(mean a), h_0 = f_init,h(mean a), and the doubly stochastic
penalty  lambda * sum_i (1 - sum_t alpha_ti)^2  added to the loss.

Teacher forcing takes the words' products (E y and its share of the LSTM's gates) for every
step ahead, runs the attention and the LSTM step by step, and the deep output layer's L_h,
L_z and L_o on every step at once (:meth:`SoftAttention.readout`); only the LSTM's
product of [z_t, h_{t-1}] stays in the step (trainer/modules/parts_lstm.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from trainer.decoders import DECODERS
from trainer.decoders.base import (Context, Decoder, DecoderConfig, DecoderOutput, LossTerms, State,
                                   per_row)
from trainer.modules.attention import AdditiveAttention, doubly_stochastic_penalty
from trainer.modules.dropout import Dropout
from trainer.modules.parts_lstm import PartsLSTMCell
from trainer.modules.pooling import masked_mean


@dataclass
class SoftAttentionConfig(DecoderConfig):
    embed: int = 512
    hidden: int = 512
    att_hidden: int = 512
    dropout: float = 0.5
    doubly_stochastic: float = 1.0  # lambda, against a caption's -log P(y|x) (the paper's)
    gate: bool = True  # the gating scalar beta


@DECODERS.register("soft_attention")
class SoftAttention(Decoder):
    """Show-Attend-Tell soft attention: f_att(h_{t-1}), gate beta, deep output, doubly stoch."""

    Config = SoftAttentionConfig

    def __init__(self, config: SoftAttentionConfig, vocab_size: int, feature_dim: int):
        super().__init__(config, vocab_size, feature_dim)
        e, h = config.embed, config.hidden
        self.attention = AdditiveAttention(feature_dim, h, config.att_hidden)
        self.init_h = nn.Sequential(nn.Linear(feature_dim, h), nn.Tanh())  # f_init,h
        self.init_c = nn.Sequential(nn.Linear(feature_dim, h), nn.Tanh())  # f_init,c
        self.gate = nn.Linear(h, 1) if config.gate else None  # f_beta
        self.word_embed = nn.Embedding(vocab_size, e)  # E
        self.lstm = PartsLSTMCell({"word": e, "z": feature_dim}, ["z"], h)  # on [E y; z]
        self.out_h = nn.Linear(h, e)  # L_h
        self.out_z = nn.Linear(feature_dim, e)  # L_z
        self.out = nn.Linear(e, vocab_size)  # L_o
        self.dropout = Dropout(config.dropout)

    def encode(self, feats: Tensor, mask: Tensor) -> Context:
        return {"feats": feats, "mask": mask, "projected": self.attention.project(feats),
                "mean": masked_mean(feats, mask)}

    def init_state(self, ctx: Context, rows: int) -> State:
        return per_row(self.init_h(ctx["mean"]), rows), per_row(self.init_c(ctx["mean"]), rows)

    def attend(self, h: Tensor, ctx: Context) -> tuple[Tensor, Tensor, Tensor]:
        """-> the expected context [N, D], alpha [N, L] and the gate beta [N, 1] (1 without)."""
        context, alpha = self.attention(ctx["projected"], ctx["feats"], ctx["mask"], h)
        beta = torch.sigmoid(self.gate(h)) if self.gate is not None else h.new_ones(h.shape[0], 1)
        return context, alpha, beta

    def embed_words(self, words: Tensor) -> Tensor:
        """[...] -> [..., 4h + E]: E y's share of the LSTM's gates (dropout on E y there, with
        the LSTM's bias), then E y itself, the deep output's first term."""
        embedded = self.word_embed(words)  # E y_{t-1}
        return torch.cat([self.lstm.project("word", self.dropout(embedded), with_bias=True),
                          embedded], -1)

    def advance(self, inputs: Tensor, state: State, z: Tensor) -> tuple[Tensor, State]:
        """The LSTM step given :meth:`embed_words`' inputs and the context z [N, D] -> what the
        deep output reads, [E y, h_t, z_t] [N, E + H + D], and the state."""
        word_gates, embedded = inputs.split([4 * self.config.hidden, self.config.embed], -1)
        h, c = self.lstm([z], word_gates, state)
        return torch.cat([embedded, h, z], -1), (h, c)

    def step_hidden(self, inputs: Tensor, state: State, ctx: Context):
        context, alpha, beta = self.attend(state[0], ctx)
        hidden, state = self.advance(inputs, state, beta * context)  # z = beta * sum_i alpha_i a_i
        return hidden, state, alpha

    def readout_features(self, hidden: Tensor) -> Tensor:
        """The deep output layer's input, E y + L_h h + L_z z, on any leading shape (then
        L_o, ``self.out``)."""
        embedded, h, z = hidden.split([self.config.embed, self.config.hidden, self.feature_dim], -1)
        return self.dropout(embedded + self.out_h(h) + self.out_z(z))

    def loss_terms(self, output: DecoderOutput, targets: Tensor, target_mask: Tensor,
                   loc_mask: Tensor) -> LossTerms:
        """lambda * sum_i (1 - sum_t alpha_ti)^2 over valid steps and locations, per caption."""
        terms = super().loss_terms(output, targets, target_mask, loc_mask)
        if self.config.doubly_stochastic:
            assert output.alphas is not None, "teacher forcing gives this decoder's attention"
            penalty = doubly_stochastic_penalty(output.alphas, target_mask, loc_mask)  # [N]
            terms.summed = terms.summed + self.config.doubly_stochastic * penalty.sum()
        return terms
