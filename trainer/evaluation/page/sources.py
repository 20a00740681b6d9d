"""What an evaluation folder knows of its images, beyond the statistics the comparison resamples:
each image's captions, its references, its image file and its attention picture.

A run's evaluation (``capstack evaluate RUN``) finds them through what metrics.json records:
the captions in ``results_<split>.json``, the references and the image list in the prepared
captions folder of the run's experiment (``recipe.data.captions``: ``refs_<split>.json``,
``images_<split>.json``), the image root in the first feature store's metadata, and the
attention pictures in ``attention/<image id>.png``. A results file's evaluation (``capstack
evaluate RESULTS --refs REFS``) holds its captions (``results_given.json``) and names its
references file, but not where its images are. Whatever cannot be found is None with the reason,
said once on the page; nothing here raises over a missing picture.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.errors import CapstackError
from pipeline.core.jsonfile import read_json
from trainer.evaluation.evaluations import GIVEN_RESULTS, read_metrics_doc
from trainer.scoring.references import load_ranked_results, load_references


@dataclass
class Known:
    """One evaluation folder's captions, references, image files and attention pictures (each
    {image id: ...}; empty with the reason in ``missing`` when it could not be found)."""

    folder: Path
    doc: dict  # its metrics.json
    captions: dict[int, list[str]] = field(default_factory=dict)  # every rank, rank 1 first
    references: dict[int, list[str]] = field(default_factory=dict)
    images: dict[int, Path] = field(default_factory=dict)
    attention: dict[int, Path] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)  # "captions", ... -> why not

    @property
    def label(self) -> str:
        """As the comparison names it: approach (training)."""
        training = self.doc.get("training") or ""
        return f"{self.doc['approach']} ({training})" if training else str(self.doc["approach"])


def known(folder: str | Path) -> Known:
    """What evaluation ``folder`` (or its metrics.json) knows of its images."""
    folder = Path(folder)
    folder = folder.parent if folder.name == "metrics.json" else folder
    found = Known(folder, read_metrics_doc(folder / "metrics.json"))
    for what, finder in (("captions", _captions), ("references", _references),
                         ("images", _image_files)):
        try:
            setattr(found, what, finder(found))
        except (CapstackError, OSError, ValueError, KeyError, TypeError) as error:
            found.missing[what] = str(error)
    found.attention = {int(p.stem): p for p in sorted((folder / "attention").glob("*.png"))
                       if p.stem.isdigit()}
    return found


def results_file(folder: Path, doc: dict) -> Path:
    """The evaluation's captions: ``results_<split>.json`` of a run's evaluation, the kept
    ``results_given.json`` of a results file's."""
    candidates = ([folder / f"results_{doc['split']}.json"] if doc.get("split") else []) + \
        [folder / GIVEN_RESULTS]
    for path in candidates:
        if path.is_file():
            return path
    raise CapstackError(f"{folder}: no captions ({' or '.join(p.name for p in candidates)} not "
                        f"found); evaluate it again to keep them")


def _captions(found: Known) -> dict[int, list[str]]:
    return load_ranked_results(results_file(found.folder, found.doc))


def _references(found: Known) -> dict[int, list[str]]:
    """The references the evaluation scored against: a results file's named in metrics.json,
    a run's in its prepared captions folder."""
    doc = found.doc
    if doc.get("references"):
        return load_references(located(doc["references"], found.folder))
    prepared, split = _prepared(found)
    return load_references(prepared / f"refs_{split}.json")


def _image_files(found: Known) -> dict[int, Path]:
    """image id -> file: the prepared image list joined to the feature store's image root."""
    if found.doc.get("references"):
        raise CapstackError(f"{found.folder}: scored from a results file, which names no image "
                            f"files")
    prepared, split = _prepared(found)
    listing = read_json(prepared / f"images_{split}.json", "image list")
    root = _image_root(found)
    return {int(entry["image_id"]): root / entry.get("filepath", "") / entry["filename"]
            for entry in listing}


def _prepared(found: Known) -> tuple[Path, str]:
    """The prepared captions folder of the run's experiment and the split evaluated."""
    data = _experiment_data(found)
    split = found.doc.get("split") or found.doc.get("setting", {}).get("split") or "test"
    return located(data["captions"], found.folder), str(split)


def _experiment_data(found: Known) -> dict[str, Any]:
    """The ``data:`` section of the run's experiment: metrics.json's recipe, else the run's
    config.json."""
    recipe = found.doc.get("recipe")
    recipe = recipe[0] if isinstance(recipe, list) and recipe else recipe
    if isinstance(recipe, dict) and isinstance(recipe.get("data"), dict):
        return recipe["data"]
    checkpoint = found.doc.get("checkpoint")
    checkpoint = checkpoint[0] if isinstance(checkpoint, list) and checkpoint else checkpoint
    if not isinstance(checkpoint, str):
        raise CapstackError(f"{found.folder / 'metrics.json'}: records neither the run's "
                            f"experiment (recipe) nor its checkpoint")
    config = located(str(Path(checkpoint).parent / "config.json"), found.folder)
    return json.loads(config.read_text(encoding="utf-8"))["data"]


def _image_root(found: Known) -> Path:
    """The image root the first feature store was extracted from (its metadata)."""
    from pipeline.features.stores import open_store

    stores = _experiment_data(found).get("features") or []
    if not stores:
        raise CapstackError(f"{found.folder}: the run's experiment names no feature store")
    reader = open_store(located(stores[0], found.folder))
    try:
        root = reader.meta.get("image_root")
    finally:
        reader.close()
    if not root:
        raise CapstackError(f"{stores[0]}: the store records no image root (imported "
                            f"features name no image files)")
    return Path(root)


def located(recorded: str, folder: Path) -> Path:
    """A path metrics.json records, as it was written (relative to where evaluate ran: the
    working directory) or, from there not found, relative to the workdir that holds the
    evaluation (``evals/NAME`` -> two folders up)."""
    path = Path(recorded)
    if path.is_absolute() or path.exists():
        return path
    beside = folder.resolve().parent.parent / path
    if beside.exists():
        return beside
    raise CapstackError(f"{recorded}: not found (recorded by {folder / 'metrics.json'})")
