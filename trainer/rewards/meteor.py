"""METEOR 1.5 of token-id captions: pycocoevalcap's ``Meteor``, one Java process for the run.

pycocoevalcap's scorer is a Java program (``meteor-1.5.jar -stdio``) that loads
its paraphrase table when it starts, in seconds: the reward starts it once, when
it is built, and sends each batch down the same process (``compute_score`` on
the batch's captions, one entry per caption). The captions are the vocabulary's
words of the token ids; the references the train split's, tokenized as the
CIDEr-D cache's. Without ``java`` on PATH the reward is refused when the
objective is built, saying so.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass

import numpy as np

from pipeline.core.errors import CapstackError
from trainer.scoring.text import one_line
from trainer.rewards import REWARDS
from trainer.rewards.base import Reward, tokenized_references

NO_JAVA = ("the meteor reward runs pycocoevalcap's METEOR 1.5, a Java program: java not found "
           "on PATH (install a Java runtime, e.g. openjdk-17-jre-headless, or choose another "
           "reward)")


@dataclass
class MeteorConfig:
    pass  # METEOR 1.5's English settings, as pycocoevalcap runs it


@REWARDS.register("meteor")
class Meteor(Reward):
    """METEOR 1.5 (pycocoevalcap's, over Java) against the train references."""

    Config = MeteorConfig

    def __init__(self, config: MeteorConfig, captions):
        super().__init__(config, captions)
        self.start(tokenized_references(captions), captions.vocab.itow)

    @classmethod
    def from_references(cls, config: MeteorConfig, references, vocab_words) -> "Meteor":
        """The reward against ``references`` (image id -> tokenized captions) rather than a
        prepared folder's (tests, benchmarks)."""
        reward = cls.__new__(cls)
        Reward.__init__(reward, config, None)
        reward.start(references, vocab_words)
        return reward

    def start(self, references, vocab_words) -> None:
        self.words = list(vocab_words)
        self.references = {int(i): [one_line(c) for c in caps] for i, caps in references.items()}
        self.scorer = start_meteor()

    def score(self, image_ids, tokens, lengths) -> np.ndarray:
        if len(image_ids) == 0:
            return np.zeros(0)
        missing = [i for i in image_ids if int(i) not in self.references]
        if missing:
            raise CapstackError(f"METEOR: image {missing[0]} has no references")
        gts = {k: self.references[int(i)] for k, i in enumerate(image_ids)}
        res = {k: [one_line(" ".join(self.words[t] for t in row[:n]))]
               for k, (row, n) in enumerate(zip(np.asarray(tokens), np.asarray(lengths)))}
        try:
            _, scores = self.scorer.compute_score(gts, res)
        except (OSError, ValueError) as error:  # the process ended: a broken pipe, an empty line
            lock = self.scorer.lock
            if lock.locked():
                lock.release()
            raise CapstackError(f"METEOR: the Java scorer stopped ({error}); "
                                f"{stderr_of(self.scorer)}") from None
        return np.asarray(scores, np.float64)

    def close(self) -> None:
        """End the Java process now (pycocoevalcap's ``__del__`` would, at collection)."""
        process = self.scorer.meteor_p
        with contextlib.suppress(OSError):
            process.stdin.close()
        process.kill()
        process.wait()


def start_meteor():
    """pycocoevalcap's METEOR scorer, its Java process started, or why it cannot start."""
    if shutil.which("java") is None:
        raise CapstackError(NO_JAVA)
    from pycocoevalcap.meteor.meteor import Meteor as Scorer

    return Scorer()


def stderr_of(scorer) -> str:
    """What the stopped process said (its last lines), or that it said nothing."""
    process = scorer.meteor_p
    if process.poll() is None:
        process.kill()
    text = process.stderr.read().decode(errors="replace").strip().splitlines()
    return f"it said: {' / '.join(text[-3:])}" if text else "it said nothing"
