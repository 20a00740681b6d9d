"""Checkpoints: written atomically, usable on their own, refused on other data.

A checkpoint holds the experiment config, the decoder's name and config, the
vocabulary and the metadata of the stores it was trained on, besides the
weights and the optimiser, scheduler and objective states that make a resume
exact. Resuming or evaluating against stores, a vocabulary or a decoder config
other than the checkpoint's is refused, naming the field and both values.
Checkpoints of the first format (flat experiment files) are read through
:func:`upgrade`. Every checkpoint carries a sha256 of its content, checked on
load (:func:`content_digest`).
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import torch

from pipeline.captions.vocab import digest_words
from pipeline.core.atomic import atomic_file
from pipeline.core.errors import CapstackError

FORMAT = "capstack-checkpoint-2"
FIRST_FORMAT = "capstack-checkpoint-1"  # flat experiment: decoder_config, train.objective
DIGEST = "content_sha256"  # what content_digest gave at save time


def identity(decoder: str, decoder_config: dict, vocab_itow: list[str], stores: list[dict]) -> dict:
    """What must match between a checkpoint and the data it is used with."""
    return {
        "decoder": {"name": decoder, **decoder_config},
        "vocab": {"size": len(vocab_itow),
                  "md5": digest_words(vocab_itow)},
        "stores": [{"fingerprint": s["fingerprint"]} for s in stores],
    }


def check_identity(saved: dict, current: dict, path: Path) -> None:
    """Raise naming the first differing field, e.g. ``stores[0].fingerprint: checkpoint a, now b``."""
    for field, old, new in _differences(saved, current, ""):
        raise CapstackError(f"{path}: {field}: the checkpoint has {old!r}, this run has {new!r} "
                            f"(train a new experiment, or use the checkpoint's data and config)")


def _differences(old, new, prefix: str):
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            yield from _differences(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else key)
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
    if not path.is_file():
        raise CapstackError(f"{path}: checkpoint not found")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a truncated or foreign file: say which
        raise CapstackError(f"{path}: not a readable checkpoint ({error})") from None
    if not isinstance(payload, dict) or payload.get("format") not in (FORMAT, FIRST_FORMAT):
        raise CapstackError(f"{path}: not a capstack checkpoint (no {FORMAT!r} format tag)")
    saved_digest = payload.pop(DIGEST, None)  # checkpoints before checksums have none
    if saved_digest is not None and content_digest(payload) != saved_digest:
        raise CapstackError(f"{path}: damaged checkpoint: its content does not match the "
                            f"checksum saved with it (flipped or overwritten bytes); use another "
                            f"checkpoint (best.pt, last.pt) or train again")
    payload["path"] = str(path)
    return upgrade(payload) if payload["format"] == FIRST_FORMAT else payload


def upgrade(payload: dict) -> dict:
    """A first-format checkpoint in today's form: the experiment's components, the identity's
    decoder as one mapping, no objective state (no objective owned any then)."""
    from trainer.config import new_form

    old = payload["identity"]
    payload["experiment"] = new_form(payload["experiment"])
    payload["identity"] = {"decoder": {"name": old["decoder"], **old["decoder_config"]},
                           "vocab": old["vocab"],
                           "stores": [{"fingerprint": s["fingerprint"]} for s in old["stores"]]}
    payload.setdefault("objective", {"modules": {}, "optimizers": {}, "extra": {}})
    payload["format"] = FORMAT
    return payload
