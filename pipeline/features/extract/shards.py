"""An extraction split over torchrun's processes: one shard per rank, then one store.

Rank ``r`` of ``W`` extracts every W-th image (from the r-th) into
``<store>.shard-r-of-W<suffix>``, a store like any other (written through
``.partial``, so a killed rank leaves its shard resumable). When every shard is
complete, rank 0 copies their records into the store, in the dataset's image
order, which is the order a single process writes: the merged store holds the
same records under the same fingerprint as a one-process extraction. The
shards are deleted only once the store is complete; a merge stopped half-way
resumes like any partial store.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

from pipeline.core.errors import CapstackError
from pipeline.features.stores import create_writer, open_store, remove_store

MERGE_CHUNK = 64  # records per commit while merging


def shard_path(store: Path, rank: int, world: int) -> Path:
    return store.with_name(f"{store.stem}.shard-{rank}-of-{world}{store.suffix}")


def shard_items(items: Sequence, rank: int, world: int) -> list:
    """Rank ``rank``'s images: every ``world``-th, from the ``rank``-th (balanced sizes and
    costs)."""
    return list(items[rank::world])


def existing_shards(store: Path) -> dict[Path, int]:
    """Shards (complete or partial) of ``store`` on disk, with the world size that made them."""
    pattern = re.compile(re.escape(store.stem) + r"\.shard-(\d+)-of-(\d+)" + re.escape(store.suffix)
                         + r"(\.partial)?$")
    found = {}
    for path in store.parent.glob(f"{store.stem}.shard-*"):
        match = pattern.match(path.name)
        if match:
            found[path] = int(match.group(2))
    return found


def check_shards_fit(store: Path, world: int) -> None:
    """Refuse to start W shards next to the unfinished shards of another number of processes."""
    other = sorted({w for w in existing_shards(store).values() if w != world})
    if other:
        raise CapstackError(
            f"{store}: an unfinished {other[0]}-process extraction left its shards "
            f"({shard_path(store, 0, other[0]).name} ...); rerun it with --nproc {other[0]} to "
            f"resume them, or delete them to start over with {world}")


def merge_shards(store: Path, meta: dict, order: Sequence[int], world: int,
                 format: str | None = None, progress: bool = True) -> Path:
    """Copy the ``world`` complete shards' records into ``store`` in ``order``; delete them."""
    from tqdm import tqdm

    shards = [shard_path(store, r, world) for r in range(world)]
    missing = [s for s in shards if not s.exists()]
    if missing:
        raise CapstackError(f"{missing[0]}: shard not complete; rerun the extraction to finish it")
    readers = [open_store(s, format) for s in shards]
    holder, skipped = {}, {}
    for reader in readers:
        holder.update({int(i): reader for i in reader.ids()})
        skipped.update({int(i): why for i, why in reader.meta.get("skipped", {}).items()})
    lost = [i for i in order if int(i) not in holder and int(i) not in skipped]
    if lost:
        raise CapstackError(f"{store}: image {lost[0]} is in no shard of {shards[0].parent} "
                            f"(were the shards made from another dataset?)")
    writer = create_writer(store, meta, format)
    try:
        todo = [int(i) for i in order if int(i) not in writer.done]
        with tqdm(total=len(todo), desc=f"merge {world} shards", unit="img",
                  disable=not progress) as bar:
            for start in range(0, len(todo), MERGE_CHUNK):
                chunk = todo[start:start + MERGE_CHUNK]
                writer.write([(i, holder[i].get(i)) for i in chunk if i in holder],
                             [(i, skipped[i]) for i in chunk if i in skipped])
                bar.update(len(chunk))
        writer.finish()
    finally:
        writer.close()
        for reader in readers:
            reader.close()
    for shard in shards:
        remove_store(shard)
    return store
