"""The decoders, found by name: ``build_decoder("top_down", {"hidden": 512}, V, D)``.

Each module registers its class with ``@DECODERS.register(name)``; importing
this package imports them all. Adding a decoder is one new file here plus its
import below.
"""

from __future__ import annotations

from pipeline.core.registry import Registry

DECODERS = Registry("decoder")

from trainer.decoders import (  # noqa: E402,F401  (each registers itself)
    gru_init,
    hard_attention,
    lstm3,
    show_tell,
    soft_attention,
    stack_cap,
    stack_cap_star,
    top_down,
)
from trainer.decoders.base import Decoder  # noqa: E402


def decoder_config(name: str, values: dict, where: str = "experiment"):
    """The decoder's own config dataclass filled strictly from ``values``."""
    from trainer.config import from_dict

    return from_dict(DECODERS.get(name).Config, values, where, "decoder_config.")


def build_decoder(name: str, values: dict, vocab_size: int, feature_dim: int) -> Decoder:
    cls = DECODERS.get(name)
    return cls(decoder_config(name, values), vocab_size, feature_dim)


def summaries() -> list[tuple[str, str]]:
    """(name, the first line of its docstring) per registered decoder."""
    return [(name, (cls.__doc__ or "").strip().splitlines()[0]) for name, cls in DECODERS.items()]
