"""The ``cider_df`` stage (``capstack cider-cache``): a split's references cached for CIDEr-D rewards.

Tokenized as validation tokenizes (``simple_tokenize``), against the prepared
vocabulary, so that RL rewards score the same words validation counts.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.captions.prepared import load_captions
from trainer.evaluation.metrics import load_references, simple_tokenize
from trainer.rewards.cider import CiderD


def build_cache(prepared: str | Path, split: str, out: str | Path) -> CiderD:
    """The cached CIDEr-D references of a prepared dataset's split, saved to ``out``."""
    captions = load_captions(prepared)
    references = load_references(captions.references_path(split))
    tokenized = {i: [simple_tokenize(c) for c in caps] for i, caps in references.items()}
    scorer = CiderD.from_references(tokenized, captions.vocab.itow)
    scorer.save(out)
    return scorer
