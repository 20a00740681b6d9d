"""``capstack export-features``: a capstack store in another toolkit's layout.

So that capstack's own stores (extracted or imported) feed other captioning
codebases: ``butd-tsv`` (one TSV, the layout of bottom-up-attention's
generate_tsv.py) and ``rtl-npz`` (self-critical.pytorch's ``<out>_att``,
``<out>_fc``, ``<out>_box`` folders). Features are written as float32, as
those layouts are. Everything is written under ``.partial`` names and renamed
into place at the end: an interrupted export leaves nothing that looks whole,
and an existing OUT is never overwritten.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pipeline.core.errors import CapstackError
from pipeline.features.interchange.formats import WRITERS
from pipeline.features.stores import open_store


def export_features(store_path: Path, layout: str, out: Path, progress: bool = True) -> list[Path]:
    """Write every record of the store at ``store_path`` to ``out`` in ``layout``; the paths
    made."""
    from tqdm import tqdm

    if layout not in WRITERS:
        raise CapstackError(f"export format {layout!r}: choose {', '.join(WRITERS)}")
    Writer = WRITERS.get(layout)
    store = open_store(store_path)
    targets = Writer.targets(store, Path(out))
    for target in targets:
        if target.exists():
            raise CapstackError(f"{target}: already exists; export to another OUT")
    partials = [t.with_name(t.name + ".partial") for t in targets]
    for partial in partials:
        _remove(partial)
    writer = Writer(store, partials)
    try:
        for image_id in tqdm(sorted(int(i) for i in store.ids()), desc=f"export {layout}",
                             unit="img", disable=not progress):
            writer.write(image_id, store.get(image_id))
    finally:
        writer.close()
    for partial, target in zip(partials, targets):
        os.replace(partial, target)
    return targets


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
