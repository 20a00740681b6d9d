"""Validation during training: greedy captions of the val split, scored by CIDEr-D (and the
value a run keeps its best epoch on, ``train.select_on``: BLEU-4, ROUGE-L, ...).

Tokenized in Python (``simple_tokenize``) so that an epoch's validation never
waits for a Java start-up; the evaluation stage scores with the PTB tokenizer.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from pipeline.captions.prepared import Captions
from pipeline.core.ranks import Ranks
from trainer.data import Features, batches_of
from trainer.decoders.base import Decoder
from trainer.decoding import Greedy
from trainer.evaluation.predict import predict
from trainer.scoring.metrics import score_tokenized
from trainer.scoring.references import load_references
from trainer.scoring.text import simple_tokenize

VAL_BATCH = 100


def validate(model: Decoder, captions: Captions, features: Features, device: torch.device, *,
             max_len: int = 16, limit: int = 0, split: str = "val", autocast=nullcontext,
             ranks: Ranks = Ranks(), scores: tuple[str, ...] = ("cider",)) -> dict[str, float]:
    """The ``scores`` (``train.select_on``'s names: trainer.scoring.metrics.selectable) of the
    greedy captions of the split's first
    ``limit`` images (all when 0).

    Under DDP each rank decodes its part of the images and every rank scores
    the gathered captions, so all ranks agree on the values (and the best epoch).
    """
    ids = captions.image_ids[captions.rows(split)].tolist()
    ids = ids[:limit] if limit else ids
    mine = ids[ranks.share(len(ids))]
    preds = predict(model, captions.vocab, batches_of(features, mine, VAL_BATCH), device,
                    Greedy(max_len), autocast=autocast)
    references = load_references(captions.references_path(split))
    candidates = {image_id: caption for part in ranks.gather(
        {p.image_id: " ".join(p.words) for p in preds}) for image_id, caption in part.items()}
    refs = {i: [simple_tokenize(r) for r in references[i]] for i in candidates}
    return score_tokenized(scores, candidates, refs)
