"""The outline of each shape, in units of the object's radius around its centre.

Every shape is symmetric about its centre, so the centre is also where the eye
puts the object; relations and positions are computed from it. ``extent`` is
the distance from the centre to the farthest point of the outline: two objects
whose centres are farther apart than the sum of their extents cannot overlap,
which is what scene sampling checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Point = tuple[float, float]


@dataclass(frozen=True)
class Outline:
    """A polygon (``points``) or, when ``ellipse`` is set, an axis-aligned ellipse (rx, ry)."""

    points: tuple[Point, ...] = ()
    ellipse: tuple[float, float] | None = None

    @property
    def extent(self) -> float:
        if self.ellipse is not None:
            return max(self.ellipse)
        return max(math.hypot(x, y) for x, y in self.points)

    def placed(self, cx: float, cy: float, r: float) -> "PlacedOutline":
        """The outline in image pixels for an object at ``(cx, cy)`` with radius ``r``."""
        if self.ellipse is not None:
            rx, ry = self.ellipse
            return PlacedOutline(ellipse_box=(cx - rx * r, cy - ry * r, cx + rx * r, cy + ry * r))
        return PlacedOutline(points=tuple((cx + x * r, cy + y * r) for x, y in self.points))


@dataclass(frozen=True)
class PlacedOutline:
    """What ``PIL.ImageDraw`` is given: polygon points or an ellipse's bounding box."""

    points: tuple[Point, ...] = ()
    ellipse_box: tuple[float, float, float, float] | None = None


def _regular(n: int, radius: float, start_deg: float = -90.0) -> tuple[Point, ...]:
    """``n`` points on a circle, the first at ``start_deg`` (-90 is straight up; y points down)."""
    return tuple(
        (radius * math.cos(math.radians(start_deg + 360.0 * k / n)),
         radius * math.sin(math.radians(start_deg + 360.0 * k / n)))
        for k in range(n)
    )


def _star(points: int, outer: float, inner: float) -> tuple[Point, ...]:
    tips = _regular(points, outer)
    notches = _regular(points, inner, -90.0 + 180.0 / points)
    return tuple(p for pair in zip(tips, notches) for p in pair)


def _plus(arm: float, half_width: float) -> tuple[Point, ...]:
    a, w = arm, half_width
    return ((-w, -a), (w, -a), (w, -w), (a, -w), (a, w), (w, w),
            (w, a), (-w, a), (-w, w), (-a, w), (-a, -w), (-w, -w))


# Sizes are tuned so the shapes look about equally big for the same radius.
OUTLINES: dict[str, Outline] = {
    "circle": Outline(ellipse=(1.0, 1.0)),
    "ellipse": Outline(ellipse=(1.15, 0.65)),
    "square": Outline(points=((-0.82, -0.82), (0.82, -0.82), (0.82, 0.82), (-0.82, 0.82))),
    "diamond": Outline(points=((0.0, -1.1), (0.78, 0.0), (0.0, 1.1), (-0.78, 0.0))),
    "triangle": Outline(points=_regular(3, 1.15)),
    "star": Outline(points=_star(5, 1.15, 0.48)),
    "hexagon": Outline(points=_regular(6, 1.0)),
    "cross": Outline(points=_plus(1.0, 0.34)),
}

SHAPES: tuple[str, ...] = tuple(OUTLINES)
