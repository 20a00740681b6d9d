"""Validation during training: greedy captions of the val split, scored by CIDEr-D.

Tokenized in Python (``simple_tokenize``) so that an epoch's validation never
waits for a Java start-up; the evaluation stage scores with the PTB tokenizer.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from trainer.data import Captions, Features, eval_batches
from trainer.decoders.base import Decoder
from trainer.metrics import cider, load_references, simple_tokenize
from trainer.predict import predict

VAL_BATCH = 100


def validate(model: Decoder, captions: Captions, features: Features, device: torch.device, *,
             max_len: int = 16, limit: int = 0, split: str = "val", autocast=nullcontext) -> float:
    preds = predict(model, captions.vocab, eval_batches(captions, features, split, VAL_BATCH, limit),
                    device, beam_size=1, max_len=max_len, autocast=autocast)
    references = load_references(captions.references_path(split))
    candidates = {p.image_id: " ".join(p.words) for p in preds}
    refs = {i: [simple_tokenize(r) for r in references[i]] for i in candidates}
    return cider(candidates, refs)
