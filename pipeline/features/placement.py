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
import logging
import os
from pathlib import Path

from pipeline.core.atomic import unused_sibling
from pipeline.core.errors import CapstackError
from pipeline.core.jsonfile import write_json
from pipeline.core.pointer import write_pointer
from pipeline.core.regular import NotRegular, read_text
from pipeline.features.stores import open_store, store_format

SUFFIX = {"lmdb": ".lmdb", "hdf5": ".h5"}
log = logging.getLogger(__name__)


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


def users_file(store: Path) -> Path:
    return store.with_name(store.name + ".users.json")


def read_users(store: Path) -> tuple[list[dict], str | None]:
    """The users recorded beside ``store`` (each ``{"stage": ..., "pointer": ...}``), and what
    is wrong with the file when it is damaged (None: read, or none yet). A damaged file is
    no reason to refuse a store, or to list none."""
    path = users_file(store)
    try:
        users = json.loads(read_text(path, "a store's users"))
    except FileNotFoundError:
        return [], None
    except NotRegular as error:
        return [], str(error)
    except (OSError, ValueError, RecursionError) as error:  # UnicodeDecodeError: a ValueError
        return [], f"{path}: damaged ({getattr(error, 'strerror', None) or error})"
    if not isinstance(users, list) or not all(
            isinstance(u, dict) and all(isinstance(u.get(k, ""), str) for k in ("stage", "pointer"))
            for u in users):
        return [], f"{path}: damaged (expected a list of {{\"stage\": ..., \"pointer\": ...}})"
    return users, None


def record_users(store: Path, users: list[dict]) -> None:
    """Write the users file; a root the disk refuses it on (read-only, full) is said, not
    fatal: the complete store beside it is reused all the same."""
    try:
        write_json(users_file(store), users)
    except CapstackError as error:
        why = error.__context__ if isinstance(error.__context__, OSError) else error
        log.warning("%s: this use of the store goes unrecorded (%s)", users_file(store),
                    getattr(why, "strerror", None) or why)


def publish(store: Path, fp: str, pointer: Path | None) -> None:
    """Record who used ``store`` (the running stage, the pointer) and write the pointer. A
    damaged users file is set aside (``.damaged``), said, and started again."""
    found, problem = read_users(store)
    users: list[dict] | None = found
    if problem is not None and users_file(store).is_file():
        kept = unused_sibling(users_file(store), ".damaged")
        try:
            os.replace(users_file(store), kept)
        except OSError as error:  # a read-only root: nothing to record there either
            log.warning("%s; left as it is (%s)", problem, error.strerror or error)
            users = None
        else:
            log.warning("%s; moved to %s, and the store's users are recorded afresh", problem,
                        kept)
    entry = {"stage": os.environ.get("CAPSTACK_STAGE", ""),
             "pointer": str(Path(pointer).resolve()) if pointer else ""}
    if users is not None and entry not in users:
        users.append(entry)
        record_users(store, users)
    if pointer:
        write_pointer(pointer, store, fp)
