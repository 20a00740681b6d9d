"""The ``cider_df`` stage (``capstack cider-cache``): a split's references cached for the
``cider-d`` reward (trainer/rewards/cider.py), the state that reward is built from.

Tokenized as validation tokenizes (``simple_tokenize``), against the prepared
vocabulary, so that RL rewards score the same words validation counts.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.captions.prepared import load_captions
from pipeline.core.bulk import gc_paused
from trainer.rewards.base import tokenized_references
from trainer.rewards.cider import CiderD


def build_cache(prepared: str | Path, split: str, out: str | Path) -> CiderD:
    """The cached CIDEr-D references of a prepared dataset's split, saved to ``out``."""
    captions = load_captions(prepared)
    with gc_paused():  # a list per reference: ~567,000 in COCO's train split (bulk.py)
        scorer = CiderD.from_references(tokenized_references(captions, split),
                                        captions.vocab.itow)
    scorer.save(out)
    return scorer
