"""Checkpoints: written atomically, usable on their own, refused on other data.

A checkpoint holds the experiment config, the decoder's name and config, the
vocabulary and the metadata of the stores it was trained on, besides the
weights and the optimiser, scheduler and objective states that make a resume
exact. Resuming or evaluating against stores, a vocabulary or a decoder config
other than the checkpoint's is refused, naming the field and both values.
Checkpoints of an older form (the first format's flat experiment, keys that moved,
decoder settings added since) are brought to today's by trainer/upgrade.py, once per
load. Every checkpoint carries a sha256 of its content, checked on load
(:func:`content_digest`). Those saved before checksums, which may have been
edited, are checked by form instead: every field the commands read is there and
of its type, nothing nests deeper than :data:`MAX_DEPTH`, the vocabulary is the
identity's and the weights fit the decoder the experiment describes
(:func:`check_contents`, for every checkpoint).
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import TYPE_CHECKING

import torch

import pipeline

from pipeline.captions.vocab import Vocabulary, digest_words
from pipeline.core.atomic import atomic_file
from pipeline.core.errors import CapstackError
from pipeline.core.state_dicts import first_misfit, require_fit, tensors_only
from pipeline.core.torch_files import load_tensors
from trainer import upgrade
from trainer.config import experiment_from_dict

if TYPE_CHECKING:
    from trainer.data import Features

FORMAT = "capstack-checkpoint-2"
DIGEST = "content_sha256"  # what content_digest gave at save time
# capstack nests about 6 deep (stores[0].meta.producer.settings...): a deeper value is an edit,
# refused before repr() or content_digest recurse into it (a RecursionError naming nothing)
MAX_DEPTH = 32
NUMBER = (int, float)
# what the commands read of every checkpoint (evaluate, caption, resume, init_from), by type
HOLDS = {"identity": dict, "experiment": dict, "vocab": dict, "stores": list, "feature_dim": int,
         "model": dict, "optimizer": dict, "scheduler": dict, "epoch": int, "batch": int,
         "step": int, "best_cider": NUMBER, "best_epoch": int}
# and those whose form has changed (an older format's: trainer/upgrade.py), with whether required
FIELDS = [("objective", dict, True), ("identity.decoder", dict, True)]
_KINDS = {dict: "a dict", list: "a list", int: "an int", str: "a str", NUMBER: "a number"}


def identity(decoder: str, decoder_config: dict, vocab_itow: list[str], stores: list[dict]) -> dict:
    """What must match between a checkpoint and the data it is used with."""
    return {
        "decoder": {"name": decoder, **decoder_config},
        "vocab": {"size": len(vocab_itow),
                  "md5": digest_words(vocab_itow)},
        "stores": [{"fingerprint": s["fingerprint"]} for s in stores],
    }


def payload(identity: dict, experiment: dict, vocab: Vocabulary, features: Features,
            model: dict, table: dict, position: dict, *, optimizer: dict | None = None,
            objective: dict | None = None, precision: dict | None = None,
            scheduler: dict | None = None, start: dict | None = None, **more) -> dict:
    """A checkpoint's content, in the one form training and ``import-checkpoint`` write: what
    the decoder is and was trained on, its weights, the training's states (an import's empty),
    where the run stands (``position``: trainer/training/position.py's record) and the start
    it was given (``train.init_from``'s digest); ``more`` after them (an import's origin)."""
    return {
        "identity": identity, "experiment": experiment, "vocab": vocab.to_json(),
        "stores": [{**d, "meta": s.meta} for d, s in zip(features.describe(), features.stores)],
        "feature_dim": features.feature_dim, "model": model, "optimizer": optimizer or {},
        "objective": objective or {}, "precision": precision or {}, "table": table,
        "scheduler": scheduler or {}, **position, "start": start,
        "capstack_version": pipeline.__version__, **more,
    }


def check_identity(saved: dict, current: dict, path: Path, *,
                   training_only_may_differ: bool = False) -> None:
    """Raise naming the first differing field, e.g. ``stores[0].fingerprint: checkpoint a, now
    b``. ``training_only_may_differ``: a start's weights (``train.init_from``) mean the same
    under another dropout rate, a setting that acts only while training, so RL may drop it."""
    for field, old, new in _differences(saved, current, ""):
        if training_only_may_differ and training_only(field):
            continue
        raise CapstackError(f"{path}: {field}: the checkpoint has {old!r}, this run has {new!r} "
                            f"(train a new experiment, or use the checkpoint's data and config)")


def training_only(field: str) -> bool:
    """A decoder setting that acts only in training mode: its dropout rates (``dropout``,
    ``att_dropout`` ...), which change no weight and no evaluation-mode output."""
    section, _, name = field.rpartition(".")
    return section.startswith("decoder") and name.endswith("dropout")


def _differences(old, new, prefix: str):
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            field = f"{prefix}.{key}" if prefix else key
            yield from _differences(old.get(key), new.get(key), field)
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for k, (a, b) in enumerate(zip(old, new)):
            yield from _differences(a, b, f"{prefix}[{k}]")
    elif old != new:
        yield prefix, old, new


def content_digest(value, h=None) -> str:
    """sha256 of everything a payload holds: tensors by dtype, shape and bytes, dict entries
    in key order, other leaves by repr. Stored in the checkpoint and recomputed on load, since
    torch.load reads a checkpoint with flipped bytes without complaint."""
    top = h is None
    h = hashlib.sha256() if top else h
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, dict):
        h.update(f"D{len(value)}".encode())
        for key in sorted(value, key=repr):
            h.update(repr(key).encode())
            content_digest(value[key], h)
    elif isinstance(value, (list, tuple)):
        h.update(f"L{len(value)}".encode())
        for item in value:
            content_digest(item, h)
    else:
        h.update(f"V{value!r}".encode())
    return h.hexdigest() if top else ""


def save_checkpoint(path: Path, payload: dict) -> None:
    payload = {"format": FORMAT, **{k: v for k, v in payload.items() if k != DIGEST}}
    serialized = io.BytesIO()  # torch.save on a full disk raises an opaque RuntimeError
    torch.save({**payload, DIGEST: content_digest(payload)}, serialized)
    with atomic_file(path) as tmp:
        tmp.write_bytes(serialized.getbuffer())


def load_checkpoint(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / "best.pt"
    payload = load_tensors(path, "checkpoint")  # a FIFO, a pickled object: named in one line
    if not isinstance(payload, dict) or payload.get("format") not in (FORMAT, *upgrade.OLD_FORMATS):
        raise CapstackError(f"{path}: not a capstack checkpoint (no {FORMAT!r} format tag)")
    check_depth(payload, path)
    saved_digest = payload.pop(DIGEST, None)  # checkpoints before checksums have none
    if saved_digest is not None and content_digest(payload) != saved_digest:
        raise CapstackError(f"{path}: damaged checkpoint: its content does not match the "
                            f"checksum saved with it (flipped or overwritten bytes); use another "
                            f"checkpoint (best.pt, last.pt) or train again")
    check_form(payload, path)
    payload["path"] = str(path)
    payload = upgrade.checkpoint(payload)  # once: whatever form it was saved in, today's
    payload["format"] = FORMAT
    check_contents(payload, path)
    return payload


def check_depth(payload: dict, path: Path) -> None:
    """Refuse a value nested deeper than MAX_DEPTH, naming its field (walked without
    recursion: the walk itself must not overflow)."""
    stack = [(payload, "", 0)]
    while stack:
        value, field, depth = stack.pop()
        if isinstance(value, dict):  # fields named down to the third level, list indices never
            children = [(v, _subfield(field, k) if depth < 3 else field)
                        for k, v in value.items()]
        elif isinstance(value, (list, tuple)):
            children = [(v, field) for v in value]
        else:
            continue
        if depth > MAX_DEPTH:
            raise CapstackError(f"{path}: {field} nests more than {MAX_DEPTH} levels deep "
                                f"(edited?)")
        stack += [(v, f, depth + 1) for v, f in children]


def _subfield(field: str, key) -> str:
    name = key if isinstance(key, (str, int)) else type(key).__name__
    return f"{field}.{name}" if field else str(name)


def _held(path: Path, container: dict, key, field: str, kind=None):
    """``container[key]``, refused unless there (and of ``kind``)."""
    if key not in container:
        raise CapstackError(f"{path}: no {field!r} (not a capstack checkpoint, or edited)")
    return _of_kind(path, container[key], field, kind)


def _of_kind(path: Path, value, field: str, kind):
    if kind is not None and (not isinstance(value, kind) or (isinstance(value, bool)
                                                             and kind in (int, NUMBER))):
        name = type(value).__name__
        raise CapstackError(f"{path}: {field} is {'an' if name[0] in 'aeiou' else 'a'} {name}, "
                            f"not {_KINDS[kind]} (edited?)")
    return value


def check_form(payload: dict, path: Path) -> None:
    """Refuse a checkpoint lacking a field the commands read, or holding one of another type,
    naming it: one saved without a checksum may have been edited, and would fail far from the
    file (a KeyError 'vocab', a size mismatch)."""
    for key, kind in HOLDS.items():
        _held(path, payload, key, key, kind)
    for field, kind, required in upgrade.old_checkpoint_fields(payload) or FIELDS:
        *sections, key = field.split(".")
        container = payload
        for section in sections:
            container = container[section]
        if required:
            _held(path, container, key, field, kind)
        elif container.get(key) is not None:
            _of_kind(path, container[key], field, kind)
    identity = payload["identity"]
    _held(path, _held(path, identity, "vocab", "identity.vocab", dict), "md5",
          "identity.vocab.md5", str)
    for k, store in enumerate(_held(path, identity, "stores", "identity.stores", list)):
        _held(path, _of_kind(path, store, f"identity.stores[{k}]", dict), "fingerprint",
              f"identity.stores[{k}].fingerprint")
    for k, store in enumerate(payload["stores"]):
        _of_kind(path, store, f"stores[{k}]", dict)
        _held(path, store, "path", f"stores[{k}].path", str)
        _held(path, store, "meta", f"stores[{k}].meta", dict)
    if payload["feature_dim"] < 1:
        raise CapstackError(f"{path}: feature_dim is {payload['feature_dim']}, not a positive "
                            f"int (edited?)")
    tensors_only(payload["model"], f"{path}: model")
    itow = payload["vocab"].get("itow")
    if isinstance(itow, list) and not all(isinstance(w, str) for w in itow):
        raise CapstackError(f"{path}: vocab.itow: not a list of words (edited?)")


def check_contents(payload: dict, path: Path) -> None:
    """The vocabulary is the one the identity names, and the weights fit the decoder the
    experiment describes (built on the meta device: shapes only, no memory)."""
    vocab = Vocabulary.from_json(payload["vocab"], f"{path}: vocab")
    named = payload["identity"]["vocab"]["md5"]
    if vocab.digest() != named:
        raise CapstackError(f"{path}: vocab: its words are not those of identity.vocab (md5 "
                            f"{vocab.digest()}, the identity names {named}) (edited?)")
    config = experiment_from_dict(payload["experiment"], str(path))
    name, state = config.decoder.name, payload["model"]

    def build():
        try:
            with torch.device("meta"):
                return config.build_decoder(len(vocab), payload["feature_dim"])
        except (RuntimeError, ValueError) as error:  # e.g. a negative size
            why = (str(error).splitlines() or [type(error).__name__])[0]
            raise CapstackError(f"{path}: experiment.decoder: cannot build the {name} decoder "
                                f"it describes ({why}) (edited?)") from None

    model = build()
    if first_misfit(state, model, counters=True) and not _converts(state, build()):
        require_fit(state, model, f"{path}: model",
                    f"the {name} decoder its experiment describes", counters=True,
                    hint="edited, or saved by a capstack whose decoder kept other weights?")


def _converts(state: dict, model) -> bool:
    """Whether ``model`` loads ``state`` after all: a decoder may convert an older layout of
    its weights on load (top_down's nn.LSTMCell weights, see trainer/modules/parts_lstm.py)."""
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except Exception:  # a conversion failing on these weights: a misfit, the caller names it
        return False
    return True
