"""Where objects are: spatial relations between two objects, and an object's place in the image.

Everything is computed from the real geometry (object centres, y pointing
down), so a caption saying "a red circle above a blue square" is true of the
picture. ``relations(a, b, size)`` lists every relation that may truthfully be
said of *a* relative to *b*; the caption grammar picks one and words it.
"""

from __future__ import annotations

from .scene import SIZE_ORDER, Obj, gap_between

LEFT, RIGHT, ABOVE, BELOW = "left of", "right of", "above", "below"
NEXT_TO, NEAR = "next to", "near"

DIAGONAL_RATIO = 0.6     # both offsets this close to each other: "above and to the left of"
BESIDE_RATIO = 0.4       # vertical offset at most this fraction of the horizontal: side by side
BESIDE_GAP = 0.30        # "next to" only when the gap is below this fraction of the image side
NEAR_GAP = 0.12          # "near" when the gap is below this fraction of the image side
EXTREME_MARGIN = 0.10    # "the leftmost shape" only when it leads the next one by this much


def spatial_relation(a: Obj, b: Obj) -> str:
    """The main relation of ``a`` to ``b`` along the axis where they are farther apart:
    "left of", "right of", "above" or "below"."""
    dx, dy = b.cx - a.cx, b.cy - a.cy
    if abs(dx) >= abs(dy):
        return LEFT if dx > 0 else RIGHT
    return ABOVE if dy > 0 else BELOW


def diagonal_relation(a: Obj, b: Obj, size: int) -> str | None:
    """"above and left of" and the like, when ``a`` is clearly off ``b`` along both axes."""
    dx, dy = b.cx - a.cx, b.cy - a.cy
    small, big = sorted((abs(dx), abs(dy)))
    if small < DIAGONAL_RATIO * big or small < 0.15 * size:
        return None
    vertical = ABOVE if dy > 0 else BELOW
    horizontal = LEFT if dx > 0 else RIGHT
    return f"{vertical} and {horizontal}"


def relations(a: Obj, b: Obj, size: int) -> list[str]:
    """Every relation that holds for ``a`` relative to ``b``; the main one comes first."""
    found = [spatial_relation(a, b)]
    diagonal = diagonal_relation(a, b, size)
    if diagonal:
        found.append(diagonal)
    dx, dy = abs(b.cx - a.cx), abs(b.cy - a.cy)
    gap = gap_between(a, b)
    if dy <= BESIDE_RATIO * dx and gap <= BESIDE_GAP * size:
        found.append(NEXT_TO)
    if gap <= NEAR_GAP * size:
        found.append(NEAR)
    return found


def _third(value: float, size: int) -> int:
    return 0 if value < size / 3 else (2 if value > 2 * size / 3 else 1)


_ZONES = (("top left", "top", "top right"),
          ("left", "center", "right"),
          ("bottom left", "bottom", "bottom right"))


def position(obj: Obj, size: int) -> str:
    """The cell of a 3x3 grid the centre falls in: "top left", "top", ..., "center", ..."""
    return _ZONES[_third(obj.cy, size)][_third(obj.cx, size)]


def extreme(objects: tuple[Obj, ...], which: str, size: int) -> Obj | None:
    """The object that is clearly the leftmost / rightmost / topmost / bottommost, if any."""
    key = {"leftmost": lambda o: o.cx, "rightmost": lambda o: -o.cx,
           "topmost": lambda o: o.cy, "bottommost": lambda o: -o.cy}[which]
    if len(objects) < 2:
        return None
    first, second = sorted(objects, key=key)[:2]
    return first if key(second) - key(first) >= EXTREME_MARGIN * size else None


def largest(objects: tuple[Obj, ...]) -> Obj | None:
    """The one object of the largest size class, if it is alone in that class."""
    return _unique_by_rank(objects, max)


def smallest(objects: tuple[Obj, ...]) -> Obj | None:
    """The one object of the smallest size class, if it is alone in that class."""
    return _unique_by_rank(objects, min)


def _unique_by_rank(objects, choose) -> Obj | None:
    if len(objects) < 2:
        return None
    ranks = [SIZE_ORDER.index(o.size) for o in objects]
    best = choose(ranks)
    return objects[ranks.index(best)] if ranks.count(best) == 1 else None


def all_on_one_side(target: Obj, others: list[Obj]) -> str | None:
    """The main relation every other object has to ``target``, when they all share one."""
    found = {spatial_relation(o, target) for o in others}
    return found.pop() if len(found) == 1 else None
