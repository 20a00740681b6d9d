"""The names of a detector's classes and attributes, for the store's metadata.

Visual Genome's ``objects_vocab.txt`` (1600 lines) and ``attributes_vocab.txt``
(400 lines) name class k and attribute k on line k (1-based: 0 is the
background, or "no attribute"); a line may list synonyms separated by commas and
is kept whole. A checkpoint ``capstack train-detector`` wrote carries its own
names. Without either, the store records ids only.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.core.errors import CapstackError


def read_vocabulary(path, expected: int, what: str) -> list[str]:
    """The ``expected`` names of a vocabulary file, one per line."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise CapstackError(f"{path}: {what} vocabulary not found")
    try:
        names = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    except UnicodeDecodeError as e:
        raise CapstackError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    names = [n for n in names if n]
    if len(names) != expected:
        raise CapstackError(f"{path}: {len(names)} {what} names, the detector has {expected} "
                            f"(its {what} count without the background / 'no attribute')")
    return names


def label_names(loaded, objects_vocab: str | None,
                attributes_vocab: str | None) -> tuple[list[str] | None, list[str] | None]:
    """(object names, attribute names) for ids 1.., from the files given or the checkpoint."""
    config = loaded.detector.config
    objects = (read_vocabulary(objects_vocab, config.num_classes - 1, "object")
               if objects_vocab else loaded.objects)
    attributes = None
    if config.num_attributes:
        attributes = (read_vocabulary(attributes_vocab, config.num_attributes - 1, "attribute")
                      if attributes_vocab else loaded.attributes)
    elif attributes_vocab:
        raise CapstackError(f"{attributes_vocab}: the detector has no attribute head")
    return objects, attributes
