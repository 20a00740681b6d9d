"""The decoders, found by name: ``build_decoder("top_down", TopDownConfig(hidden=512), V, D)``.

Each module registers its class with ``@DECODERS.register(name)``; importing
this package imports every module in it, so adding a decoder is one new file
here (and its experiment file). An experiment's ``decoder: {name: ..., ...}`` is parsed into the
decoder's ``Config`` once, when the experiment file is read (trainer/config.py).
"""

from __future__ import annotations

from pipeline.core.registry import Registry, import_modules

DECODERS = Registry("decoder")

from trainer.decoders.base import Decoder  # noqa: E402

import_modules(__name__, __path__)  # each registers itself


def build_decoder(name: str, config, vocab_size: int, feature_dim: int) -> Decoder:
    """The registered decoder ``name`` built from its (already checked) config dataclass."""
    return DECODERS.get(name)(config, vocab_size, feature_dim)
