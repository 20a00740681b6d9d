"""Decoding options: the ``eval:`` block's fields (:class:`DecodingConfig`, the file form) read
into one of three small configs, :class:`Greedy`, :class:`Beam` or :class:`Sample`, which
:func:`decode` decodes.

The experiment file's ``eval:`` block holds these fields (``EvalConfig`` extends
:class:`DecodingConfig`), ``capstack evaluate`` and ``capstack caption`` take an option for
each, and ``evaluate_checkpoint(decoding=...)`` lays a mapping of them over the experiment's.

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
  :data:`~trainer.decoding.rules.MAX_WU_ALPHA`.
- ``block_trigrams``: no trigram twice in a caption; ``remove_bad_endings``: no caption ends
  with a word of ``bad_endings``; ``no_repeats``: no word twice in a row.
- ``n``: captions per image, the beam's n best (n <= K) or n samples, in rank order.

Which config the fields make: :class:`Beam` for ``search: diverse`` or ``search: beam`` with
``beam_size`` > 1; else :class:`Sample` when ``sample_method`` draws; else :class:`Greedy`.
A field the chosen config does not read, set away from its default, is refused by name
(:meth:`DecodingConfig.check`, run where the block or the options are read).

A new option: a field here, the config that reads it, and where :func:`decode` hands it on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal, Union, get_args

from pipeline.core.errors import CapstackError, shown
from trainer.bounds import MAX_CAPTION_WORDS, MAX_SAMPLES, bounded
from trainer.decoders.base import Context, Decoder, images_of
from trainer.decoding.beam import BeamHooks, beam_search
from trainer.decoding.rules import BAD_ENDINGS, Blocking, LengthPenalty, Rules, filtered
from trainer.decoding.words import Decoded, greedy, sample, step_by_step

import torch
from torch import Tensor

MAX_TOP_K = 1_000_000
DEFAULT_BEAM = 5  # the beam everywhere an experiment's eval: does not say

Search = Literal["beam", "greedy", "diverse"]
SampleMethod = Literal["greedy", "sample", "gumbel"]
SEARCHES: tuple[str, ...] = get_args(Search)
SAMPLE_METHODS: tuple[str, ...] = get_args(SampleMethod)


# ------------------------------------------------------------------------- the three configs


@dataclass(frozen=True)
class Greedy:
    """The most probable word at each step."""

    max_len: int = 16
    blocking: Blocking = Blocking()
    n: int = 1


@dataclass(frozen=True)
class Beam:
    """Beam search of ``size`` hypotheses (``groups`` > 1: diverse beam search), the ``n`` best
    per image."""

    size: int = DEFAULT_BEAM
    max_len: int = 16
    groups: int = 1
    diversity: float = 0.0
    penalty: LengthPenalty = LengthPenalty()
    temperature: float = 1.0
    blocking: Blocking = Blocking()
    n: int = 1


@dataclass(frozen=True)
class Sample:
    """Words drawn one at a time: ``n`` samples per image."""

    method: Literal["sample", "gumbel"] = "sample"
    max_len: int = 16
    temperature: float = 1.0
    top_k: int = 0  # 0: every word
    top_p: float = 1.0  # 1: every word
    blocking: Blocking = Blocking()
    n: int = 1


Options = Union[Greedy, Beam, Sample]


# ------------------------------------------------------------------------- the file form


@dataclass
class DecodingConfig:
    beam_size: int = bounded(DEFAULT_BEAM, 1, MAX_SAMPLES)
    max_len: int = bounded(16, 1, MAX_CAPTION_WORDS)
    search: Search = "beam"
    sample_method: SampleMethod = "greedy"
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

    @property
    def kind(self) -> type:
        """The config these fields make: :class:`Beam`, :class:`Sample` or :class:`Greedy`."""
        if self.search == "diverse" or (self.search == "beam" and self.beam_size > 1):
            return Beam
        return Sample if self.sample_method != "greedy" else Greedy

    def options(self) -> Options:
        """These fields as the config they make; refused (:class:`CapstackError`, the first
        rule broken) where they do not make one."""
        refused(self, "decoding")
        blocking = Blocking(self.no_repeats, self.block_trigrams,
                            tuple(self.bad_endings) if self.remove_bad_endings else None)
        if self.kind is Beam:
            diverse = self.search == "diverse"
            return Beam(self.beam_size, self.max_len, self.group_size if diverse else 1,
                        self.diversity_lambda if diverse else 0.0,
                        LengthPenalty.parse(self.length_penalty), self.temperature, blocking,
                        self.n)
        if self.kind is Sample:
            return Sample("gumbel" if self.sample_method == "gumbel" else "sample",
                          self.max_len, self.temperature, self.top_k, self.top_p, blocking,
                          self.n)
        return Greedy(self.max_len, blocking)

    def check(self):
        """The fields the chosen config does not read, set anyway: each refusal names its
        option and why."""
        try:
            penalty = LengthPenalty.parse(self.length_penalty)
        except ValueError as error:
            yield f"length_penalty: {error}"
            return
        kind = self.kind
        if kind is Beam:
            beams = self._beams()
            if self.sample_method != "greedy":
                yield (f"sample_method: {self.sample_method} draws one word at a time, and "
                       f"{beams} keeps the best hypotheses: set search: greedy (or "
                       f"beam_size: 1) to sample")
            if self.top_p < 1:
                yield (f"top_p: the nucleus is what a sample draws from; {beams} keeps the "
                       f"best hypotheses: set search: greedy and sample_method: sample")
            if self.top_k:
                yield (f"top_k: the k best words are what a sample draws from; {beams} "
                       f"keeps the best hypotheses: set search: greedy and sample_method: "
                       f"sample")
        else:
            if kind is Greedy:
                for name, given, what in (
                        ("top_k", self.top_k > 0, "keeping the k best words"),
                        ("top_p", self.top_p < 1, "keeping the nucleus"),
                        ("temperature", self.temperature != 1, "a temperature")):
                    if given:
                        yield (f"{name}: greedy decoding takes the most probable word, which "
                               f"{what} leaves as it is: set sample_method: sample (or gumbel) "
                               f"to draw")
            if penalty.kind != "none":
                one = "sampling" if kind is Sample else "greedy decoding"
                yield (f"length_penalty: {self.length_penalty} ranks a beam's hypotheses; "
                       f"{one} ranks none: use search: beam with beam_size > 1")
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
        if kind is Beam and self.n > self.beam_size:
            yield (f"n: {self.n} captions from the beam's best need beam_size >= n, got "
                   f"beam_size {self.beam_size}")
        if kind is Greedy and self.n > 1:
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


def refused(config: DecodingConfig, where: str, prefix: str = "") -> None:
    """Raise the first rule ``config`` breaks, ``where: prefix.option: why``."""
    for problem in config.check():
        raise CapstackError(f"{where}: {prefix}{problem}")


# ------------------------------------------------------------------------- decoding


def decode(decoder: Decoder, ctx: Context, options: Options | DecodingConfig,
           vocab=None) -> Decoded:
    """Captions of the context's B images as ``options`` say: [B * n, T], an image's n
    captions adjacent, in rank order (the beam's best first; samples in the order drawn).
    ``vocab`` (a :class:`~pipeline.captions.vocab.Vocabulary`) is needed for bad endings."""
    if isinstance(options, DecodingConfig):
        options = options.options()
    rules = options.blocking.rules(vocab, options.max_len)
    if isinstance(options, Beam):
        hooks = BeamHooks(options.penalty, options.groups, options.diversity, rules,
                          options.temperature)
        return beam_search(decoder, ctx, options.size, options.max_len, hooks, options.n)
    if isinstance(options, Greedy) and not rules.any:
        return greedy(decoder, ctx, options.max_len)
    if isinstance(options, Sample) and options.method == "sample" and not options.top_k \
            and options.top_p == 1 and not rules.any:
        return sample(decoder, ctx, options.max_len, options.temperature, n=options.n)
    return _one_at_a_time(decoder, ctx, options, rules)


def _one_at_a_time(decoder: Decoder, ctx: Context, options: Greedy | Sample,
                   rules: Rules) -> Decoded:
    """Greedy decoding or sampling, word by word, under the rules, n rows per image."""
    rows = images_of(ctx) * options.n
    picked: list[Tensor] = []

    def pick(logp: Tensor, t: int) -> Tensor:
        history = torch.stack(picked, 1) if picked else \
            torch.full((logp.shape[0], 0), 0, dtype=torch.long, device=logp.device)
        allowed = rules.apply(logp, history, t, logp)
        if isinstance(options, Greedy):
            words = allowed.argmax(1)
        else:
            weights = filtered(allowed, options.temperature, options.top_k, options.top_p)
            if options.method == "gumbel":
                u = torch.rand_like(weights).clamp_(min=1e-20)
                words = (weights - torch.log(-torch.log(u))).argmax(1)
            else:
                words = torch.multinomial(torch.softmax(weights, 1), 1).squeeze(1)
        picked.append(words)
        return words

    return step_by_step(decoder, ctx, rows, options.max_len, pick)
