"""Show and Tell (Vinyals et al. 2015): an LSTM whose first input is the image.

The mean-pooled feature, embedded like a word, is fed once before ``<bos>``
(step t = -1); the words follow. Stack-Cap's "LSTM" baseline. With ``image_input:
every_step`` the image embedding is instead concatenated to every word's, as Stack-Cap's
coarse LSTM reads the global feature (its eqs 1-2), and the state starts at zero.

Teacher forcing runs the nn.LSTM over every word of the caption in one call, then the output
layer on every step at once; decoding steps the same LSTM a word at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainer.decoders import DECODERS
from trainer.decoders.base import Context, Decoder, DecoderConfig, State, per_row
from trainer.modules.dropout import Dropout
from trainer.modules.pooling import masked_mean


@dataclass
class ShowTellConfig(DecoderConfig):
    embed: int = 512
    hidden: int = 512
    layers: int = 1
    dropout: float = 0.5
    image_norm: bool = True  # batch-normalise the image embedding (im2txt's is a plain linear map)
    # first: once, before <bos> (Vinyals et al.); every_step: beside every word (Stack-Cap eq 2)
    image_input: Literal["first", "every_step"] = "first"


class ImageBatchNorm(nn.BatchNorm1d):
    """im2txt's batch norm of the image embedding. A training batch of one image (an epoch's
    last, or a DDP rank's part of a small one) has no statistics of its own: it is normalised
    with the running ones, as in evaluation. Under DDP each rank normalises by its own images
    (the usual BatchNorm behaviour without SyncBatchNorm)."""

    def forward(self, x: Tensor) -> Tensor:
        if self.training and x.shape[0] == 1:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                training=False, eps=self.eps)
        return super().forward(x)


@DECODERS.register("show_tell")
class ShowTell(Decoder):
    """One-layer LSTM fed the mean-pooled image feature first (Stack-Cap's LSTM baseline)."""

    Config = ShowTellConfig
    has_attention = False

    def __init__(self, config: ShowTellConfig, vocab_size: int, feature_dim: int):
        super().__init__(config, vocab_size, feature_dim)
        self.image_embed = nn.Sequential(
            nn.Linear(feature_dim, config.embed),
            ImageBatchNorm(config.embed) if config.image_norm else nn.Identity())
        self.word_embed = nn.Embedding(vocab_size, config.embed)
        every_step = config.image_input == "every_step"
        self.lstm = nn.LSTM(config.embed * (2 if every_step else 1), config.hidden, config.layers,
                            batch_first=True,
                            dropout=config.dropout if config.layers > 1 else 0.0)
        self.dropout = Dropout(config.dropout)
        self.out = nn.Linear(config.hidden, vocab_size)

    def encode(self, feats: Tensor, mask: Tensor) -> Context:
        return {"image": self.image_embed(masked_mean(feats, mask))}  # [B, E]

    def init_state(self, ctx: Context, rows: int) -> State:
        if self.config.image_input == "every_step":
            zeros = ctx["image"].new_zeros(rows, self.config.layers, self.config.hidden)
            return zeros, zeros
        image = self.dropout(per_row(ctx["image"], rows))  # a dropout mask per row
        _, (h, c) = self.lstm(image[:, None])  # t = -1: the image
        return h.transpose(0, 1), c.transpose(0, 1)  # [N, layers, H] each

    def with_image(self, embedded: Tensor, ctx: Context) -> Tensor:
        """``embedded`` words [N, (T,) E], with the image's embedding beside each when it is
        read at every step (a dropout mask per row and step)."""
        if self.config.image_input != "every_step":
            return embedded
        image = per_row(ctx["image"], embedded.shape[0])
        if embedded.dim() == 3:
            image = image[:, None].expand(-1, embedded.shape[1], -1)
        return torch.cat([embedded, self.dropout(image)], -1)

    def embed_words(self, words: Tensor) -> Tensor:
        return self.dropout(self.word_embed(words))

    def step_hidden(self, embedded: Tensor, state: State, ctx: Context):
        out, state = self.run_lstm(self.with_image(embedded, ctx)[:, None], state)
        return out[:, 0], state, None

    def recur(self, inputs: Tensor, state: State, ctx: Context):
        """nn.LSTM over the whole caption at once (on a CPU it multiplies every step's inputs by
        the first layer's weights in one product, each layer in turn)."""
        return self.run_lstm(self.with_image(inputs.transpose(0, 1), ctx), state)[0], None

    def run_lstm(self, inputs: Tensor, state: State) -> tuple[Tensor, State]:
        """inputs [N, T, E], the batch-first state ([N, layers, H] each) -> out [N, T, H], the
        state after the last step."""
        h, c = (s.transpose(0, 1).contiguous() for s in state)
        out, (h, c) = self.lstm(inputs, (h, c))
        return out, (h.transpose(0, 1), c.transpose(0, 1))

    def readout_features(self, hidden: Tensor) -> Tensor:
        return self.dropout(hidden)  # then self.out
