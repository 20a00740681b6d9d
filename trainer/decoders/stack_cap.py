"""Stack-Cap (Gu et al. 2018): a coarse decoder, then Nf fine decoders with stacked attention.

Per step t, with y_{t-1} the previous word's embedding and f(V) the mean feature:

    o0_t, h0_t = LSTM_coarse([f(V); h^{Nf}_{t-1}; y_{t-1}], h0_{t-1})          eqs 1-2
    for i = 1..Nf:
        hhat^{i-1}_t = h^{i-1}_t + sum_n alpha^{i-1,n}_t (W^{i-1}_va V_n + b)  eq 8 (alpha^0 = 0)
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
Teacher forcing takes the words' products with every LSTM's weights for all steps ahead, and
f(V)'s with the coarse LSTM's once per image (trainer/modules/parts_lstm.py), runs the
recurrence alone, then every stage's output layer on all steps at once.
Decoding follows the stage in ``head`` (the last by default): each stage's own
caption comes from decoding with that stage as the head. ``stack_cap_star``
(its own file) is the same without the stacking: each stage attends with
h^{i-1}_t alone (hhat = h).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainer.decoders import DECODERS
from trainer.decoders.base import (Context, DecoderConfig, DecoderOutput, LossTerms, StagedDecoder,
                                   State, WordFeed, per_row)
from trainer.modules.attention import attend, grouped_queries
from trainer.modules.dropout import Dropout
from trainer.modules.feature_embed import feature_embedding
from trainer.modules.parts_lstm import PartsLSTMCell
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
        """keys [B, L, A], values [B, L, H], mask [B, L], the rows' query [N, H] (N = B * k,
        modules/attention.py) -> g [N, H], alpha [N, L]."""
        queries = grouped_queries(self.query(query), keys.shape[0])  # [B, k, 1, A]
        scores = self.score(torch.tanh_(keys[:, None] + queries)).squeeze(-1)  # [B, k, L]
        return attend(scores, values, mask)


@DECODERS.register("stack_cap")
class StackCap(StagedDecoder):
    """Stack-Cap: a coarse LSTM, then Nf fine LSTMs with stacked attention, every stage
    supervised."""

    Config = StackCapConfig

    def __init__(self, config: StackCapConfig, vocab_size: int, feature_dim: int):
        super().__init__(config, vocab_size, feature_dim)
        e, h, nf = config.embed, config.hidden, config.fine_stages
        self.feature_embed, feature_dim = feature_embedding(feature_dim, config.feature_embed)
        self.word_embed = nn.Embedding(vocab_size, e)
        # on [f(V); h^{Nf}_{t-1}; y_{t-1}] and [g^i_t; h^{i-1}_t; y_{t-1}] (eqs 2 and 4)
        self.coarse = PartsLSTMCell({"mean": feature_dim, "h_last": h, "word": e}, ["h_last"], h)
        self.fine = nn.ModuleList(PartsLSTMCell({"g": h, "h_below": h, "word": e},
                                                ["g", "h_below"], h) for _ in range(nf))
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
        mean = masked_mean(feats, mask)
        ctx = {"mask": mask, "mean": mean, "mean_gates": self.coarse.project("mean", mean, True)}
        for i, att in enumerate(cast(Iterable[FineAttention], self.attention)):
            ctx[f"keys{i}"], ctx[f"values{i}"] = att.key(feats), att.value(feats)
        return ctx

    def init_state(self, ctx: Context, rows: int) -> State:
        zeros = ctx["mean"].new_zeros(rows, self.config.hidden)
        return (zeros,) * (2 * self.stages)  # (h0, c0, h1, c1, ...)

    def embed_words(self, words: Tensor) -> Tensor:
        """y_{t-1}'s share of every stage's LSTM gates (one dropout mask for all), [...] ->
        [..., stages * 4h], coarse first; the fine stages' with their biases."""
        y = self.dropout(self.word_embed(words))
        fine = cast(Iterable[PartsLSTMCell], self.fine)
        return torch.cat([self.coarse.project("word", y)]
                         + [cell.project("word", y, with_bias=True) for cell in fine], -1)

    def step_hidden(self, word_gates: Tensor, state: State, ctx: Context):
        """-> every stage's h [N, stages, H], the next state, every fine alpha [N, Nf, L]."""
        stage_gates = word_gates.chunk(self.stages, -1)
        h_last = state[-2]  # h^{Nf}_{t-1}
        ahead = stage_gates[0] + per_row(ctx["mean_gates"], h_last.shape[0])
        h, c = self.coarse([h_last], ahead, (state[0], state[1]))
        new_state, hiddens, alphas = [h, c], [h], []
        previous_h, previous_attended = h, None
        for i, (cell, att) in enumerate(zip(self.fine, self.attention)):
            query = previous_h
            if self.config.stacked and previous_attended is not None:
                query = previous_h + previous_attended  # eq 8
            g, alpha = att(ctx[f"keys{i}"], ctx[f"values{i}"], ctx["mask"], query)
            h_i, c_i = cell([g, previous_h], stage_gates[i + 1],
                            (state[2 + 2 * i], state[3 + 2 * i]))
            new_state += [h_i, c_i]
            hiddens.append(h_i)
            alphas.append(alpha)
            previous_h, previous_attended = h_i, g
        return torch.stack(hiddens, 1), tuple(new_state), torch.stack(alphas, 1)

    def readout(self, hidden: Tensor) -> Tensor:
        """The head stage's p(y_t): [..., stages, H] -> [..., V]."""
        return self.outputs[self.head](self.dropout(hidden[..., self.head, :]))

    def stage_logits(self, hidden: Tensor) -> Tensor:
        """Every stage's p(y_t): [..., stages, H] -> [stages, ..., V]."""
        return torch.stack([out(self.dropout(h))
                            for out, h in zip(self.outputs, hidden.unbind(-2))])

    def step(self, words: Tensor, state: State, ctx: Context):
        hidden, state, alphas = self.step_hidden(self.embed_words(words), state, ctx)
        return self.readout(hidden), state, alphas[:, max(self.head - 1, 0)]

    def forward(self, ctx: Context, captions: Tensor,
                feed: WordFeed | None = None) -> DecoderOutput:
        """Every stage's logits and alphas; without a feed, every stage's output layer on all
        steps at once."""
        if feed is None:
            hiddens, alphas = self.recur(self.embed_words(captions[:, :-1].t()),
                                         self.init_state(ctx, captions.shape[0]), ctx)
            stage_logits = self.stage_logits(hiddens)  # [stages, N, T, V]
        else:
            stage_logits, alphas = self.fed_forward(ctx, captions, feed)
        assert alphas is not None, "Stack-Cap's fine stages attend"
        stage_alphas = alphas.movedim(2, 0)  # [Nf, N, T, L]
        return DecoderOutput(stage_logits[self.head], stage_alphas[max(self.head - 1, 0)],
                             {"stage_logits": stage_logits, "stage_alphas": stage_alphas})

    def fed_forward(self, ctx: Context, captions: Tensor, feed: WordFeed) -> tuple[Tensor, Tensor]:
        """Scheduled sampling, a step at a time (the feed reads the head's previous logits) ->
        stage logits [stages, N, T, V], alphas [N, T, Nf, L]."""
        state = self.init_state(ctx, captions.shape[0])
        logits: list[Tensor] = []
        alphas: list[Tensor] = []
        for t in range(captions.shape[1] - 1):
            words = captions[:, t] if t == 0 else feed(captions[:, t], logits[-1][self.head])
            hidden, state, alpha = self.step_hidden(self.embed_words(words), state, ctx)
            logits.append(self.stage_logits(hidden))
            alphas.append(alpha)
        return torch.stack(logits, 2), torch.stack(alphas, 1)

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
