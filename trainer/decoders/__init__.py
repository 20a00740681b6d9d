"""The decoders, found by name: ``build_decoder("top_down", TopDownConfig(hidden=512), V, D)``.

Each module registers its class with ``@DECODERS.register(name)``; importing
this package imports them all. Adding a decoder is one new file here plus its
import below. An experiment's ``decoder: {name: ..., ...}`` is parsed into the
decoder's ``Config`` once, when the experiment file is read (trainer/config.py).
"""

from __future__ import annotations

from pipeline.core.registry import Registry

DECODERS = Registry("decoder")

from trainer.decoders import (gru_init, hacap,  # noqa: E402,F401  (each registers itself)
                              hard_attention, lstm3, show_tell, soft_attention, stack_cap,
                              stack_cap_star, top_down)
from trainer.decoders.base import Decoder  # noqa: E402


def build_decoder(name: str, config, vocab_size: int, feature_dim: int) -> Decoder:
    """The registered decoder ``name`` built from its (already checked) config dataclass."""
    return DECODERS.get(name)(config, vocab_size, feature_dim)
