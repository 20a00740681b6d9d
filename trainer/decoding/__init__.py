"""Decoding: captions from a decoder's steps.

- words.py: greedy decoding and sampling word by word, and what every search shares.
- beam.py: the one beam search, with hooks (length penalty, groups, blocking rules).
- rules.py: the hooks' parts: length penalties, blocking rules, sampling filters.
- options.py: the ``eval:`` block's fields read into a :class:`Greedy`, :class:`Beam` or
  :class:`Sample` config, and :func:`decode`.
"""

from trainer.decoding.beam import BeamHooks, beam_search
from trainer.decoding.options import (DEFAULT_BEAM, Beam, DecodingConfig, Greedy, Options, Sample,
                                      decode)
from trainer.decoding.rules import BAD_ENDINGS, Blocking, LengthPenalty, filtered
from trainer.decoding.words import (Decoded, SamplingNoise, greedy, picked_logprobs, sample,
                                    tempered)

__all__ = ["BAD_ENDINGS", "DEFAULT_BEAM", "Beam", "BeamHooks", "Blocking", "Decoded",
           "DecodingConfig", "Greedy", "LengthPenalty", "Options", "Sample", "SamplingNoise",
           "beam_search", "decode", "filtered", "greedy", "picked_logprobs", "sample", "tempered"]
