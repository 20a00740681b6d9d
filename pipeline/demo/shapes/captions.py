"""Five captions per scene, varied the way COCO's are.

Captions differ in sentence pattern (a pair and its relation, one object and
its place, counts only, a list, the leftmost / biggest object, a full layout),
in what they mention (often only part of the scene), in object order and in
wording (synonyms with skewed odds, see ``lexicon``). Everything said is true of
the picture: a colour is bound to its shape and relations and places come from
the geometry. So a model needs to look at particular regions to get a caption
right, and several phrasings per image leave room for CIDEr optimisation after
cross-entropy training.
"""

from __future__ import annotations

from collections import Counter
from types import ModuleType
from typing import Callable

import numpy as np

from . import lexicon as L
from .chance import Weighted, coin, one_of, shuffled
from .grammar import join_list, plural, sentence, with_article
from .relations import all_on_one_side, extreme, largest, position, relations, smallest
from .scene import Obj, Scene

CAPTIONS_PER_IMAGE = 5
MAX_TRIES = 40


class Wording:
    """The word choices of one caption.

    A concept is worded once per caption ("box" stays "box" within it), while
    every new caption draws afresh, which is what makes the five differ.
    """

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self._chosen: dict[Weighted[str], str] = {}

    def say(self, table: Weighted[str]) -> str:
        if table not in self._chosen:
            self._chosen[table] = table.pick(self.rng)
        return self._chosen[table]

    def coin(self, p: float) -> bool:
        return coin(self.rng, p)


# -- phrases -------------------------------------------------------------------------------
def describe(obj: Obj, w: Wording, *, size_p: float | None = None,
             color_p: float = L.COLOR_MENTION) -> str:
    """Adjectives and noun without article: "big yellow star", "red circle", "box"."""
    words = []
    if w.coin(L.SIZE_MENTION[obj.size] if size_p is None else size_p):
        words.append(w.say(L.SIZE_WORDS[obj.size]))
    if w.coin(color_p):
        words.append(w.say(L.COLOR_WORDS[obj.color]))
    words.append(w.say(L.SHAPE_NOUNS[obj.shape]))
    return " ".join(words)


def noun_phrase(obj: Obj, w: Wording, **kw) -> str:
    """"a big yellow star", "an orange circle"."""
    return with_article(describe(obj, w, **kw))


def background_phrase(scene: Scene, w: Wording, lex: ModuleType = L) -> str:
    """"on a white background", "against a grainy cream backdrop", in the words of ``lex``
    (``lexicon`` or ``free_lexicon``)."""
    bg = scene.background
    style = w.say(lex.BACKGROUND_STYLE_WORDS[bg.style])
    color = w.say(lex.BACKGROUND_COLOR_WORDS[bg.color])
    # "gradient" reads as a noun modifier after the colour; the other styles go before it.
    words = [color, style] if style == "gradient" else [style, color]
    phrase = " ".join(x for x in (*words, w.say(lex.BACKGROUND_NOUN)) if x)
    return f"{w.say(lex.BACKGROUND_PREPOSITION)} {with_article(phrase)}"


def picture_prefix(w: Wording) -> str:
    """"a picture showing", "an image with"."""
    return f"{with_article(w.say(L.PICTURE_NOUN))} {w.say(L.PICTURE_VERB)}"


def count_phrase(n: int, w: Wording, *, colorful_p: float = 0.2) -> str:
    """"three shapes", "two colorful objects", "a pair of figures"."""
    number = w.say(L.PAIR) if n == 2 else L.NUMBERS[n]
    adjective = f"{w.say(L.COLORFUL)} " if w.coin(colorful_p) else ""
    return f"{number} {adjective}{plural(w.say(L.GENERIC_NOUN))}"


def other_things(k: int, thing: str, lex: ModuleType = L) -> str:
    """"another shape", "two other objects": the ``k`` objects a caption leaves unnamed."""
    return f"another {thing}" if k == 1 else f"{lex.NUMBERS[k]} other {plural(thing)}"


def pick_relation(a: Obj, b: Obj, scene: Scene, w: Wording, *, main_p: float = 0.6) -> str:
    """A relation that holds of ``a`` to ``b``: the main one with odds ``main_p``, else one of
    the finer ones (where there are any)."""
    options = relations(a, b, scene.size)
    return options[0] if len(options) == 1 or w.coin(main_p) else one_of(w.rng, options[1:])


def relation_phrase(a: Obj, b: Obj, scene: Scene, w: Wording) -> str:
    """How ``a`` stands to ``b``: mostly the main relation, sometimes a truer finer one."""
    return w.say(L.RELATION_WORDS[pick_relation(a, b, scene, w)])


def group_phrases(objects: list[Obj], w: Wording, *, with_color: bool) -> list[str]:
    """"two red circles", "a blue square": objects of one kind counted together."""
    key = (lambda o: (o.shape, o.color)) if with_color else (lambda o: (o.shape, ""))
    counts = Counter(key(o) for o in objects)
    phrases = []
    for (shape, color), n in counts.items():
        noun = w.say(L.SHAPE_NOUNS[shape])
        adjective = f"{w.say(L.COLOR_WORDS[color])} " if color else ""
        if n == 1:
            phrases.append(with_article(adjective + noun))
        else:
            phrases.append(f"{L.NUMBERS[n]} {adjective}{plural(noun)}")
    return phrases


def _others(scene: Scene, obj: Obj) -> list[Obj]:
    return [o for o in scene.objects if o is not obj]


# -- sentence patterns: each returns a caption without its full stop, or None if it does not fit --
def pair_relation(scene: Scene, w: Wording) -> str | None:
    """"a red circle above a blue square"; with three or more objects, one pair of them."""
    if len(scene.objects) < 2:
        return None
    a, b = shuffled(w.rng, scene.objects)[:2]
    first, relation, second = noun_phrase(a, w), relation_phrase(a, b, scene, w), noun_phrase(b, w)
    form = w.rng.random()
    if form < 0.14:
        core = f"{w.say(L.INTRO)} {first} {relation} {second}"
    elif form < 0.24:
        core = f"{picture_prefix(w)} {first} {relation} {second}"
    elif form < 0.38:
        core = f"{first} is {relation} {second}"
    else:
        core = f"{first} {relation} {second}"
    if len(scene.objects) >= 3 and w.coin(0.2):
        third = one_of(w.rng, [o for o in scene.objects if o is not a and o is not b])
        core += f" and {noun_phrase(third, w)}"
    elif w.coin(0.12):
        core += f" {background_phrase(scene, w)}"
    return core


def object_position(scene: Scene, w: Wording) -> str | None:
    """"there is a small green triangle in the top left corner"."""
    obj = one_of(w.rng, scene.objects)
    place = w.say(L.POSITION_WORDS[position(obj, scene.size)])
    if not place.endswith("image") and w.coin(0.15):
        place += f" of the {w.say(L.PICTURE_NOUN)}"
    np_ = noun_phrase(obj, w, size_p=0.55)
    form = w.rng.random()
    if form < 0.4:
        return f"{w.say(L.INTRO)} {np_} {place}"
    if form < 0.55:
        return f"{np_} is {place}"
    if form < 0.7:
        return f"{np_} {place} {background_phrase(scene, w)}"
    return f"{np_} {place}"


def counts_only(scene: Scene, w: Wording) -> str | None:
    """"two shapes on a white background", "an image showing three objects"."""
    n = len(scene.objects)
    if n == 1:
        thing = w.say(L.GENERIC_NOUN)
        if w.coin(0.5):
            return f"{w.say(L.SINGLE)} {thing} {background_phrase(scene, w)}"
        return f"{picture_prefix(w)} {w.say(L.SINGLE)} {thing}"
    form = w.rng.random()
    if form < 0.4:
        return f"{count_phrase(n, w)} {background_phrase(scene, w)}"
    if form < 0.75:
        return f"{picture_prefix(w)} {count_phrase(n, w)}"
    return f"there are {count_phrase(n, w)} in the {w.say(L.PICTURE_NOUN)}"


def listing(scene: Scene, w: Wording) -> str | None:
    """"two red circles and a blue square", "a picture of a star, a cross and a box"."""
    if len(scene.objects) < 2:
        return None
    phrases = group_phrases(shuffled(w.rng, scene.objects), w, with_color=w.coin(0.78))
    core = join_list(phrases)
    form = w.rng.random()
    if len(phrases) == 1 and form >= 0.45:  # "two stars." alone is too curt a caption
        form = 0.2 + 0.25 * w.rng.random()
    if form < 0.2:
        core = f"there {'is' if phrases[0].startswith(('a ', 'an ')) else 'are'} {core}"
    elif form < 0.45:
        core = f"{picture_prefix(w)} {core}"
    if w.coin(0.25):
        core += f" {background_phrase(scene, w)}"
    return core


def one_and_count(scene: Scene, w: Wording) -> str | None:
    """"three shapes including a big blue hexagon", "a red circle along with two other shapes"."""
    n = len(scene.objects)
    if n < 2:
        return None
    obj = one_of(w.rng, scene.objects)
    np_ = noun_phrase(obj, w)
    if w.coin(0.3):
        np_ += " " + w.say(L.POSITION_WORDS[position(obj, scene.size)])
    form = w.rng.random()
    if form < 0.45:
        return f"{count_phrase(n, w, colorful_p=0.1)} including {np_}"
    if form < 0.8:
        others = other_things(n - 1, w.say(L.GENERIC_NOUN))
        return f"{np_} {w.say(L.AMONG)} {others}"
    return f"{count_phrase(n, w, colorful_p=0.1)}, one of which is {np_}"


FULL_LAYOUT_MAX = 3  # four objects with their places would run past 30 words


def full_layout(scene: Scene, w: Wording) -> str | None:
    """Up to three objects, each with its place: the long captions (often more than 16 words)."""
    if len(scene.objects) < 2:
        return None
    parts = [f"{noun_phrase(o, w)} {w.say(L.POSITION_WORDS[position(o, scene.size)])}"
             for o in shuffled(w.rng, scene.objects)[:FULL_LAYOUT_MAX]]
    core = join_list(parts) if len(parts) > 2 or w.coin(0.5) else ", ".join(parts)
    return f"{w.say(L.INTRO)} {core}" if w.coin(0.25) else core


def color_binding(scene: Scene, w: Wording) -> str | None:
    """"the circle is red and the square is blue": only when each shape occurs once and
    the objects named differ in colour."""
    shapes = [o.shape for o in scene.objects]
    if len(shapes) < 2 or len(set(shapes)) < len(shapes):
        return None
    objects = shuffled(w.rng, scene.objects)[: 2 if w.coin(0.6) else len(shapes)]
    if len({o.color for o in objects}) < len(objects):
        return None  # "the box is orange and the diamond is orange" is not how people put it
    if w.coin(0.3):
        first, *rest = objects
        parts = [f"the {w.say(L.COLOR_WORDS[first.color])} {w.say(L.GENERIC_NOUN)} is "
                 f"{with_article(w.say(L.SHAPE_NOUNS[first.shape]))}"]
        parts += [f"the {w.say(L.COLOR_WORDS[o.color])} one is "
                  f"{with_article(w.say(L.SHAPE_NOUNS[o.shape]))}" for o in rest]
    else:
        parts = [f"the {w.say(L.SHAPE_NOUNS[o.shape])} is {w.say(L.COLOR_WORDS[o.color])}"
                 for o in objects]
    return join_list(parts)


EXTREMES = ("leftmost", "rightmost", "topmost", "bottommost", "largest", "smallest")


def _extreme_object(scene: Scene, which: str) -> Obj | None:
    if which == "largest":
        return largest(scene.objects)
    if which == "smallest":
        return smallest(scene.objects)
    return extreme(scene.objects, which, scene.size)


def extreme_object(scene: Scene, w: Wording) -> str | None:
    """"the leftmost shape is a red circle", "a yellow star is the biggest object"."""
    for which in shuffled(w.rng, EXTREMES):
        obj = _extreme_object(scene, which)
        if obj is None:
            continue
        size_p = 0.0 if which in ("largest", "smallest") else None
        np_ = noun_phrase(obj, w, size_p=size_p)
        the = f"the {w.say(L.EXTREME_WORDS[which])} {w.say(L.GENERIC_NOUN)}"
        return f"{the} is {np_}" if w.coin(0.65) else f"{np_} is {the}"
    return None


def group_relation(scene: Scene, w: Wording) -> str | None:
    """"a red circle and a blue square above a green star": all the others on one side of one."""
    if len(scene.objects) < 3:
        return None
    for target in shuffled(w.rng, scene.objects):
        others = _others(scene, target)
        relation = all_on_one_side(target, others)
        if relation is None:
            continue
        subject = join_list([noun_phrase(o, w) for o in shuffled(w.rng, others)])
        verb = "are " if w.coin(0.3) else ""
        return f"{subject} {verb}{w.say(L.RELATION_WORDS[relation])} {noun_phrase(target, w)}"
    return None


def single_object(scene: Scene, w: Wording) -> str | None:
    """"a single red circle in the center", "a big blue star by itself on a white background"."""
    if len(scene.objects) != 1:
        return None
    obj = scene.objects[0]
    form = w.rng.random()
    if form < 0.35:
        place = w.say(L.POSITION_WORDS[position(obj, scene.size)])
        return f"{w.say(L.SINGLE)} {describe(obj, w)} {place}"
    if form < 0.65:
        return f"{noun_phrase(obj, w)} {w.say(L.ALONE)} {background_phrase(scene, w)}"
    return f"{picture_prefix(w)} {noun_phrase(obj, w, size_p=0.6)}"


Pattern = Callable[[Scene, Wording], "str | None"]

# How often each pattern is tried, for scenes of one object and of several.
PATTERNS_ONE: Weighted[Pattern] = Weighted.of({
    single_object: 4.0, object_position: 3.0, counts_only: 1.5,
})
PATTERNS_MANY: Weighted[Pattern] = Weighted.of({
    pair_relation: 3.2, object_position: 1.5, listing: 1.6, counts_only: 0.8,
    one_and_count: 0.8, extreme_object: 0.8, group_relation: 0.8, color_binding: 0.6,
    full_layout: 0.25,
})


def draw_captions(scene: Scene, rng: np.random.Generator, patterns: Weighted[Pattern],
                  n: int = CAPTIONS_PER_IMAGE,
                  finish: Callable[[str], "str | None"] = sentence) -> list[str]:
    """``n`` captions of ``scene`` from ``patterns`` (a pattern per try, each with a fresh
    ``Wording``), all different unless the scene allows too few wordings. ``finish`` turns a
    draw into the caption, or into None to drop it."""
    captions: list[str] = []
    for _ in range(MAX_TRIES):
        if len(captions) == n:
            break
        text = patterns.pick(rng)(scene, Wording(rng))
        if text is None:
            continue
        text = finish(text)
        if text is not None and text not in captions:
            captions.append(text)
    while len(captions) < n:  # practically never: a one-object scene short of new wordings
        captions.append(captions[len(captions) % len(captions)])
    return captions


def captions_for(scene: Scene, rng: np.random.Generator,
                 n: int = CAPTIONS_PER_IMAGE) -> list[str]:
    """``n`` captions of ``scene``, all different unless the scene allows too few wordings."""
    return draw_captions(scene, rng, PATTERNS_ONE if len(scene.objects) == 1 else PATTERNS_MANY, n)

