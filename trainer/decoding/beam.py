"""Beam search, written once: plain, diverse (groups), length-penalised, under blocking rules.

:func:`beam_search` keeps K hypotheses per image and advances all images x beams as one batch.
Its hooks (:class:`BeamHooks`) change how a step scores and picks, never the loop:

- ``temperature``: hypotheses scored by log_softmax(logits / temperature); the recorded
  log-probabilities stay the model's.
- ``rules``: what may not follow a hypothesis (no repeats, trigram blocking, bad endings:
  trainer/decoding/rules.py), -inf before the pick.
- ``groups``, ``diversity``: diverse beam search (Vijayakumar et al. 2018): rows are
  image-major, then group, then the group's K / G beams; each group picks its K / G best
  continuations in turn, its log-probabilities less ``diversity`` times the count of each word
  the earlier groups of its image picked at this step (the first group's is plain beam search).
- ``penalty``: how hypotheses of different lengths rank (:class:`~trainer.decoding.rules.
  LengthPenalty`), on the score of what they would be after the step.

A hypothesis that emitted ``<eos>`` keeps its beam with its score frozen (it only extends with
``<pad>`` at no cost), so finished and unfinished captions compete on their total, as the
papers' beam search does (K = 1 is greedy decoding). When it stops:

- plain hooks and one caption per image: an image is settled when its best hypothesis has
  finished (the others' scores can only fall), and once half the batch is settled those
  images leave it (their rows of the state, their context), so the batch shrinks as captions
  end without copying the state every step;
- otherwise (a length penalty can lift a longer hypothesis over a finished one; the n best
  need n finished) the search runs until every hypothesis has ended, and returns each image's
  ``n`` best: each group's best in group order, then each group's second, ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from pipeline.core.tokens import BOS_ID, EOS_ID, PAD_ID
from trainer.decoders.base import Context, Decoder, images_of, select
from trainer.decoding.rules import NO_PENALTY, LengthPenalty, Rules
from trainer.decoding.words import Decoded, ending_at, log_softmax_in_place, tempered


@dataclass(frozen=True)
class BeamHooks:
    """What a beam search applies beyond the sum of the model's log-probabilities."""

    penalty: LengthPenalty = NO_PENALTY
    groups: int = 1  # diverse beam search's groups; 1: plain beam search
    diversity: float = 0.0  # what a group pays for each earlier group's same word
    rules: Rules | None = None
    temperature: float = 1.0

    @property
    def plain(self) -> bool:
        return (self.penalty.kind == "none" and self.groups == 1 and self.temperature == 1
                and (self.rules is None or not self.rules.any))


PLAIN = BeamHooks()


def beam_search(decoder: Decoder, ctx: Context, beam_size: int, max_len: int,
                hooks: BeamHooks = PLAIN, n: int = 1) -> Decoded:
    """Each image's ``n`` best captions of ``beam_size`` hypotheses ([B * n, T], an image's
    adjacent, best first) under ``hooks``; with the defaults, the highest-scoring caption
    (sum of log-probabilities)."""
    k, b, g = beam_size, images_of(ctx), hooks.groups
    settles = hooks.plain and n == 1  # an image's search ends with its best hypothesis
    state = decoder.with_room(decoder.init_state(ctx, b * k), max_len + 1)
    device = state[0].device
    images = torch.arange(b, device=device)  # the images in the batch, K rows each
    open_ = torch.ones(b, dtype=torch.bool, device=device)  # not settled yet
    words = torch.full((b * k,), BOS_ID, dtype=torch.long, device=device)
    scores = torch.full((b, g, k // g), float("-inf"), device=device)
    scores[:, :, 0] = 0.0  # every group starts from the one empty caption: keep one
    lengths = torch.zeros(b * k, dtype=torch.long, device=device)  # tokens, <eos> included
    done = torch.zeros(b * k, dtype=torch.bool, device=device)
    history = _History(b * k, device)
    settled: list[tuple | None] = [None] * b
    totals = None  # [b*K, V], each step's hypothesis scores, written in place
    for t in range(max_len + 1):
        logits, state, alpha = decoder.step(words, state, ctx)
        full = log_softmax_in_place(logits.float())  # [m*K, V]: the model's, recorded
        logp = full if hooks.temperature == 1 else \
            torch.log_softmax(tempered(logits.float(), hooks.temperature), 1)
        logp = ending_at(t, max_len, logp)
        if hooks.rules is not None and hooks.rules.any:
            logp = hooks.rules.apply(logp.clone() if logp is full else logp, history.tokens, t,
                                     full)
        logp[done] = _finished_row(logp.shape[1], device)
        if totals is None:
            totals = logp.new_empty(b * k, logp.shape[1])
        grown = lengths + (~done).long()  # each row's length after this step
        rows, words, scores = _chosen(logp, scores, grown, hooks, totals)
        history.extend(rows, words, full[rows, words].masked_fill(done[rows], 0.0), alpha)
        state = select(state, rows)
        lengths, done = grown[rows], done[rows] | (words == EOS_ID)
        if not settles:
            if done.all():
                break
            continue
        m = len(images)
        top = scores.view(m, k).argmax(1)  # [m]
        ended = done.view(m, k).gather(1, top[:, None]).squeeze(1) | (t == max_len)
        for i in (ended & open_).nonzero().squeeze(1).tolist():
            settled[int(images[i])] = history.row(i * k + int(top[i]))
        open_ = open_ & ~ended
        if not open_.any():
            break
        if (~open_).sum() * 2 >= m:  # compact when half the rows are settled: few copies
            kept = open_.nonzero().squeeze(1)
            keep = (kept[:, None] * k + torch.arange(k, device=device)).reshape(-1)
            images, scores, open_ = images[kept], scores[kept], open_[kept]
            words, done, lengths = words[keep], done[keep], lengths[keep]
            state, ctx = select(state, keep), select(ctx, kept)
            history.keep(keep)
    if settles:
        return _stack(cast("list[tuple]", settled))  # every image is settled by max_len
    final = hooks.penalty(scores.reshape(b, k), lengths.view(b, k))
    ranked = _ranked(final.view(b, g, k // g), n)  # [b, n] rows within each image
    return history.rows((torch.arange(b, device=device)[:, None] * k + ranked).reshape(-1))


def _chosen(logp: Tensor, scores: Tensor, grown: Tensor, hooks: BeamHooks,
            totals: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """One step's picks: the rows [m*K] each new hypothesis extends, its word [m*K] and the
    scores [m, G, K/G], from the step's log-probabilities [m*K, V] and the scores so far."""
    m, g, kg = scores.shape
    k, v = g * kg, logp.shape[1]
    first = torch.arange(m, device=logp.device)[:, None] * k
    counts = torch.zeros(m, v, device=logp.device) if g > 1 else None  # earlier groups' words
    rows, words, new_scores = [], [], []
    for j in range(g):
        part = first + j * kg + torch.arange(kg, device=logp.device)  # [m, kg] rows of group j
        if g == 1:  # every row, into the step's buffer: no [m*K, V] copy
            total = torch.add(logp.view(m, kg, v), scores[:, 0, :, None],
                              out=totals[:m * k].view(m, kg, v))
        else:
            lp = logp[part.reshape(-1)].view(m, kg, v)
            if j and hooks.diversity:
                lp = lp - hooks.diversity * cast(Tensor, counts)[:, None, :]
            total = scores[:, j, :, None] + lp  # [m, kg, V]
        key = total if hooks.penalty.kind == "none" else \
            hooks.penalty(total, grown[part][:, :, None])
        _, flat = key.view(m, kg * v).topk(kg, dim=1)
        word = flat % v
        rows.append(part.gather(1, flat // v))
        words.append(word)
        new_scores.append(total.view(m, kg * v).gather(1, flat))
        if counts is not None:
            counts.scatter_add_(1, word, (word != PAD_ID).float())
    return (torch.stack(rows, 1).reshape(-1), torch.stack(words, 1).reshape(-1),
            torch.stack(new_scores, 1))


def _ranked(final: Tensor, n: int) -> Tensor:
    """The n best of each image's K hypotheses [b, G, K/G] (row within the image): each group's
    best in group order, then each group's second, ...; a group's ties by beam order."""
    b, g, kg = final.shape
    order = torch.sort(final, dim=2, descending=True, stable=True).indices  # [b, G, kg]
    within = order + (torch.arange(g, device=final.device) * kg)[None, :, None]
    return within.transpose(1, 2).reshape(b, g * kg)[:, :n]


def _finished_row(v: int, device) -> Tensor:
    """A finished hypothesis's next-word log-probabilities: <pad> free, the rest impossible."""
    row = torch.full((v,), float("-inf"), device=device)
    row[PAD_ID] = 0.0
    return row


class _History:
    """The live hypotheses' tokens, log-probabilities and attention so far."""

    def __init__(self, n: int, device):
        self.tokens = torch.zeros(n, 0, dtype=torch.long, device=device)
        self.logprobs = torch.zeros(n, 0, device=device)
        self.alphas: Tensor | None = None

    def extend(self, rows: Tensor, words: Tensor, logp: Tensor, alpha: Tensor | None) -> None:
        self.tokens = torch.cat([self.tokens[rows], words[:, None]], 1)
        self.logprobs = torch.cat([self.logprobs[rows], logp[:, None]], 1)
        if alpha is not None:
            step = alpha.index_select(0, rows)[:, None]
            self.alphas = step if self.alphas is None else torch.cat([self.alphas[rows], step], 1)

    def keep(self, rows: Tensor) -> None:
        self.tokens, self.logprobs = self.tokens[rows], self.logprobs[rows]
        if self.alphas is not None:
            self.alphas = self.alphas[rows]

    def row(self, i: int) -> tuple:
        return (self.tokens[i], self.logprobs[i],
                self.alphas[i] if self.alphas is not None else None)

    def rows(self, rows: Tensor) -> Decoded:
        """Rows ``rows``, cut after the longest caption's <eos>."""
        tokens, logprobs = self.tokens[rows], self.logprobs[rows]
        length = max(int((tokens != PAD_ID).sum(1).max()), 1)
        return Decoded(tokens[:, :length], logprobs[:, :length],
                       self.alphas[rows][:, :length] if self.alphas is not None else None)


def _stack(captions: list[tuple]) -> Decoded:
    """Per-image (tokens, logprobs, alphas) of different lengths -> one padded Decoded."""
    length = max(c[0].shape[0] for c in captions)
    tokens = captions[0][0].new_full((len(captions), length), PAD_ID)
    logprobs = captions[0][1].new_zeros(len(captions), length)
    alphas = None
    if captions[0][2] is not None:
        alphas = captions[0][2].new_zeros(len(captions), length, captions[0][2].shape[1])
    for i, (t, lp, al) in enumerate(captions):
        tokens[i, :len(t)], logprobs[i, :len(lp)] = t, lp
        if alphas is not None:
            alphas[i, :len(al)] = al
    return Decoded(tokens, logprobs, alphas)
