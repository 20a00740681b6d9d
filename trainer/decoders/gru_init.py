"""A GRU whose initial state is the projected image feature (the GRU baseline report).

``h_0 = W_I mean(v)``: the image enters only through the initial state, and
the GRU's update gate keeps gradients from vanishing along the caption.

The cell: ``cell: report`` is the report's own equations (trainer/modules/report_gru.py:
the relevance gate applied to c_{t-1} before the candidate's product); ``cell: torch``
(the default, kept for runs made before the report's cell) is ``nn.GRUCell``, which applies
it after. The paper blocks (configs/coco/gru_baseline/) ask for ``report``. Either cell takes
the words' share of its products ahead of the recurrence (trainer/modules/gru.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import Tensor, nn

from trainer.decoders import DECODERS
from trainer.decoders.base import Context, Decoder, DecoderConfig, State, per_row
from trainer.modules.dropout import Dropout
from trainer.modules.gru import GRUCell
from trainer.modules.pooling import masked_mean
from trainer.modules.report_gru import ReportGRUCell


@dataclass
class GRUInitConfig(DecoderConfig):
    embed: int = 512
    hidden: int = 512
    dropout: float = 0.5
    cell: Literal["torch", "report"] = "torch"  # nn.GRUCell, or the report's equations


@DECODERS.register("gru_init")
class GRUInit(Decoder):
    """GRU whose initial state is the projected mean image feature (the GRU baseline)."""

    Config = GRUInitConfig
    has_attention = False

    def __init__(self, config: GRUInitConfig, vocab_size: int, feature_dim: int):
        super().__init__(config, vocab_size, feature_dim)
        self.init_proj = nn.Linear(feature_dim, config.hidden)
        self.word_embed = nn.Embedding(vocab_size, config.embed)
        cell = ReportGRUCell if config.cell == "report" else GRUCell
        self.gru = cell(config.embed, config.hidden)
        self.dropout = Dropout(config.dropout)
        self.out = nn.Linear(config.hidden, vocab_size)

    def encode(self, feats: Tensor, mask: Tensor) -> Context:
        return {"h0": self.init_proj(masked_mean(feats, mask))}  # [B, H]

    def init_state(self, ctx: Context, rows: int) -> State:
        return (per_row(ctx["h0"], rows),)

    def embed_words(self, words: Tensor) -> Tensor:
        """The words' share of the GRU's gates, [...] -> [..., 3H]."""
        return self.gru.project(self.dropout(self.word_embed(words)))

    def step_hidden(self, share: Tensor, state: State, ctx: Context):
        h = self.gru.step(share, state[0])  # [N, H]
        return h, (h,), None

    def recur(self, inputs: Tensor, state: State, ctx: Context):
        """The steps with the weights they read taken once (trainer/modules/gru.py)."""
        return self.gru.steps(inputs, state[0]), None

    def readout_features(self, hidden: Tensor) -> Tensor:
        return self.dropout(hidden)  # then self.out
