"""Evaluation-time decoding options as one config: :class:`DecodingConfig`, and :func:`decode`.

The experiment file's ``eval:`` block holds these fields (``EvalConfig`` extends this class),
``capstack evaluate`` and ``capstack caption`` take an option for each, and
``evaluate_checkpoint(decoding=...)`` lays a mapping of them over the experiment's.

- ``search``: ``beam`` (K = ``beam_size`` hypotheses; K = 1 is greedy decoding), ``greedy``
  (one word at a time) or ``diverse`` (diverse beam search: ``group_size`` groups of K / G
  beams; a group's next-word log-probabilities lose ``diversity_lambda`` for each time an earlier
  group chose that word at the same step; Vijayakumar et al. 2018).
- ``sample_method``: how a one-word-at-a-time search picks its word: ``greedy`` (the most
  probable), ``sample`` (a draw from softmax(log p / ``temperature``)) or ``gumbel`` (the same
  distribution drawn as argmax(log p / temperature + Gumbel noise)); ``top_k`` keeps the k most
  probable words and ``top_p`` the nucleus (the fewest most probable words whose probability
  reaches p) before the draw. In beam search ``temperature`` scores hypotheses by
  log_softmax(logits / temperature).
- ``length_penalty``: how beam search ranks hypotheses of different lengths L (tokens, ``<eos>``
  included) with log-probability S: ``none`` S, ``wu_A`` S / ((5 + L)^A / 6^A) (GNMT),
  ``avg_A`` S / L (A is not used, as the peer has it). A is 0 or more; wu's at most
  :data:`MAX_WU_ALPHA`.
- ``block_trigrams``: no trigram twice in a caption; ``remove_bad_endings``: no caption ends
  with a word of ``bad_endings``; ``no_repeats``: no word twice in a row.
- ``n``: captions per image, the beam's n best (n <= K) or n samples, in rank order.

At the defaults :func:`decode` is :func:`trainer.decode.beam_search` (or ``greedy`` for K = 1)
itself; plain sampling is :func:`trainer.decode.sample`. Any other option takes the
general searches below, which apply the constraints every step.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal, Sequence

import torch
from torch import Tensor

from pipeline.core.errors import CapstackError, shown
from pipeline.core.tokens import BOS_ID, EOS_ID, PAD_ID
from trainer.bounds import MAX_CAPTION_WORDS, MAX_SAMPLES, bounded
from trainer.decode import (Decoded, _ending_at, _finished_row, _log_softmax_in_place,
                            _step_by_step, beam_search, greedy, sample, tempered)
from trainer.decoders.base import Context, Decoder, images_of, select, stack_steps

# self-critical.pytorch's list (captioning/models/AttModel.py ``bad_endings``)
BAD_ENDINGS = ("a", "an", "the", "in", "for", "at", "of", "with", "before", "after", "on",
               "upon", "near", "to", "is", "are", "am")
MAX_TOP_K = 1_000_000
# wu_ALPHA's largest ALPHA. GNMT tunes it within 0 to 1; at 10 a caption of 11 tokens already
# has its score divided by (16/15)^10 = 1.9 times more than one of 10. (5 + L)^ALPHA stays
# within float32 at the longest captions (MAX_CAPTION_WORDS + 1 tokens) up to ALPHA 12.8; past
# that it overflows, and every score is 0 or NaN (NaN ranks first: empty or cut captions)
MAX_WU_ALPHA = 10.0


@dataclass
class DecodingConfig:
    beam_size: int = bounded(5, 1, MAX_SAMPLES)
    max_len: int = bounded(16, 1, MAX_CAPTION_WORDS)
    search: Literal["beam", "greedy", "diverse"] = "beam"
    sample_method: Literal["greedy", "sample", "gumbel"] = "greedy"
    temperature: float = bounded(1.0, above=0)
    top_k: int = bounded(0, 0, MAX_TOP_K)  # 0: every word
    top_p: float = bounded(1.0, above=0, high=1)  # 1: every word
    length_penalty: str = "none"  # none | wu_ALPHA | avg_ALPHA
    group_size: int = bounded(1, 1, MAX_SAMPLES)  # diverse beam search's groups
    diversity_lambda: float = bounded(0.5, 0)
    block_trigrams: bool = False
    remove_bad_endings: bool = False
    bad_endings: list[str] = field(default_factory=lambda: list(BAD_ENDINGS))
    no_repeats: bool = False  # self-critical.pytorch's decoding_constraint
    n: int = bounded(1, 1, MAX_SAMPLES)  # captions per image

    def check(self):
        """The rules between the options: each refusal names its option and why."""
        beams = self.search == "diverse" or (self.search == "beam" and self.beam_size > 1)
        sampling = self.sample_method != "greedy"
        try:
            kind, _ = parse_length_penalty(self.length_penalty)
        except ValueError as error:
            yield f"length_penalty: {error}"
            return
        if sampling and beams:
            yield (f"sample_method: {self.sample_method} draws one word at a time, and "
                   f"{self._beams()} keeps the best hypotheses: set search: greedy (or "
                   f"beam_size: 1) to sample")
        if self.top_p < 1 and beams:
            yield (f"top_p: the nucleus is what a sample draws from; {self._beams()} keeps the "
                   f"best hypotheses: set search: greedy and sample_method: sample")
        if self.top_k and beams:
            yield (f"top_k: the k best words are what a sample draws from; {self._beams()} "
                   f"keeps the best hypotheses: set search: greedy and sample_method: sample")
        if not beams and not sampling:
            for name, given, what in (
                    ("top_k", self.top_k > 0, "keeping the k best words"),
                    ("top_p", self.top_p < 1, "keeping the nucleus"),
                    ("temperature", self.temperature != 1, "a temperature")):
                if given:
                    yield (f"{name}: greedy decoding takes the most probable word, which "
                           f"{what} leaves as it is: set sample_method: sample (or gumbel) "
                           f"to draw")
        if kind != "none" and not beams:
            yield (f"length_penalty: {self.length_penalty} ranks a beam's hypotheses; "
                   f"{self._one_at_a_time()} ranks none: use search: beam with beam_size > 1")
        if self.search == "diverse":
            if self.group_size < 2:
                yield ("group_size: diverse beam search splits the beam into groups: give 2 or "
                       "more (1 is plain beam search)")
            elif self.beam_size % self.group_size:
                yield (f"group_size: {self.group_size} groups do not divide beam_size "
                       f"{self.beam_size} into equal groups")
        else:
            if self.group_size != 1:
                yield (f"group_size: groups are diverse beam search's, and search is "
                       f"{self.search}: set search: diverse")
            if self.diversity_lambda != 0.5:
                yield (f"diversity_lambda: the penalty between diverse beam search's groups, "
                       f"and search is {self.search}: set search: diverse")
        if self.n > 1:
            if beams and self.n > self.beam_size:
                yield (f"n: {self.n} captions from the beam's best need beam_size >= n, got "
                       f"beam_size {self.beam_size}")
            if not beams and not sampling:
                yield (f"n: greedy decoding gives one caption per image: use sample_method: "
                       f"sample for {self.n} samples, or beam search for the {self.n} best")
        if not self.remove_bad_endings and list(self.bad_endings) != list(BAD_ENDINGS):
            yield ("bad_endings: a list of words to keep off the ends of captions, without "
                   "remove_bad_endings: true")
        for k, word in enumerate(self.bad_endings):
            if not word or word != word.strip() or " " in word:
                yield f"bad_endings[{k}]: expected one word, got {shown(word)}"

    def _beams(self) -> str:
        return ("diverse beam search" if self.search == "diverse" else
                f"beam search (beam_size {self.beam_size})")

    def _one_at_a_time(self) -> str:
        return "sampling" if self.sample_method != "greedy" else "greedy decoding"

    @property
    def decoding(self) -> "DecodingConfig":
        """These options alone (an ``EvalConfig``'s without its split and figures)."""
        names = {f.name for f in dataclasses.fields(DecodingConfig)}
        return DecodingConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                                 if f.name in names})

    def describe(self) -> str:
        """The options that differ from the defaults, beam size and length aside, as one
        short line ("" at the defaults): what tells evaluations apart in a report."""
        default = DecodingConfig()
        parts = []
        for f in dataclasses.fields(DecodingConfig):
            if f.name in ("beam_size", "max_len"):
                continue
            value = getattr(self, f.name)
            if value != getattr(default, f.name):
                parts.append(f"{f.name}={','.join(value) if isinstance(value, list) else value}")
        return " ".join(parts)


def parse_length_penalty(text: str) -> tuple[str, float]:
    """``none`` | ``wu_ALPHA`` | ``avg_ALPHA`` -> (kind, alpha); ValueError says why not."""
    if text in ("none", ""):
        return "none", 0.0
    kind, sep, alpha = text.partition("_")
    if kind in ("wu", "avg") and sep:
        try:
            value = float(alpha)
        except ValueError:
            value = math.nan
        if kind == "wu" and value > MAX_WU_ALPHA:
            raise ValueError(f"wu_ALPHA takes ALPHA from 0 to {MAX_WU_ALPHA:g} (GNMT's is "
                             f"within 0 to 1; above {MAX_WU_ALPHA:g}, (5 + L)^ALPHA leaves "
                             f"float32), got {shown(text)}")
        if math.isfinite(value) and value >= 0:
            return kind, value
    raise ValueError(f"expected none, wu_ALPHA or avg_ALPHA (ALPHA a number, 0 or more), "
                     f"got {shown(text)}")


def length_penalized(kind: str, alpha: float, scores: Tensor, lengths: Tensor) -> Tensor:
    """Scores S of hypotheses of L tokens (``<eos>`` included) as beam search ranks them: wu
    S / ((5 + L)^alpha / 6^alpha); avg S / L; none S."""
    if kind == "wu":
        return scores / ((5 + lengths.to(scores.dtype)) ** alpha / 6 ** alpha)
    if kind == "avg":
        return scores / lengths.to(scores.dtype).clamp(min=1)
    return scores


def refused(config: DecodingConfig, where: str, prefix: str = "") -> None:
    """Raise the first rule ``config`` breaks, ``where: prefix.option: why``."""
    for problem in config.check():
        raise CapstackError(f"{where}: {prefix}{problem}")


# ------------------------------------------------------------------------- decoding


@dataclass(frozen=True)
class _Rules:
    """What every step forbids: resolved against a vocabulary."""

    max_len: int
    no_repeats: bool
    block_trigrams: bool
    bad: Tensor | None  # ids of the bad endings, or None

    @property
    def any(self) -> bool:
        return self.no_repeats or self.block_trigrams or self.bad is not None

    def apply(self, logp: Tensor, history: Tensor, t: int, full: Tensor) -> Tensor:
        """``logp`` [N, V] with what may not follow ``history`` [N, t] at step t set to -inf.

        A row left without any word (a small vocabulary) may end: ``<eos>`` at the model's
        log-probability ``full``."""
        if not self.any:
            return logp
        blocked = torch.zeros_like(logp, dtype=torch.bool)
        if self.no_repeats and t >= 1:
            blocked.scatter_(1, history[:, t - 1:t], True)
        if self.block_trigrams and t >= 3:
            same = (history[:, :t - 2] == history[:, t - 2:t - 1]) & \
                (history[:, 1:t - 1] == history[:, t - 1:t])  # [N, t-2]: an earlier pair
            counts = torch.zeros(logp.shape, dtype=torch.long, device=logp.device)
            counts.scatter_add_(1, history[:, 2:t], same.long())  # its third word
            blocked |= counts > 0
        if self.bad is not None:
            bad = self.bad.to(logp.device)
            if t >= 1:
                blocked[:, EOS_ID] |= torch.isin(history[:, t - 1], bad)
            if t == self.max_len - 1:  # the last word before the forced <eos>
                blocked[:, bad] = True
        logp = logp.masked_fill(blocked, float("-inf"))
        stuck = ~torch.isfinite(logp).any(1)
        if stuck.any():
            logp[stuck, EOS_ID] = full[stuck, EOS_ID]
        return logp


def _rules(config: DecodingConfig, vocab) -> _Rules:
    bad = None
    if config.remove_bad_endings:
        if vocab is None:
            raise CapstackError("remove_bad_endings: the vocabulary is needed to know the "
                                "bad endings' ids")
        bad = torch.tensor(sorted({vocab.wtoi[w] for w in config.bad_endings
                                   if w in vocab.wtoi}), dtype=torch.long)
    return _Rules(config.max_len, config.no_repeats, config.block_trigrams, bad)


def fast_path(config: DecodingConfig) -> str | None:
    """Which of trainer/decode.py's own searches decodes ``config`` unchanged, or None."""
    plain = (config.temperature == 1 and not config.top_k and config.top_p == 1
             and parse_length_penalty(config.length_penalty)[0] == "none"
             and not config.block_trigrams and not config.remove_bad_endings
             and not config.no_repeats and config.search != "diverse")
    if not plain:
        return None
    one_at_a_time = config.search == "greedy" or config.beam_size == 1
    if config.sample_method == "greedy" and config.n == 1:
        return "greedy" if one_at_a_time else "beam"
    return None


def decode(decoder: Decoder, ctx: Context, config: DecodingConfig, vocab=None) -> Decoded:
    """Captions of the context's B images as ``config`` says: [B * n, T], an image's n
    captions adjacent, in rank order (the beam's best first; samples in the order drawn).
    ``vocab`` (a :class:`~pipeline.captions.vocab.Vocabulary`) is needed for bad endings."""
    refused(config, "decoding")
    path = fast_path(config)
    if path == "beam":
        return beam_search(decoder, ctx, config.beam_size, config.max_len)
    if path == "greedy":
        return greedy(decoder, ctx, config.max_len)
    rules = _rules(config, vocab)
    if config.search == "diverse" or (config.search == "beam" and config.beam_size > 1):
        return _beam(decoder, ctx, config, rules)
    if config.sample_method == "sample" and not config.top_k and config.top_p == 1 \
            and not rules.any:
        return sample(decoder, ctx, config.max_len, config.temperature, n=config.n)
    return _one_at_a_time(decoder, ctx, config, rules)


def filtered(logp: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    """The log-weights a sample draws from: log p / temperature, the ``top_k`` best words
    (0: all), then the nucleus: the fewest most probable words whose probability (the
    tempered distribution's, renormalised) reaches ``top_p``, the most probable word always
    (a ``top_p`` below float32's smallest number reads as 0, which every word reaches); the
    others -inf. A temperature too small for float32 is its limit: the most probable word
    (:func:`~trainer.decode.tempered`)."""
    logp = tempered(logp, temperature)
    if top_k and top_k < logp.shape[1]:
        kth = logp.topk(top_k, dim=1).values[:, -1:]
        logp = logp.masked_fill(logp < kth, float("-inf"))
    if top_p < 1:
        probs = torch.softmax(logp, 1)
        sorted_probs, order = probs.sort(1, descending=True)
        before = sorted_probs.cumsum(1) - sorted_probs  # probability of the better words
        drop_sorted = before >= top_p  # the nucleus reached without this word
        drop_sorted[:, 0] = False  # the most probable word: the nucleus is never empty
        drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
        logp = logp.masked_fill(drop, float("-inf"))
    return logp


def _one_at_a_time(decoder: Decoder, ctx: Context, config: DecodingConfig,
                   rules: _Rules) -> Decoded:
    """Greedy decoding or sampling, word by word, under the rules, n rows per image."""
    rows = images_of(ctx) * config.n
    picked: list[Tensor] = []

    def pick(logp: Tensor, t: int) -> Tensor:
        history = torch.stack(picked, 1) if picked else \
            torch.full((logp.shape[0], 0), BOS_ID, dtype=torch.long, device=logp.device)
        allowed = rules.apply(logp, history, t, logp)
        if config.sample_method == "greedy":
            words = allowed.argmax(1)
        else:
            weights = filtered(allowed, config.temperature, config.top_k, config.top_p)
            if config.sample_method == "gumbel":
                u = torch.rand_like(weights).clamp_(min=1e-20)
                words = (weights - torch.log(-torch.log(u))).argmax(1)
            else:
                words = torch.multinomial(torch.softmax(weights, 1), 1).squeeze(1)
        picked.append(words)
        return words

    return _step_by_step(decoder, ctx, rows, config.max_len, pick)


def _beam(decoder: Decoder, ctx: Context, config: DecodingConfig, rules: _Rules) -> Decoded:
    """Beam search, or diverse beam search, under the rules, ranked by the length penalty;
    the n best per image.

    As :func:`trainer.decode.beam_search`, a hypothesis that ended keeps its beam with its
    score frozen. Rows are image-major, then group, then the group's K / G beams; each group
    picks its K / G best continuations in turn, its log-probabilities less ``diversity_lambda``
    times the count of each word the earlier groups of its image picked at this step (the
    first group's is plain beam search). Hypotheses compete on the length-penalised score of
    what they would be after the step. The search runs until every hypothesis has ended."""
    g = config.group_size if config.search == "diverse" else 1
    k, b = config.beam_size, images_of(ctx)
    kg = k // g
    kind, alpha = parse_length_penalty(config.length_penalty)
    state = decoder.with_room(decoder.init_state(ctx, b * k), config.max_len + 1)
    device = state[0].device
    words = torch.full((b * k,), BOS_ID, dtype=torch.long, device=device)
    scores = torch.full((b, g, kg), float("-inf"), device=device)
    scores[:, :, 0] = 0.0  # every group starts from the one empty caption
    lengths = torch.zeros(b * k, dtype=torch.long, device=device)
    done = torch.zeros(b * k, dtype=torch.bool, device=device)
    tokens = torch.zeros(b * k, 0, dtype=torch.long, device=device)
    logprobs = torch.zeros(b * k, 0, device=device)
    alphas: list[Tensor | None] = []
    parents: list[Tensor] = []
    for t in range(config.max_len + 1):
        logits, state, att = decoder.step(words, state, ctx)
        full = _log_softmax_in_place(logits.float())  # the model's: recorded
        logp = full if config.temperature == 1 else \
            torch.log_softmax(tempered(logits.float(), config.temperature), 1)
        logp = _ending_at(t, config.max_len, logp)
        logp = rules.apply(logp if logp is not full else logp.clone(), tokens, t, full)
        logp[done] = _finished_row(logp.shape[1], device)
        v = logp.shape[1]
        grown = lengths + (~done).long()  # each row's length after this step
        chosen_rows, chosen_words, new_scores = [], [], []
        counts = torch.zeros(b, v, device=device)  # words the earlier groups picked, per image
        for j in range(g):
            part = torch.arange(b, device=device)[:, None] * k + j * kg + \
                torch.arange(kg, device=device)  # [b, kg] rows of group j
            lp = logp[part.reshape(-1)].view(b, kg, v)
            if j and config.diversity_lambda:
                lp = lp - config.diversity_lambda * counts[:, None, :]
            total = scores[:, j, :, None] + lp  # [b, kg, V]
            key = length_penalized(kind, alpha, total, grown[part][:, :, None])
            _, flat = key.view(b, kg * v).topk(kg, dim=1)
            beam, word = flat // v, flat % v
            chosen_rows.append(part.gather(1, beam))
            chosen_words.append(word)
            new_scores.append(total.view(b, kg * v).gather(1, flat))
            counts.scatter_add_(1, word, (word != PAD_ID).float())
        rows = torch.stack(chosen_rows, 1).reshape(-1)  # [b*k], image, group, beam order
        words = torch.stack(chosen_words, 1).reshape(-1)
        scores = torch.stack(new_scores, 1)
        tokens = torch.cat([tokens[rows], words[:, None]], 1)
        picked = full[rows, words].masked_fill(done[rows], 0.0)
        logprobs = torch.cat([logprobs[rows], picked[:, None]], 1)
        lengths, done = grown[rows], done[rows] | (words == EOS_ID)
        alphas.append(att)
        parents.append(rows)
        state = select(state, rows)
        if done.all():
            break
    final = length_penalized(kind, alpha, scores.reshape(b, k), lengths.view(b, k))
    ranked = _ranked(final.view(b, g, kg), config.n)  # [b, n] rows within each image
    picked = (torch.arange(b, device=device)[:, None] * k + ranked).reshape(-1)
    return _rows_of(tokens, logprobs, _traced(alphas, parents), picked)


def _ranked(final: Tensor, n: int) -> Tensor:
    """The n best of each image's K hypotheses [b, G, K/G] (row within the image): each group's
    best in group order, then each group's second, ...; a group's ties by beam order."""
    b, g, kg = final.shape
    order = torch.sort(final, dim=2, descending=True, stable=True).indices  # [b, G, kg]
    within = order + (torch.arange(g, device=final.device) * kg)[None, :, None]
    return within.transpose(1, 2).reshape(b, g * kg)[:, :n]


def _traced(alphas: Sequence[Tensor | None], parents: Sequence[Tensor]) -> Tensor | None:
    """Each final row's attention per step [N, T, L], following its ancestors back."""
    if alphas[0] is None:
        return None
    rows = torch.arange(parents[-1].shape[0], device=parents[-1].device)
    steps: list[Tensor | None] = []
    for att, parent in zip(reversed(alphas), reversed(parents)):
        rows = parent[rows]  # the row at this step whose step made the final row's word
        steps.append(att.index_select(0, rows) if att is not None else None)
    return stack_steps(steps[::-1])


def _rows_of(tokens: Tensor, logprobs: Tensor, alphas: Tensor | None, rows: Tensor) -> Decoded:
    """Rows ``rows`` of a search's histories, cut after the longest caption's <eos>."""
    tokens, logprobs = tokens[rows], logprobs[rows]
    length = max(int((tokens != PAD_ID).sum(1).max()), 1)
    return Decoded(tokens[:, :length], logprobs[:, :length],
                   alphas[rows][:, :length] if alphas is not None else None)
