"""METEOR (Denkowski & Lavie 2014): unigram matching with stems and synonyms, pycocoevalcap's
Java scorer. Without Java it is unavailable, with the reason."""

from __future__ import annotations

import contextlib
from typing import Any

from trainer.scoring.metrics import METRICS
from trainer.scoring.metrics.base import Metric, Texts
from trainer.scoring.text import java_missing, one_line


@METRICS.register("meteor")
class Meteor(Metric):
    """METEOR 1.5 through pycocoevalcap's jar (needs Java)."""

    values = ("METEOR",)
    columns = ("METEOR",)
    place = 20

    def missing(self) -> str | None:
        return java_missing()

    def compute(self, texts: Texts) -> list[float]:
        from pycocoevalcap.meteor.meteor import Meteor as Scorer

        # METEOR's stdin protocol: one "SCORE ||| ref ||| ... ||| hypothesis" line per image. A
        # tokenizer's output is one line already; this holds whatever the caller passes.
        gts = {k: [one_line(c) for c in caps] for k, caps in texts.references.items()}
        res = {k: [one_line(c) for c in caps] for k, caps in texts.candidates.items()}
        meteor = Scorer()
        try:
            value, _ = meteor.compute_score(gts, res)
        finally:
            close_meteor(meteor)
        return [value]


def close_meteor(meteor: Any) -> None:
    """Stop METEOR's Java process now, without waiting for garbage collection.

    Its ``__del__`` takes the lock; if ``compute_score`` raised while holding
    it, that would hang, so the lock is released here too.
    """
    if hasattr(meteor, "close"):
        meteor.close()
        return
    proc = getattr(meteor, "meteor_p", None)
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.stdin.close()
        with contextlib.suppress(Exception):
            proc.kill()
        with contextlib.suppress(Exception):
            proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            with contextlib.suppress(Exception):
                stream.close()
    lock = getattr(meteor, "lock", None)
    if lock is not None and lock.locked():
        with contextlib.suppress(RuntimeError):
            lock.release()
