"""What one image shows: its objects (shape, colour, size class, place) and its background.

A :class:`Scene` is sampled from the image's own generator and is everything
the renderer and the caption grammar need, so the picture and its captions
describe the same thing by construction. Objects are placed by rejection
sampling so that no two of them overlap: their extents (see ``outlines``) are
kept a small gap apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .chance import Weighted, coin, one_of, uniform
from .outlines import OUTLINES, SHAPES

# Object colours: saturated and far apart, so that each is unmistakable on a light background.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 35),
    "orange": (250, 140, 0),
    "yellow": (235, 205, 0),
    "green": (30, 155, 55),
    "blue": (35, 75, 215),
    "purple": (135, 50, 175),
    "pink": (245, 110, 185),
    "brown": (125, 75, 30),
    "black": (20, 20, 20),
    "gray": (125, 125, 125),
}
COLOR_NAMES: tuple[str, ...] = tuple(COLORS)

# Light background colours; none of them is close to an object colour.
BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "white": (250, 250, 250),
    "cream": (248, 240, 215),
    "light gray": (222, 222, 222),
    "light blue": (212, 230, 250),
}

# Object radius as a fraction of the image side, per size class.
SIZE_RADIUS: dict[str, float] = {"small": 0.075, "medium": 0.11, "large": 0.155}
SIZE_ORDER: tuple[str, ...] = ("small", "medium", "large")

OBJECT_COUNTS = Weighted.of({1: 15, 2: 30, 3: 30, 4: 25})
SIZE_CLASSES = Weighted.of({"small": 35, "medium": 35, "large": 30})
BACKGROUND_COLORS = Weighted.of({"white": 55, "cream": 15, "light gray": 15, "light blue": 15})
BACKGROUND_STYLES = Weighted.of({"plain": 70, "noise": 15, "gradient": 15})
GRADIENT_DIRECTIONS = ("down", "right", "diagonal")

TWIN_PROBABILITY = 0.15   # a new object repeats an earlier object's shape (and maybe colour)
PLACEMENT_TRIES = 60


@dataclass(frozen=True)
class Obj:
    """One drawn object. ``(cx, cy)`` is its centre in pixels (y points down), ``r`` its radius."""

    shape: str
    color: str
    size: str
    cx: float
    cy: float
    r: float

    @property
    def extent(self) -> float:
        """Distance from the centre to the farthest drawn point."""
        return self.r * OUTLINES[self.shape].extent

    @property
    def rgb(self) -> tuple[int, int, int]:
        return COLORS[self.color]


@dataclass(frozen=True)
class Background:
    color: str            # a key of BACKGROUNDS
    style: str            # "plain", "noise" or "gradient"
    direction: str = ""   # for gradients: one of GRADIENT_DIRECTIONS
    texture_seed: int = 0  # for noise: the renderer draws the noise from this seed

    @property
    def rgb(self) -> tuple[int, int, int]:
        return BACKGROUNDS[self.color]


@dataclass(frozen=True)
class Scene:
    size: int
    objects: tuple[Obj, ...]
    background: Background


def gap_between(a: Obj, b: Obj) -> float:
    """Free space between the two objects' extents (negative when they could overlap)."""
    return math.hypot(a.cx - b.cx, a.cy - b.cy) - a.extent - b.extent


def _sample_background(rng: np.random.Generator) -> Background:
    color = BACKGROUND_COLORS.pick(rng)
    style = BACKGROUND_STYLES.pick(rng)
    direction = one_of(rng, GRADIENT_DIRECTIONS) if style == "gradient" else ""
    texture_seed = int(rng.integers(2**31)) if style == "noise" else 0
    return Background(color, style, direction, texture_seed)


def _sample_kind(rng: np.random.Generator, earlier: list[Obj]) -> tuple[str, str]:
    """Shape and colour; sometimes a twin of an earlier object, so that counts like
    "two red circles" occur."""
    if earlier and coin(rng, TWIN_PROBABILITY):
        model = one_of(rng, earlier)
        color = model.color if coin(rng, 0.5) else one_of(rng, COLOR_NAMES)
        return model.shape, color
    return one_of(rng, SHAPES), one_of(rng, COLOR_NAMES)


def _place(rng: np.random.Generator, shape: str, size_class: str, image_size: int,
           placed: list[Obj]) -> Obj | None:
    """An object that overlaps none of ``placed``, or None after ``PLACEMENT_TRIES`` tries."""
    r = SIZE_RADIUS[size_class] * image_size * uniform(rng, 0.92, 1.08)
    extent = r * OUTLINES[shape].extent
    margin = extent + 1.0
    min_gap = 0.03 * image_size
    for _ in range(PLACEMENT_TRIES):
        candidate = Obj(shape, "", size_class,
                        uniform(rng, margin, image_size - margin),
                        uniform(rng, margin, image_size - margin), r)
        if all(gap_between(candidate, other) >= min_gap for other in placed):
            return candidate
    return None


def sample_scene(rng: np.random.Generator, size: int) -> Scene:
    """1-4 non-overlapping objects on a light background.

    When an object finds no free place it is tried once more one size class
    smaller, then left out, so a crowded scene may hold fewer objects than were
    asked for; the captions count what is actually drawn.
    """
    background = _sample_background(rng)
    wanted = OBJECT_COUNTS.pick(rng)
    objects: list[Obj] = []
    for _ in range(wanted):
        shape, color = _sample_kind(rng, objects)
        size_class = SIZE_CLASSES.pick(rng)
        placed = _place(rng, shape, size_class, size, objects)
        if placed is None and size_class != "small":
            smaller = SIZE_ORDER[SIZE_ORDER.index(size_class) - 1]
            placed = _place(rng, shape, smaller, size, objects)
        if placed is not None:
            objects.append(Obj(placed.shape, color, placed.size, placed.cx, placed.cy, placed.r))
    return Scene(size, tuple(objects), background)
