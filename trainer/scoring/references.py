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
    """A COCO results file (JSON list of {"image_id": int, "caption": str}) as {id: caption}.
    Entries with a ``rank`` (n captions per image, as ``capstack evaluate`` writes them) count
    by their rank 1 alone."""
    data = read_json(path)
    if not isinstance(data, list):
        raise CapstackError(f"{where(path)}: expected a JSON list of results, "
                            f"got {type(data).__name__}")
    results: dict[int, str] = {}
    for i, entry in enumerate(data):
        image_id = _field(path, entry, i, "entry", "image_id", _is_int, "an integer")
        caption = _field(path, entry, i, "entry", "caption",
                         lambda v: isinstance(v, str), "a string")
        if "rank" in entry and _field(path, entry, i, "entry", "rank",
                                      lambda v: _is_int(v) and v >= 1, "a whole number from 1") > 1:
            continue
        if image_id in results:
            raise CapstackError(f"{where(path, f'entry {i}')}: duplicate image_id {image_id}")
        results[image_id] = caption
    return results


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
