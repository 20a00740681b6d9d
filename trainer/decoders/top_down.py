"""Bottom-up and top-down attention (Anderson et al. 2018), the two-LSTM decoder.

    x1_t = [h2_{t-1}, v_bar, W_e Pi_t]                  attention LSTM input (2)
    h1_t = LSTM_1(x1_t, h1_{t-1})
    a_it = w_a^T tanh(W_va v_i + W_ha h1_t)               (3)
    alpha_t = softmax(a_t),  v_hat_t = sum_i alpha_it v_i   (4), (5)
    h2_t = LSTM_2([v_hat_t, h1_t], h2_{t-1})              language LSTM
    p(y_t) = softmax(W_p h2_t + b_p)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from trainer.decoders import DECODERS
from trainer.decoders.base import Context, Decoder, DecoderConfig, State
from trainer.modules.attention import AdditiveAttention
from trainer.modules.feature_embed import feature_embedding
from trainer.modules.pooling import masked_mean


@dataclass
class TopDownConfig(DecoderConfig):
    embed: int = 512
    hidden: int = 512
    att_hidden: int = 512
    dropout: float = 0.5
    feature_embed: int = 0  # > 0: v_i -> ReLU(W v_i) of this size first (modules/feature_embed.py)


@DECODERS.register("top_down")
class TopDown(Decoder):
    """Bottom-up/top-down: an attention LSTM on [h2, v_bar, W_e Pi], attention, a language LSTM."""

    Config = TopDownConfig

    def __init__(self, config: TopDownConfig, vocab_size: int, feature_dim: int):
        super().__init__(config, vocab_size, feature_dim)
        e, h = config.embed, config.hidden
        self.feature_embed, feature_dim = feature_embedding(feature_dim, config.feature_embed)
        self.word_embed = nn.Embedding(vocab_size, e)  # W_e
        self.attention_lstm = nn.LSTMCell(h + feature_dim + e, h)
        self.attention = AdditiveAttention(feature_dim, h, config.att_hidden)
        self.language_lstm = nn.LSTMCell(feature_dim + h, h)
        self.dropout = nn.Dropout(config.dropout)
        self.out = nn.Linear(h, vocab_size)  # W_p

    def encode(self, feats: Tensor, mask: Tensor) -> Context:
        if self.feature_embed is not None:
            feats = self.feature_embed(feats)
        return {"feats": feats, "mask": mask, "projected": self.attention.project(feats),
                "mean": masked_mean(feats, mask)}

    def init_state(self, ctx: Context) -> State:
        zeros = ctx["mean"].new_zeros(ctx["mean"].shape[0], self.config.hidden)
        return zeros, zeros, zeros, zeros  # h1, c1, h2, c2

    def step_hidden(self, words: Tensor, state: State, ctx: Context):
        h1, c1, h2, c2 = state
        x1 = torch.cat([h2, ctx["mean"], self.dropout(self.word_embed(words))], 1)
        h1, c1 = self.attention_lstm(x1, (h1, c1))
        attended, alpha = self.attention(ctx["projected"], ctx["feats"], ctx["mask"], h1)
        h2, c2 = self.language_lstm(torch.cat([attended, h1], 1), (h2, c2))
        return h2, (h1, c1, h2, c2), alpha

    def readout(self, hidden: Tensor) -> Tensor:
        return self.out(self.dropout(hidden))  # p(y_t) = softmax(W_p h2_t + b_p)
