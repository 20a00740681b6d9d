"""Where a store lives and who uses it: what an extraction and an import share.

A store made by capstack is named ``<kind>-<source>-<fingerprint>`` (e.g.
``regions-resnet10-...`` from an extractor, ``regions-butd-tsv-...`` from an
import) under the shared root (``--features-root``, else ``$CAPSTACK_FEATURES``,
else ``~/.cache/capstack/features``), unless ``--out`` names it. A complete
store with the same fingerprint is reused, never made twice. ``--pointer
FILE`` writes a small json naming the store, which is what a stage declares as
its out (the store itself is shared, outside any workdir). Each store keeps
beside it ``<name>.users.json``: the pointers and stages that used it, for
``capstack stores``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipeline.core.errors import CapstackError
from pipeline.core.jsonfile import write_json
from pipeline.core.pointer import write_pointer
from pipeline.core.regular import NotRegular, read_text
from pipeline.features.stores import open_store, store_format

SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5"}


def features_root(explicit: str | Path | None = None) -> Path:
    """The shared stores' folder: ``explicit`` (--features-root), else $CAPSTACK_FEATURES, else
    ~/.cache/capstack/features; one that exists and is not a folder is named as such."""
    env = os.environ.get("CAPSTACK_FEATURES")
    if explicit:
        root, named = Path(explicit).expanduser(), "--features-root"
    elif env:
        root, named = Path(env).expanduser(), "$CAPSTACK_FEATURES"
    else:
        root, named = Path.home() / ".cache" / "capstack" / "features", "the default store root"
    if root.exists() and not root.is_dir():
        raise CapstackError(f"{root}: {named} names a file, not a folder of feature stores; "
                            f"point it at a folder (it is made when missing)")
    return root


def store_path(name: str, fp: str, *, out: Path | None, root: Path,
               format: str | None) -> Path:
    """``out`` when given (its suffix checked before any work), else ``root/<name>-<fp>.lmdb``."""
    if out:
        store_format(out, format)
        return Path(out)
    fmt = format or "lmdb"
    store_format(f"x{SUFFIX.get(fmt, '')}", fmt)
    return root / f"{name}-{fp}{SUFFIX[fmt]}"


def check_reusable(path: Path, fp: str) -> Path:
    """``path`` when the complete store there holds these features; else refuse."""
    store = open_store(path)
    if store.meta["fingerprint"] != fp:
        raise CapstackError(f"{path}: holds other features (fingerprint "
                            f"{store.meta['fingerprint']}, these settings give {fp}); delete it "
                            f"or choose another --out")
    store.close()
    return path


def publish(store: Path, fp: str, pointer: Path | None) -> None:
    """Record who used ``store`` (the running stage, the pointer) and write the pointer."""
    users_file = store.with_name(store.name + ".users.json")
    try:
        users = json.loads(read_text(users_file, "a store's users"))
    except (OSError, ValueError, NotRegular):
        users = []
    entry = {"stage": os.environ.get("CAPSTACK_STAGE", ""),
             "pointer": str(Path(pointer).resolve()) if pointer else ""}
    if entry not in users:
        users.append(entry)
        write_json(users_file, users)
    if pointer:
        write_pointer(pointer, store, fp)
