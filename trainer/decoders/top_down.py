"""Bottom-up and top-down attention (Anderson et al. 2018), the two-LSTM decoder.

    x1_t = [h2_{t-1}, v_bar, W_e Pi_t]                  attention LSTM input (2)
    h1_t = LSTM_1(x1_t, h1_{t-1})
    a_it = w_a^T tanh(W_va v_i + W_ha h1_t)               (3)
    alpha_t = softmax(a_t),  v_hat_t = sum_i alpha_it v_i   (4), (5)
    h2_t = LSTM_2([v_hat_t, h1_t], h2_{t-1})              language LSTM
    p(y_t) = softmax(W_p h2_t + b_p)

The settings after ``feature_embed`` give poojahira's implementation, which the bottom-up/top-down
replication (El Baz 2020) ran: ReLU in (3) with dropout on its output (``att_activation: relu``,
``att_dropout: 0.5``), weight-normalised W_va, W_ha, w_a and W_p (``weight_norm``), and dropout
on h2 alone, not on W_e Pi_t (``word_dropout: false``). Their defaults are Anderson et al.'s
equations above, the decoder as it was before them.

Three more give self-critical.pytorch's UpDownModel (captioning/models/AttModel.py there), whose
checkpoints ``capstack import-checkpoint rtl`` reads (trainer/imports/rtl.py):
``word_activation: relu`` (its ``embed``: W_e Pi_t through a ReLU, then dropout),
``mean_embed: N`` (its ``fc_embed``: v_bar = ReLU(W_m mean_i v_i) of size N, a layer of its own
on the raw features' mean, where by default v_bar is the mean of the embedded v_i) and
``embed_dropout: true`` (dropout after the region and mean embeddings, as its ``att_embed`` and
``fc_embed`` end). With ``feature_embed`` and ``mean_embed`` at its ``rnn_size`` these are its
equations; its attention's two biases are one here (W_va's, where W_ha's is added) and w_a's
bias, which the softmax ignores, is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm

from trainer.decoders import DECODERS
from trainer.decoders.base import Context, Decoder, DecoderConfig, State, per_row
from trainer.modules.attention import AdditiveAttention
from trainer.modules.dropout import Dropout
from trainer.modules.feature_embed import feature_embedding
from trainer.modules.parts_lstm import PartsLSTMCell
from trainer.modules.pooling import masked_mean


@dataclass
class TopDownConfig(DecoderConfig):
    embed: int = 512
    hidden: int = 512
    att_hidden: int = 512
    dropout: float = 0.5
    feature_embed: int = 0  # > 0: v_i -> ReLU(W v_i) of this size first (modules/feature_embed.py)
    att_activation: Literal["tanh", "relu"] = "tanh"  # in (3): Anderson et al.'s tanh, or ReLU
    att_dropout: float = 0.0  # on (3)'s activated hidden layer, before w_a
    weight_norm: bool = False  # W_va, W_ha, w_a and W_p as g * v / ||v||, per output row
    word_dropout: bool = True  # dropout on W_e Pi_t too, not only on h2 before W_p
    word_activation: Literal["none", "relu"] = "none"  # relu: ReLU(W_e Pi_t), as sc.pytorch
    mean_embed: int = 0  # > 0: v_bar = ReLU(W_m mean_i v_i) of this size, from the raw features
    embed_dropout: bool = False  # dropout after the feature and mean embeddings (sc.pytorch)


@DECODERS.register("top_down")
class TopDown(Decoder):
    """Bottom-up/top-down: an attention LSTM on [h2, v_bar, W_e Pi], attention, a language LSTM.

    The attention LSTM's products of v_bar (once per image, in ``encode``) and of the
    embedded words (for all steps at once under teacher forcing, ``embed_words``) are
    taken outside the step, which multiplies only [h2, h1] (modules/parts_lstm.py). The
    language LSTM reads v_hat_t only through its gates' product W v_hat_t, and
    W sum_i alpha_it v_i = sum_i alpha_it (W v_i): each region's product is taken once per
    image, in ``encode``, and a step weighs those, L x 4h numbers a row, where W v_hat_t
    would be D x 4h products (36 against 512 at the papers' sizes). The bias rides along in
    each region's product: the weights alpha_it sum to one.
    """

    Config = TopDownConfig

    def __init__(self, config: TopDownConfig, vocab_size: int, feature_dim: int):
        super().__init__(config, vocab_size, feature_dim)
        e, h = config.embed, config.hidden
        raw_dim = feature_dim
        self.feature_embed, feature_dim = feature_embedding(raw_dim, config.feature_embed)
        # W_m, or none: v_bar is then the mean of the (embedded) regions
        self.mean_embed, mean_dim = feature_embedding(raw_dim, config.mean_embed) \
            if config.mean_embed else (None, feature_dim)
        self.word_embed = nn.Embedding(vocab_size, e)  # W_e
        self.attention_lstm = PartsLSTMCell({"h2": h, "mean": mean_dim, "word": e}, ["h2"], h)
        self.attention = AdditiveAttention(feature_dim, h, config.att_hidden,
                                           config.att_activation, config.att_dropout)
        self.language_lstm = PartsLSTMCell({"attended": feature_dim, "h1": h}, ["h1"], h)
        self.dropout = Dropout(config.dropout)
        self.out = nn.Linear(h, vocab_size)  # W_p
        if config.weight_norm:
            for layer in (self.attention.feature_proj, self.attention.query_proj,
                          self.attention.score, self.out):
                weight_norm(layer)

    def encode(self, feats: Tensor, mask: Tensor) -> Context:
        if self.mean_embed is not None:  # from the raw features, before their embedding
            mean = self.embedded(self.mean_embed, masked_mean(feats, mask))
        if self.feature_embed is not None:
            feats = self.embedded(self.feature_embed, feats)
        if self.mean_embed is None:
            mean = masked_mean(feats, mask)
        return {"feats": feats, "mask": mask, "projected": self.attention.project(feats),
                "mean": mean, "mean_gates": self.attention_lstm.project("mean", mean, True),
                "region_gates": self.language_lstm.project("attended", feats, True)}

    def embedded(self, embed: nn.Module, x: Tensor) -> Tensor:
        x = embed(x)
        return self.dropout(x) if self.config.embed_dropout else x

    def init_state(self, ctx: Context, rows: int) -> State:
        zeros = ctx["mean"].new_zeros(rows, self.config.hidden)
        return zeros, zeros, zeros, zeros  # h1, c1, h2, c2

    def embed_words(self, words: Tensor) -> Tensor:
        """The words' share of the attention LSTM's gates, W_e Pi_t's product:
        [...] -> [..., 4h]."""
        embedded = self.word_embed(words)
        if self.config.word_activation == "relu":
            embedded = torch.relu(embedded)
        if self.config.word_dropout:
            embedded = self.dropout(embedded)
        return self.attention_lstm.project("word", embedded)

    def step_hidden(self, word_gates: Tensor, state: State, ctx: Context):
        h1, c1, h2, c2 = state
        ahead = word_gates + per_row(ctx["mean_gates"], h2.shape[0])
        h1, c1 = self.attention_lstm([h2], ahead, (h1, c1))
        # the language LSTM's gates from v_hat_t, [N, 4h]: the attention's weights on W v_i + b
        attended_gates, alpha = self.attention(ctx["projected"], ctx["region_gates"],
                                               ctx["mask"], h1)
        h2, c2 = self.language_lstm([h1], attended_gates, (h2, c2))
        return h2, (h1, c1, h2, c2), alpha

    def readout_features(self, hidden: Tensor) -> Tensor:
        return self.dropout(hidden)  # p(y_t) = softmax(W_p h2_t + b_p), W_p: self.out
