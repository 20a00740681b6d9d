"""The files a page shows, beside its index.html: thumbnails of the images, copies of the
evaluations' attention pictures and training curves. The page links them by relative paths, so
the folder moves (or is zipped, or opened offline) whole.

Each file is written atomically; a thumbnail already there and newer than its image is kept
(a report written again over 5,000 images reads none of them twice). An image that does not
open is left without a thumbnail, and the reason returned: the page says it once.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from pipeline.core.atomic import atomic_file

THUMBNAILS = "thumbnails"
THUMBNAIL_SIZE = 240  # pixels, the longer side: sharp at the page's 120 px on a 2x screen
QUALITY = 82


def thumbnail(image: Path, out_dir: Path) -> tuple[str | None, str]:
    """A JPEG thumbnail of ``image`` in ``out_dir/thumbnails``, named by the file's name and a
    digest of its path (two datasets' ``1.jpg`` stay apart): (its path relative to
    ``out_dir``, "") or (None, why not)."""
    from PIL import Image, UnidentifiedImageError

    name = f"{image.stem[:40]}-{hashlib.md5(str(image).encode()).hexdigest()[:10]}.jpg"
    relative = f"{THUMBNAILS}/{name}"
    target = out_dir / relative
    try:
        if target.is_file() and target.stat().st_mtime >= image.stat().st_mtime:
            return relative, ""
        with Image.open(image) as opened:
            opened.draft("RGB", (THUMBNAIL_SIZE, THUMBNAIL_SIZE))  # a JPEG decoded small
            small = opened.convert("RGB")
        small.thumbnail((THUMBNAIL_SIZE, THUMBNAIL_SIZE))
        with atomic_file(target) as tmp:
            small.save(tmp, format="JPEG", quality=QUALITY)
    except FileNotFoundError:
        return None, f"{image}: image file not found"
    except (OSError, UnidentifiedImageError, ValueError) as error:
        return None, f"{image}: cannot read the image ({error})"
    return relative, ""


def copied(source: Path, out_dir: Path, relative: str) -> str:
    """``source`` copied to ``out_dir/relative`` (atomically); ``relative``."""
    with atomic_file(out_dir / relative) as tmp:
        shutil.copyfile(source, tmp)
    return relative
