"""Rendering a :class:`Scene` to an RGB picture, and the tight box of every object.

Each object is drawn as a mask first and pasted in its colour through it; the
object's box is the bounding box of that mask, so boxes fit the drawn pixels
exactly (no antialiasing: an object's pixels are exactly its colour). Boxes are
``[x1, y1, x2, y2]`` in pixels, inclusive-exclusive: the object covers columns
``x1 .. x2-1`` and rows ``y1 .. y2-1``.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from .outlines import OUTLINES
from .scene import Background, Obj, Scene

NOISE_SIGMA = 7.0        # grey levels of the "noise" background texture
GRADIENT_DARKENING = 0.12  # the far end of a gradient is this much darker


def _noise_background(bg: Background, size: int) -> Image.Image:
    rng = np.random.default_rng(bg.texture_seed)
    noise = rng.normal(0.0, NOISE_SIGMA, size=(size, size, 1))
    pixels = np.clip(np.asarray(bg.rgb, dtype=np.float64) + noise, 0, 255)
    return Image.fromarray(pixels.astype(np.uint8), "RGB")


def _gradient_background(bg: Background, size: int) -> Image.Image:
    ramp = np.linspace(0.0, 1.0, size)
    if bg.direction == "down":
        t = np.broadcast_to(ramp[:, None], (size, size))
    elif bg.direction == "right":
        t = np.broadcast_to(ramp[None, :], (size, size))
    else:
        t = (ramp[:, None] + ramp[None, :]) / 2
    shade = 1.0 - GRADIENT_DARKENING * t
    pixels = np.asarray(bg.rgb, dtype=np.float64)[None, None, :] * shade[:, :, None]
    return Image.fromarray(np.round(pixels).astype(np.uint8), "RGB")


def render_background(bg: Background, size: int) -> Image.Image:
    if bg.style == "noise":
        return _noise_background(bg, size)
    if bg.style == "gradient":
        return _gradient_background(bg, size)
    return Image.new("RGB", (size, size), bg.rgb)


def object_mask(obj: Obj, size: int) -> Image.Image:
    """A ``size`` x ``size`` mask, 255 where the object is drawn."""
    mask = Image.new("L", (size, size), 0)
    pen = ImageDraw.Draw(mask)
    placed = OUTLINES[obj.shape].placed(obj.cx, obj.cy, obj.r)
    if placed.ellipse_box is not None:
        pen.ellipse(placed.ellipse_box, fill=255)
    else:
        pen.polygon(placed.points, fill=255)
    return mask


def render(scene: Scene) -> tuple[Image.Image, list[list[int]]]:
    """The picture and, per object in scene order, its tight inclusive-exclusive box."""
    image = render_background(scene.background, scene.size)
    boxes = []
    for obj in scene.objects:
        mask = object_mask(obj, scene.size)
        box = mask.getbbox()
        if box is None:  # cannot happen for size >= 32, but never write an empty box
            x, y = int(obj.cx), int(obj.cy)
            box = (x, y, x + 1, y + 1)
        image.paste(obj.rgb, (0, 0, scene.size, scene.size), mask)
        boxes.append([int(v) for v in box])
    return image, boxes
