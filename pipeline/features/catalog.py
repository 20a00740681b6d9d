"""Checks over stores: does a store cover a dataset, and what lives under the shared root."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.captions.karpathy import load_karpathy
from pipeline.core.errors import CapstackError
from pipeline.features.placement import read_users
from pipeline.features.stores import open_store
from pipeline.features.stores.schema import finite


def verify_store(store_path: str | Path, dataset_json: str | Path | None = None) -> dict:
    """Raise naming the first dataset image the store lacks; images skipped at
    extraction (unreadable files) are counted, not fatal. The dataset is the one the store
    records (its ``dataset``: the json it was extracted or imported from) unless
    ``dataset_json`` names another."""
    store = open_store(store_path)
    if dataset_json is None:
        dataset_json = recorded_dataset(store.path, store.meta)
    dataset = load_karpathy(dataset_json, images_inside_root=False)  # opens no image
    skipped = store.meta.get("skipped", {})
    lacking = [im.image_id for im in dataset.images
               if im.image_id not in store and str(im.image_id) not in skipped]
    if lacking:
        raise CapstackError(
            f"{store.path}: lacks image {lacking[0]} of {dataset_json} ({len(lacking)} of "
            f"{len(dataset.images)} images missing; was it made from another dataset?)")
    n_skipped = sum(str(im.image_id) in skipped for im in dataset.images)
    return {"store": str(store.path), "images": len(dataset.images), "skipped": n_skipped,
            "dataset": str(dataset_json)}


def recorded_dataset(store_path: Path, meta: dict) -> Path:
    """The dataset json a store records it was made from, when it is still there."""
    recorded = meta.get("dataset")
    if not isinstance(recorded, str) or not recorded:
        raise CapstackError(f"{store_path}: records no dataset (made before stores kept it): "
                            f"pass --dataset DATASET_JSON")
    if not Path(recorded).is_file():
        raise CapstackError(f"{store_path}: the dataset it was made from, {recorded}, is not "
                            f"there: pass --dataset DATASET_JSON")
    return Path(recorded)


def check_every_record(store_path: str | Path, progress: bool = True) -> tuple[int, str | None]:
    """Read every record of the store (a read checks the record's checksum); raise naming the
    first that is damaged, has no regions, or whose floating-point fields hold NaN or infinity
    (training on it would give a NaN loss, or a model that learned nothing). The number of
    records read, and the kind of checksum checked (None for a store made before stores kept
    them)."""
    from tqdm import tqdm

    store = open_store(store_path)
    ids = store.ids()
    for image_id in tqdm(ids, desc=f"verify {store.path.name}", unit="record",
                         disable=not progress):
        record = store.get(int(image_id))
        if not record.num:
            raise CapstackError(f"{store.path}: image {int(image_id)}: a record with no regions "
                                f"(0 rows): training has nothing to attend to; import or "
                                f"extract the store again (capstack skips such images now)")
        for name, values in record.fields.items():
            if np.issubdtype(values.dtype, np.floating) and not finite(values):
                bad = int((~np.isfinite(values)).sum())
                raise CapstackError(f"{store.path}: image {int(image_id)}: {name}: {bad} of "
                                    f"{values.size} values are NaN or infinite")
    return len(ids), store.meta.get("record_checksum")


def size_bytes(path: Path) -> int:
    """Bytes of a file, or of every file below a folder."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _users(store: Path, row: dict) -> list[str]:
    """Who used ``store``; a damaged users file is the row's ``users_problem``."""
    users, problem = read_users(store)
    if problem is not None:
        row["users_problem"] = problem
    return [u.get("stage") or u.get("pointer") or "a direct command" for u in users]


def list_stores(root: Path) -> list[dict]:
    rows: list[dict] = []
    if not root.is_dir():
        return rows
    for path in sorted(root.iterdir()):
        if path.suffix not in (".lmdb", ".h5", ".hdf5"):
            continue
        row: dict = {"name": path.name, "size_mb": size_bytes(path) / 2**20}
        row["users"] = _users(path, row)
        try:
            store = open_store(path)
            row.update(kind=store.schema.describe(), count=len(store))
            store.close()
        except CapstackError as e:
            row.update(kind="unreadable", count=0, problem=str(e))
        rows.append(row)
    for path in sorted(root.glob("*.partial")):
        row = {"name": path.name, "kind": "unfinished", "count": 0,
               "size_mb": size_bytes(path) / 2**20}
        row["users"] = _users(Path(str(path)[:-len(".partial")]), row)
        rows.append(row)
    return rows
