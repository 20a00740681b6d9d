"""Image sizes for formats that do not record them, read from the images' headers."""

from __future__ import annotations

from pathlib import Path

from pipeline.captions.karpathy import KarpathyDataset
from pipeline.features.interchange.formats.base import BadRow


class ImageSizes:
    """(height, width) of a dataset image from its file under ``image_root`` (the header only)."""

    def __init__(self, dataset: KarpathyDataset, image_root: Path):
        self.root = Path(image_root)
        self.relpaths = {im.image_id: im.relpath for im in dataset.images}

    def __call__(self, image_id: int) -> tuple[int, int]:
        from PIL import Image, UnidentifiedImageError

        path = self.root / self.relpaths[image_id]
        if not path.is_file():  # a FIFO or a device would block Image.open
            raise BadRow(f"its image {path} is missing or not a regular file")
        try:
            with Image.open(path) as image:
                width, height = image.size
        except (OSError, UnidentifiedImageError) as error:
            raise BadRow(f"its image {path} gives no size ({error})") from None
        return height, width
