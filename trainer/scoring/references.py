"""The captions scored and the references they are scored against: COCO files, checked.

A results file is COCO's (a JSON list of ``{"image_id", "caption"}``); a references file
is COCO's caption annotations (prepare's ``refs_{split}.json``). A mistake in either is
named by file, entry and field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.core.errors import CapstackError, where
from pipeline.core.jsonfile import read_json


def check_inputs(candidates: dict[int, str],
                  references: dict[int, list[str]]) -> dict[int, list[str]]:
    """References restricted to the candidates' ids; user mistakes raise."""
    if not candidates:
        raise CapstackError("no candidate captions to score")
    for image_id in candidates:
        if not references.get(image_id):
            raise CapstackError(f"image_id {image_id}: candidate caption has no references")
    return {image_id: list(references[image_id]) for image_id in candidates}


def first_references(references: dict[int, list[str]], n: int) -> dict[int, list[str]]:
    """Each image's first ``n`` references, in their file's order (0: all)."""
    if n < 0:
        raise CapstackError(f"max_refs: must be 0 (all) or more, got {n}")
    return {k: list(v[:n] if n else v) for k, v in references.items()}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _field(path, entry: Any, index: int, kind: str, name: str, check, expected: str) -> Any:
    """``entry[name]`` after checking it; errors name the file, entry index and field."""
    if not isinstance(entry, dict):
        raise CapstackError(f"{where(path, f'{kind} {index}')}: not an object")
    if name not in entry:
        raise CapstackError(f"{where(path, f'{kind} {index}')}: missing {name!r}")
    value = entry[name]
    if not check(value):
        raise CapstackError(f"{where(path, f'{kind} {index}')}: {name!r} must be {expected}, "
                            f"got {value!r}")
    return value


def load_results(path: str | Path) -> dict[int, str]:
    """A results file (:func:`load_ranked_results`) as {id: caption}: each image's rank 1."""
    return {image_id: captions[0] for image_id, captions in load_ranked_results(path).items()}


def load_ranked_results(path: str | Path) -> dict[int, list[str]]:
    """A results file as {id: [caption, ...]}, each image's captions in rank order (one
    without ranks). Read: COCO's results format (a JSON list of {"image_id": int, "caption":
    str}, other keys ignored: self-critical.pytorch's ``vis/vis.json`` with its perplexity and
    file path); with a ``rank`` on entries (n captions per image, as ``capstack evaluate``
    writes them), every rank, once each, rank 1 present; and self-critical.pytorch's
    ``eval_results/<id>_<split>.json`` ({"overall": ..., "imgToEval": {id: {"caption": ...,
    metrics}}})."""
    data = read_json(path)
    if isinstance(data, dict) and isinstance(data.get("imgToEval"), dict):
        data = _per_image_entries(path, data["imgToEval"])
    if not isinstance(data, list):
        raise CapstackError(f"{where(path)}: expected a JSON list of results (COCO's format: "
                            f"{{\"image_id\", \"caption\"}} each) or self-critical.pytorch's "
                            f"eval output ({{\"overall\", \"imgToEval\"}}), got "
                            f"{type(data).__name__}")
    ranked: dict[int, dict[int, str]] = {}
    for i, entry in enumerate(data):
        image_id = _field(path, entry, i, "entry", "image_id", _is_int, "an integer")
        caption = _field(path, entry, i, "entry", "caption",
                         lambda v: isinstance(v, str), "a string")
        rank = _field(path, entry, i, "entry", "rank", lambda v: _is_int(v) and v >= 1,
                      "a whole number from 1") if "rank" in entry else 1
        if rank in ranked.setdefault(image_id, {}):
            what = f"rank {rank} of image_id {image_id} twice" if "rank" in entry else \
                f"duplicate image_id {image_id}"
            raise CapstackError(f"{where(path, f'entry {i}')}: {what}")
        ranked[image_id][rank] = caption
    unranked = next((k for k, captions in ranked.items() if 1 not in captions), None)
    if unranked is not None:
        raise CapstackError(f"{where(path)}: image_id {unranked} has captions but none of "
                            f"rank 1 (the one scored)")
    return {k: [captions[r] for r in sorted(captions)] for k, captions in ranked.items()}


def _per_image_entries(path, per_image: dict) -> list:
    """self-critical.pytorch's ``imgToEval`` ({id as text: {"image_id", "caption", metrics}})
    as COCO's results list; an entry without ``image_id`` takes its key's."""
    entries = []
    for key, entry in per_image.items():
        if not isinstance(entry, dict):
            raise CapstackError(f"{where(path, f'imgToEval.{key}')}: not an object")
        image_id = entry.get("image_id", int(key) if str(key).isdigit() else key)
        entries.append({"image_id": image_id,
                        **({"caption": entry["caption"]} if "caption" in entry else {})})
    return entries


def _image_ids(path, images: Any) -> set[int]:
    if not isinstance(images, list):
        raise CapstackError(f"{where(path, 'images')}: must be a list")
    return {_field(path, im, i, "image", "id", _is_int, "an integer")
            for i, im in enumerate(images)}


def load_references(path: str | Path) -> dict[int, list[str]]:
    """A COCO caption-annotation file (prepare's refs_{split}.json) as {id: [captions]}."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise CapstackError(f"{where(path)}: expected a JSON object with 'annotations'")
    annotations = data.get("annotations")
    if not isinstance(annotations, list):
        raise CapstackError(f"{where(path, 'annotations')}: missing or not a list")
    known = _image_ids(path, data["images"]) if "images" in data else None
    references: dict[int, list[str]] = {}
    for i, ann in enumerate(annotations):
        image_id = _field(path, ann, i, "annotation", "image_id", _is_int, "an integer")
        caption = _field(path, ann, i, "annotation", "caption",
                         lambda v: isinstance(v, str), "a string")
        if known is not None and image_id not in known:
            raise CapstackError(f"{where(path, f'annotation {i}')}: image_id {image_id} "
                                "is not in 'images'")
        references.setdefault(image_id, []).append(caption)
    return references
