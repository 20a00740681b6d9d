"""Several trained decoders decoding as one: each step's next-word distribution is the mean of
theirs.

    p(w | y_<t, image) = 1/M sum_i p_i(w | y_<t, image)        logits = log of that

the rule of self-critical.pytorch's ``AttEnsemble`` (the mean of the members' probabilities,
not of their log-probabilities or logits, so a word one member rules out is not ruled out by
the ensemble). :class:`Ensemble` is a :class:`~trainer.decoders.base.Decoder`: its ``encode``,
``init_state`` and ``step`` are the members' side by side, and its step's "logits" are the log
of the mean distribution, already normalised. So every search of trainer/decoding/
(greedy, beam, diverse, sampling, every rule) decodes an ensemble
unchanged: a temperature tempers the mean distribution, and the recorded log-probabilities are
the ensemble's.

The members must share a vocabulary and read the same features (trainer/evaluation/ensembles.py
refuses runs that do not); their decoder types may differ (top_down beside a transformer).
An ensemble draws no attention: its step gives none, since no member's attention is its own.
An ensemble of one is that decoder: its logits pass through untouched, so every search gives
its captions and scores bit for bit.
"""

from __future__ import annotations

import math
from typing import Sequence, cast

import torch
from torch import Tensor, nn

from trainer.decoders.base import Context, Decoder, State

SEPARATOR = "/"  # a member's context key: "<member>/<its key>"


def mean_probability_logits(logits: Sequence[Tensor]) -> Tensor:
    """log(1/M sum_i softmax(logits_i)) [N, V] of M members' logits [N, V], computed as a
    log-sum-exp of their log-softmax (no probability underflows to 0 first)."""
    dtype = torch.promote_types(logits[0].dtype, torch.float32)  # float64 members stay float64
    logp = torch.stack([torch.log_softmax(x.to(dtype), -1) for x in logits])  # [M, N, V]
    return torch.logsumexp(logp, 0) - math.log(len(logits))


class Ensemble(Decoder):
    """The members' steps side by side, their distributions averaged (the module docstring)."""

    has_attention = False

    def __init__(self, members: Sequence[Decoder]):
        if not members:
            raise ValueError("an ensemble needs at least one decoder")
        sizes = {m.vocab_size for m in members}
        if len(sizes) > 1:
            raise ValueError(f"an ensemble's members share one vocabulary; sizes {sorted(sizes)}")
        super().__init__(None, members[0].vocab_size, members[0].feature_dim)
        self.members = nn.ModuleList(members)
        self.state_lengths: list[int] = []  # each member's state tuple, as init_state made it

    @property
    def decoders(self) -> list[Decoder]:
        return cast("list[Decoder]", list(self.members))

    def encode(self, feats: Tensor, mask: Tensor) -> Context:
        """Each member's context under its own prefix: one dict whose tensors all lead with
        the image, so a search's selection of images applies to every member's."""
        return {f"{i}{SEPARATOR}{key}": value
                for i, member in enumerate(self.decoders)
                for key, value in member.encode(feats, mask).items()}

    def member_context(self, ctx: Context, i: int) -> Context:
        prefix = f"{i}{SEPARATOR}"
        return {key[len(prefix):]: value for key, value in ctx.items() if key.startswith(prefix)}

    def init_state(self, ctx: Context, rows: int) -> State:
        """The members' states, one flat tuple (a search reorders beams by selecting rows of
        every tensor of it); :attr:`state_lengths` says where each member's begins."""
        states = [m.init_state(self.member_context(ctx, i), rows)
                  for i, m in enumerate(self.decoders)]
        self.state_lengths = [len(s) for s in states]
        return tuple(t for s in states for t in s)

    def with_room(self, state: State, words: int) -> State:
        """Each member's state made ready for ``words`` steps (its tensors may change count)."""
        states = [m.with_room(own, words) for m, own in zip(self.decoders, self.split_state(state))]
        self.state_lengths = [len(s) for s in states]
        return tuple(t for s in states for t in s)

    def split_state(self, state: State) -> list[State]:
        parts, start = [], 0
        for length in self.state_lengths:
            parts.append(tuple(state[start:start + length]))
            start += length
        if start != len(state):
            raise ValueError(f"an ensemble state of {len(state)} tensors; its members' "
                             f"init_state made {start}")
        return parts

    def step(self, words: Tensor, state: State,
             ctx: Context) -> tuple[Tensor, State, Tensor | None]:
        """words [N] -> log of the members' mean distribution [N, V] (a single member's own
        logits), the members' next states, no attention."""
        logits, states = [], []
        for i, (member, own) in enumerate(zip(self.decoders, self.split_state(state))):
            member_logits, member_state, _ = member.step(words, own, self.member_context(ctx, i))
            if len(member_state) != len(own):
                raise ValueError(f"ensemble member {i}: its state changed from {len(own)} to "
                                 f"{len(member_state)} tensors in a step")
            logits.append(member_logits)
            states.append(member_state)
        combined = logits[0] if len(logits) == 1 else mean_probability_logits(logits)
        return combined, tuple(t for s in states for t in s), None
