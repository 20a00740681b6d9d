"""Trained runs loaded as one :class:`~trainer.ensemble.Ensemble`, refused unless they can be.

Averaging next-word distributions needs one vocabulary (word id i is the same word in every
member) and the same features (each member reads the image it was trained to read): runs that
differ in either are refused, naming both runs and what differs. The decoders, objectives and
seeds may differ. The first run's experiment supplies what the evaluation reads (its captions,
its ``eval:`` settings).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from pipeline.captions.vocab import Vocabulary
from pipeline.core.errors import CapstackError
from pipeline.core.jsonfile import read_json
from trainer.checkpoint import load_checkpoint
from trainer.config import ExperimentConfig
from trainer.decoders.base import Decoder
from trainer.ensemble import Ensemble
from trainer.evaluation.loaded import load_model

RUN_JOIN = "+"  # how an ensemble's runs, decoders, seeds ... are written as one


@dataclass
class Member:
    checkpoint: dict  # load_checkpoint's
    config: ExperimentConfig

    @property
    def run(self) -> str:
        return str(Path(self.checkpoint["path"]).parent)


@dataclass
class LoadedEnsemble:
    """What evaluation decodes with: the model, the vocabulary, the runs it came from."""

    model: Decoder  # an Ensemble, or the one run's own decoder (ensemble False)
    vocab: Vocabulary
    members: list[Member]
    ensemble: bool = True

    @property
    def config(self) -> ExperimentConfig:
        """The first run's experiment: the data and ``eval:`` settings the evaluation reads."""
        return self.members[0].config


def load_ensemble(checkpoints: Sequence[str | Path]) -> LoadedEnsemble:
    """The runs' (or checkpoints') decoders as one ensemble, in eval mode on the CPU; refused
    (:func:`refuse_mismatch`) when two cannot be averaged."""
    if not checkpoints:
        raise CapstackError("an ensemble needs at least one run")
    models: list[Decoder] = []
    members: list[Member] = []
    vocab: Vocabulary | None = None
    for path in checkpoints:
        ckpt = load_checkpoint(path)
        model, member_vocab, config = load_model(ckpt)
        member = Member(ckpt, config)
        if members:
            refuse_mismatch(members[0], member)
        models.append(model)
        members.append(member)
        vocab = vocab or member_vocab
    assert vocab is not None
    return LoadedEnsemble(Ensemble(models).eval(), vocab, members)


def load_decoder(checkpoint: str | Path | Sequence[str | Path]) -> LoadedEnsemble:
    """What evaluate, caption and their Python callers decode with: one run (a checkpoint or a
    run folder: its decoder, ``ensemble`` False) or, given a list (or tuple, even of one), the
    runs' ensemble (:func:`load_ensemble`)."""
    if not isinstance(checkpoint, (str, Path)):  # a list of runs
        return load_ensemble(list(checkpoint))
    ckpt = load_checkpoint(checkpoint)
    model, vocab, config = load_model(ckpt)
    return LoadedEnsemble(model, vocab, [Member(ckpt, config)], ensemble=False)


def refuse_mismatch(first: Member, other: Member) -> None:
    """Raise naming both runs unless they share a vocabulary and read the same features."""
    a, b = first.checkpoint, other.checkpoint
    words_a, words_b = Vocabulary.from_json(a["vocab"], a["path"]).itow, \
        Vocabulary.from_json(b["vocab"], b["path"]).itow
    if words_a != words_b:
        raise CapstackError(
            f"ensemble: {first.run} and {other.run} have different vocabularies "
            f"({_vocabulary_difference(words_a, words_b)}): an ensemble averages each word's "
            f"probability, so its runs must be trained on one prepared vocabulary")
    for what, value_a, value_b in _feature_settings(first, other):
        if value_a != value_b:
            raise CapstackError(
                f"ensemble: {first.run} and {other.run} read different features: {what} "
                f"{value_a} in {first.run}, {value_b} in {other.run}; an ensemble's runs "
                f"decode the same features of each image")


def _vocabulary_difference(a: list[str], b: list[str]) -> str:
    if len(a) != len(b):
        return f"{len(a)} words against {len(b)}"
    i = next(k for k, (x, y) in enumerate(zip(a, b)) if x != y)
    return f"word id {i} is {a[i]!r} in one, {b[i]!r} in the other"


def _feature_settings(first: Member, other: Member) -> list[tuple[str, object, object]]:
    """(what, first's, other's) of everything that makes the features a decoder reads."""
    def stores(m: Member) -> list[str]:
        return [s["fingerprint"] for s in m.checkpoint["identity"]["stores"]]

    return [("stores (fingerprints)", stores(first), stores(other)),
            ("feature dim", first.checkpoint["feature_dim"], other.checkpoint["feature_dim"]),
            ("data.max_regions", first.config.data.max_regions, other.config.data.max_regions),
            ("data.box_geometry", first.config.data.box_geometry,
             other.config.data.box_geometry)]


def joined(values: Sequence[object]) -> object:
    """An ensemble's values as one (``top_down+transformer``); the value itself when they all
    agree (a seed stays a number)."""
    texts = [str(v) for v in values]
    return values[0] if len(set(texts)) == 1 else RUN_JOIN.join(texts)


# -- where an ensemble's evaluation goes ----------------------------------------------------------
def member_checkpoint(target: str | Path) -> Path:
    """A member as one file, whichever way it was given (a run folder: its best.pt), resolved:
    ``runs/a`` and ``runs/a/best.pt`` are one member."""
    path = Path(target)
    return (path / "best.pt" if path.is_dir() else path).resolve()


def members_digest(targets: Sequence[str | Path]) -> str:
    """8 hex digits of the members' checkpoints, in order (the first supplies the data and the
    ``eval:`` settings, so order matters)."""
    text = "\0".join(str(member_checkpoint(t)) for t in targets)
    return hashlib.md5(text.encode()).hexdigest()[:8]


def default_folder(targets: Sequence[str | Path], evaluation_folder) -> Path:
    """``ensemble-A+B-<digest>`` beside the first run's evaluation folder (A, B the runs'
    folder names, shortened when long): the names alone were the same for ``runs/st`` +
    ``exps/seed1/runs/st`` and ``runs/st`` + ``exps/seed2/runs/st`` (and for ``a+b`` + ``c``
    and ``a`` + ``b+c``), whose evaluations then replaced each other; the digest of the
    members' checkpoints makes the folder theirs alone."""
    names = RUN_JOIN.join(evaluation_folder(Path(t)).name for t in targets)
    if len(names) > NAMES_SHOWN:
        names = names[:NAMES_SHOWN].rstrip(RUN_JOIN) + "..."
    first = evaluation_folder(Path(targets[0]))
    return first.with_name(f"ensemble-{names}-{members_digest(targets)}")


NAMES_SHOWN = 80  # characters of the members' names in a default folder's name


def check_same_members(out_dir: Path, targets: Sequence[str | Path]) -> None:
    """Refuse to replace, in ``out_dir``, the evaluation of an ensemble of other members (or of
    one run) with this ensemble's: an evaluation is never silently replaced by another
    model's."""
    if not (out_dir / "metrics.json").is_file():
        return
    try:
        recorded = read_json(out_dir / "metrics.json", "an evaluation's metrics")
    except (CapstackError, ValueError, OSError):
        return  # not an evaluation capstack can read: check_evaluation_replaceable decides
    before = recorded.get("checkpoint") if isinstance(recorded, dict) else None
    before = before if isinstance(before, list) else [before] if isinstance(before, str) else []
    if [str(member_checkpoint(c)) for c in before] != [str(member_checkpoint(t))
                                                        for t in targets]:
        shown = RUN_JOIN.join(map(str, before)) or "an unknown model"
        raise CapstackError(f"{out_dir}: holds the evaluation of {shown}, not of this "
                            f"ensemble's runs; an evaluation of other runs is never replaced: "
                            f"choose another --out")
