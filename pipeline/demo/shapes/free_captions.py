"""Free captions (``capstack shapes --captions free``): five per scene, worded as people word them.

The default captions (``captions``) come from a handful of patterns whose word
order is fixed, which a captioning model learns to sample so well that a
text-only discriminator cannot tell its samples from the references. These
captions vary where human ones do:

- sentence frames: active and passive ("a red circle is placed above a box",
  "... can be seen in this image"), presentational ("there is ...", "in this
  picture you can see ..."), fronted relations ("to the left of the blue square
  sits a red circle"), possessive ones ("a box with a red circle to its left"),
  comparisons, counts, attributes, extremes, places;
- wording: synonyms of flatter odds for shapes, colours, sizes, relations,
  verbs and determiners ("a", "one", "the"), optional adjectives and adverbs
  ("bright", "directly above", "well to the left of");
- content: objects in any order, usually all of them, sometimes only some.

Everything said is still true of the picture: relations, places, sizes,
counts and extremes come from the geometry (``relations``), an adverb only where
it holds, "the" only for a phrase that names one object of the scene.

The words are drawn from their own generator (see ``writer``), never from the
one that draws the scene, so the images are those of the default captions.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from . import free_lexicon as F
from .captions import (CAPTIONS_PER_IMAGE, Wording, background_phrase, draw_captions,
                       other_things, pick_relation)
from .chance import Weighted, one_of, shuffled
from .grammar import join_list, plural, sentence, with_article
from .relations import ABOVE, BELOW, LEFT, NEAR_GAP, RIGHT, extreme, largest, position, smallest
from .scene import SIZE_ORDER, Obj, Scene, gap_between

MAX_WORDS = 17          # a longer draw is dropped and another one made

ALIGNED_RATIO = 0.15    # "directly above": the sideways offset at most this share of the vertical
FAR_GAP = 0.40          # "well to the left of": a gap of at least this share of the image side


# -- noun phrases ----------------------------------------------------------------------------
def _noun(obj: Obj, w: Wording) -> str:
    return w.say(F.SHAPE_NOUNS[obj.shape])


def _color(obj: Obj, w: Wording) -> str:
    word = w.say(F.COLOR_WORDS[obj.color])
    if obj.color in F.BRIGHT_COLORS and w.coin(F.BRIGHT_P):
        return f"{w.say(F.BRIGHT)} {word}"
    if w.coin(F.COLORED_P):
        return f"{word} colored"
    return word


def _unique(scene: Scene, obj: Obj, *, by_color: bool) -> bool:
    """Whether "the <shape>" (or "the <colour> <shape>") names only ``obj`` in the scene."""
    return sum(o.shape == obj.shape and (not by_color or o.color == obj.color)
               for o in scene.objects) == 1


def describe(obj: Obj, w: Wording, *, size_p: float | None = None,
             color: bool | None = None) -> str:
    """Adjectives and noun: "big bright red circle", "box", "tiny golden star"."""
    words = []
    if w.coin(F.SIZE_MENTION[obj.size] if size_p is None else size_p):
        words.append(w.say(F.SIZE_WORDS[obj.size]))
    if color if color is not None else w.coin(F.COLOR_MENTION):
        words.append(_color(obj, w))
    words.append(_noun(obj, w))
    return " ".join(words)


def indefinite(obj: Obj, w: Wording, *, subject: bool = False, **kw) -> str:
    """"a red circle", "an orange box", as a subject sometimes "one red circle"."""
    phrase = describe(obj, w, **kw)
    if subject and w.coin(F.ONE_P):
        return f"one {phrase}"
    return with_article(phrase)


def definite(obj: Obj, scene: Scene, w: Wording, **kw) -> str | None:
    """"the red circle", "the box": only where the phrase names ``obj`` alone, else None."""
    if _unique(scene, obj, by_color=False):
        return f"the {describe(obj, w, **kw)}"
    if _unique(scene, obj, by_color=True):
        return f"the {describe(obj, w, color=True, **kw)}"
    return None


def mention(obj: Obj, scene: Scene, w: Wording, *, subject: bool = False,
            definite_p: float = F.DEFINITE_P, **kw) -> str:
    """An indefinite or (where it is unambiguous) a definite noun phrase for ``obj``."""
    if w.coin(definite_p):
        phrase = definite(obj, scene, w, **kw)
        if phrase is not None:
            return phrase
    return indefinite(obj, w, subject=subject, **kw)


def grouped(objects: list[Obj], w: Wording, *, by_color: bool) -> list[str]:
    """"two red circles", "three boxes", "a blue disc": objects of one shape (and colour,
    ``by_color``) counted together; a group's colour is said when they all share it."""
    key = (lambda o: (o.shape, o.color)) if by_color else (lambda o: (o.shape, ""))
    groups: dict[tuple[str, str], list[Obj]] = {}
    for obj in objects:
        groups.setdefault(key(obj), []).append(obj)
    phrases = []
    for members in groups.values():
        obj, n = members[0], len(members)
        if n == 1:
            phrases.append(indefinite(obj, w, size_p=0.25))
            continue
        number = w.say(F.TWO) if n == 2 else F.NUMBERS[n]
        same = len({o.color for o in members}) == 1
        color = f"{_color(obj, w)} " if same and w.coin(F.COLOR_MENTION) else ""
        phrases.append(f"{number} {color}{plural(_noun(obj, w))}")
    return phrases


def place(obj: Obj, scene: Scene, w: Wording) -> str:
    """"in the upper left corner", "near the center"; sometimes "... of the picture"."""
    where = w.say(F.POSITION_WORDS[position(obj, scene.size)])
    if where.endswith(("corner", "top", "bottom", "center", "middle")) and w.coin(0.12):
        where += f" of {w.say(F.THIS)} {w.say(F.PICTURE_NOUN)}"
    return where


def background(scene: Scene, w: Wording) -> str:
    """"on a white background", "against a grainy beige backdrop"."""
    return background_phrase(scene, w, F)


def picture(w: Wording) -> str:
    """"this image", "the drawing"."""
    return f"{w.say(F.THIS)} {w.say(F.PICTURE_NOUN)}"


def count_noun(n: int, w: Wording, *, vague_p: float = 0.25) -> str:
    """"three shapes", "several objects", "a pair of figures", "a few colorful items"."""
    if n == 2:
        number = w.say(F.TWO)
    elif n >= 3 and w.coin(vague_p):
        number = w.say(F.FEW)
    else:
        number = F.NUMBERS[n]
    adjective = f"{w.say(F.COLORFUL)} " if w.coin(0.15) else ""
    return f"{number} {adjective}{plural(w.say(F.GENERIC_NOUN))}"


def _verb(w: Wording, n: int) -> str:
    return w.say(F.VERB_ONE) if n == 1 else w.say(F.VERB_MANY)


# -- relations ---------------------------------------------------------------------------------
def adverb(a: Obj, b: Obj, relation: str, scene: Scene, w: Wording) -> str:
    """"directly", "well", "just" or nothing: only where the geometry bears it out."""
    if relation not in (LEFT, RIGHT, ABOVE, BELOW) or not w.coin(0.4):
        return ""
    dx, dy = abs(b.cx - a.cx), abs(b.cy - a.cy)
    along, across = (dx, dy) if relation in (LEFT, RIGHT) else (dy, dx)
    gap = gap_between(a, b)
    options = []
    if across <= ALIGNED_RATIO * along:
        options.append(F.ALIGNED)
    if gap >= FAR_GAP * scene.size:
        options.append(F.FAR)
    if gap <= NEAR_GAP * scene.size:
        options.append(F.CLOSE)
    return w.say(one_of(w.rng, options)) if options else ""


def relation_words(a: Obj, b: Obj, scene: Scene, w: Wording) -> tuple[str, str]:
    """(relation, "to the left of" with its adverb, if any) for ``a`` relative to ``b``."""
    relation = pick_relation(a, b, scene, w, main_p=0.55)
    how = adverb(a, b, relation, scene, w)
    if not how:
        return relation, w.say(F.RELATION_WORDS[relation])
    if how == "right" and relation in (LEFT, RIGHT):
        how = "directly"  # "right to the right of" is not said
    return relation, f"{how} {w.say(F.ADVERB_RELATION_WORDS[relation])}"


def _rest(scene: Scene, named: list[Obj], w: Wording) -> str:
    """Sometimes one more object, often the last one unnamed: ", and a green star at the top"."""
    left = [o for o in scene.objects if all(o is not n for n in named)]
    if not left or not w.coin(0.4 if len(left) == 1 else 0.15):
        return ""
    obj = one_of(w.rng, left)
    form = w.rng.random()
    if form < 0.3:
        return f", and {indefinite(obj, w, size_p=0.0)} {_verb(w, 1)} {place(obj, scene, w)}"
    if form < 0.55:
        return f" and {indefinite(obj, w, size_p=0.0)} {place(obj, scene, w)}"
    if form < 0.8:
        return f", and {indefinite(obj, w)}"
    return f", while {indefinite(obj, w, size_p=0.0)} {_verb(w, 1)} {place(obj, scene, w)}"


# -- sentence frames: each returns a caption without its full stop, or None if it does not fit --
def pair_frame(scene: Scene, w: Wording) -> str | None:
    """One pair and how they stand, in one of many word orders."""
    if len(scene.objects) < 2:
        return None
    a, *others = shuffled(w.rng, scene.objects)
    unlike = [o for o in others if (o.shape, o.color) != (a.shape, a.color)]
    # "a red circle above a red circle" is true but rare in what people write
    b = unlike[0] if unlike and w.coin(0.9) else others[0]
    relation, rel = relation_words(a, b, scene, w)
    form = w.rng.random()
    if form < 0.18:    # "a red circle is to the left of a box"
        core = f"{mention(a, scene, w, subject=True)} {_verb(w, 1)} {rel} {mention(b, scene, w)}"
    elif form < 0.32:  # "a red circle to the left of a box"
        core = f"{indefinite(a, w)} {rel} {indefinite(b, w)}"
    elif form < 0.46:  # "to the left of the blue box sits a red circle"
        core = f"{rel} {mention(b, scene, w, definite_p=0.6)} {w.say(F.FRONTED_VERB)} " \
               f"{indefinite(a, w)}"
    elif form < 0.58:  # "there is a red circle above a box"
        core = f"{w.say(F.THERE_IS)} {indefinite(a, w)} {rel} {mention(b, scene, w)}"
    elif form < 0.70:  # "a box with a red circle to its left"
        core = f"{indefinite(b, w)} with {indefinite(a, w)} " \
               f"{w.say(F.RELATION_TO_IT[relation])}"
    elif form < 0.80:  # "the blue box has a red circle above it"
        subject = mention(b, scene, w, subject=True, definite_p=0.5)
        core = f"{subject} has {indefinite(a, w)} {w.say(F.RELATION_TO_IT[relation])}"
    elif form < 0.90:  # "in this picture a red circle can be seen above a box"
        core = f"in {picture(w)} {indefinite(a, w)} can be seen {rel} {mention(b, scene, w)}"
    else:              # "this image shows a red circle placed below a box"
        verb = one_of(w.rng, ("placed", "located", "positioned", "sitting"))
        core = f"{picture(w)} {w.say(F.SHOWS)} {indefinite(a, w)} {verb} {rel} " \
               f"{indefinite(b, w)}"
    return core + _rest(scene, [a, b], w)


def list_frame(scene: Scene, w: Wording) -> str | None:
    """The objects, usually all, in any order, in one of several frames."""
    objects = shuffled(w.rng, scene.objects)
    n = len(objects)
    everything = n == 1 or w.coin(0.85 if n == 2 else 0.75)
    named = objects if everything else objects[:1 + int(w.rng.random() * (n - 1))]
    twins = len({o.shape for o in named}) < len(named)
    if twins and everything and w.coin(0.6):  # counts are of the whole scene
        items = grouped(named, w, by_color=w.coin(0.5))
    else:
        size_p = 0.25 if len(named) >= 3 else None
        items = [indefinite(o, w, size_p=size_p)
                 + (f" {place(o, scene, w)}" if w.coin(0.1) else "") for o in named]
    many = len(items) > 1 or not items[0].startswith(("a ", "an "))
    things = join_list(items)
    unsaid = n - len(named)
    if unsaid and w.coin(0.5):
        more = other_things(unsaid, w.say(F.GENERIC_NOUN), F)
        along = w.say(F.ALONG_WITH)
        things += f" {along} {more}"
        many = many or along == "and"  # "there is a box along with another shape"
    form = w.rng.random()
    if len(items) == 1 and form < 0.2:  # "a red circle." alone is too curt a caption
        form = 0.2 + 0.8 * w.rng.random()
    if form < 0.2:
        core = things
    elif form < 0.38:
        core = f"there {'are' if many else 'is'} {things}"
    elif form < 0.56:
        core = f"{picture(w)} {w.say(F.SHOWS)} {things}"
    elif form < 0.66:
        core = f"{with_article(w.say(F.PICTURE_NOUN))} of {things}"
    elif form < 0.80:
        core = f"in {picture(w)} {w.say(F.THERE_IS)} {things}"
    elif form < 0.92:
        core = f"{things} {'are' if many else 'is'} {w.say(F.SHOWN)} in {picture(w)}"
    else:
        core = f"{w.say(F.THERE_IS)} {things}"
    if w.coin(0.15):
        core += f" {background(scene, w)}"
    return core


def place_frame(scene: Scene, w: Wording) -> str | None:
    """Objects and their places: "in the upper left corner sits a red circle and ..."."""
    r = w.rng.random()
    k = 1 if r < 0.55 else (2 if r < 0.95 else 3)
    objects = shuffled(w.rng, scene.objects)[:k]
    clauses = []
    for obj in objects:
        form = w.rng.random()
        if form < 0.3:
            clauses.append(f"{mention(obj, scene, w, subject=True)} {_verb(w, 1)} "
                           f"{place(obj, scene, w)}")
        elif form < 0.55:
            clauses.append(f"{indefinite(obj, w)} {place(obj, scene, w)}")
        elif form < 0.8:
            clauses.append(f"{place(obj, scene, w)} {w.say(F.FRONTED_VERB)} {indefinite(obj, w)}")
        else:
            clauses.append(f"{place(obj, scene, w)} {w.say(F.THERE_IS)} {indefinite(obj, w)}")
    if len(clauses) == 1:
        return clauses[0] + (f" {background(scene, w)}" if w.coin(0.12) else "")
    if len(clauses) == 2 and w.coin(0.4):
        return f"{clauses[0]}, {one_of(w.rng, ('while', 'and', 'whereas'))} {clauses[1]}"
    return join_list(clauses)


def count_frame(scene: Scene, w: Wording) -> str | None:
    """How many, and maybe one of them: "several shapes of different colors, including ..."."""
    n = len(scene.objects)
    if n == 1:
        thing = w.say(F.GENERIC_NOUN)
        form = w.rng.random()
        if form < 0.35:
            return f"{w.say(F.SINGLE)} {thing} {background(scene, w)}"
        if form < 0.7:
            return f"{picture(w)} {w.say(F.SHOWS)} {w.say(F.SINGLE)} {thing}"
        return f"there is {w.say(F.SINGLE)} {thing} in {picture(w)}"
    things = count_noun(n, w)
    colors = {o.color for o in scene.objects}
    tail = ""
    if len(colors) == n and w.coin(0.3):
        different = w.say(F.DIFFERENT_COLORS)
        things += f" {different.removeprefix('all ') if n == 2 else different}"
    elif len(colors) == 1 and w.coin(0.5):
        tail = f", {'both' if n == 2 else 'all'} of them " \
               f"{w.say(F.COLOR_WORDS[scene.objects[0].color])}"
    form = w.rng.random()
    if form < 0.2:
        return f"there are {things} in {picture(w)}{tail}"
    if form < 0.35:
        return f"{picture(w)} {w.say(F.SHOWS)} {things}{tail}"
    if form < 0.5:
        return f"{things} {background(scene, w)}{tail}"
    if form < 0.6:
        return f"{things} are {w.say(F.SHOWN)} in {picture(w)}{tail}"
    obj = one_of(w.rng, scene.objects)  # and one of them
    one = indefinite(obj, w)
    if w.coin(0.25):
        one += f" {place(obj, scene, w)}"
    style = w.rng.random()
    if style < 0.35:
        return f"{things}, {w.say(F.INCLUDING)} {one}"
    if style < 0.6:
        return f"{things}, one of which is {one}"
    rest = other_things(n - 1, w.say(F.GENERIC_NOUN), F)
    return f"{one} {w.say(F.ALONG_WITH)} {rest}"


def compare_frame(scene: Scene, w: Wording) -> str | None:
    """Sizes: "the red circle is bigger than the box", "a big star and a smaller hexagon"."""
    for which, table in (("largest", largest), ("smallest", smallest)):
        if table(scene.objects) is not None and w.coin(0.3):
            obj = table(scene.objects)
            assert obj is not None, "the table found one just above"
            the = f"the {w.say(F.EXTREME_WORDS[which])} {w.say(F.GENERIC_NOUN)}"
            np_ = indefinite(obj, w, size_p=0.0)
            return f"{the} is {np_}" if w.coin(0.6) else f"{np_} is {the}"
    pairs = [(a, b) for a in scene.objects for b in scene.objects
             if SIZE_ORDER.index(a.size) > SIZE_ORDER.index(b.size)]
    if not pairs:
        return None
    big, small = one_of(w.rng, pairs)
    form = w.rng.random()
    if form < 0.3:
        return f"{mention(big, scene, w, subject=True, size_p=0.0)} is " \
               f"{w.say(F.BIGGER)} than {mention(small, scene, w, size_p=0.0)}"
    if form < 0.55:
        return f"{mention(small, scene, w, subject=True, size_p=0.0)} is " \
               f"{w.say(F.SMALLER)} than {mention(big, scene, w, size_p=0.0)}"
    bigger = f"{w.say(F.BIGGER)} {describe(big, w, size_p=0.0)}"
    smaller = f"{w.say(F.SMALLER)} {describe(small, w, size_p=0.0)}"
    if form < 0.8:
        return f"{indefinite(big, w, size_p=1.0)} and {with_article(smaller)}"
    return f"{indefinite(small, w, size_p=1.0)} and {with_article(bigger)}"


def attribute_frame(scene: Scene, w: Wording) -> str | None:
    """Colours and kinds: "the circle is red and the box is blue", "both shapes are pink"."""
    objects = scene.objects
    n = len(objects)
    colors = [o.color for o in objects]
    shapes = [o.shape for o in objects]
    options = []
    if n >= 2 and len(set(colors)) == 1:
        options.append("same")
    if n >= 2 and len(set(shapes)) == n:
        options.append("binding")
    if any(colors.count(o.color) == 1 for o in objects) and n >= 2:
        options.append("colored_one")
    if any(shapes.count(s) >= 2 for s in shapes):
        options.append("how_many")
    if not options:
        return None
    kind = one_of(w.rng, options)
    thing = w.say(F.GENERIC_NOUN)
    if kind == "same":
        color = w.say(F.COLOR_WORDS[colors[0]])
        if n == 2 and shapes[0] != shapes[1] and w.coin(0.5):
            kinds = join_list([with_article(_noun(o, w)) for o in objects])
            return f"two {color} {plural(thing)}, {kinds}"
        if n == 2:
            return f"both {plural(thing)} are {color}"
        return f"all {F.NUMBERS[n]} {plural(thing)} are {color}"
    if kind == "binding":
        chosen = shuffled(w.rng, objects)[: 2 if n > 3 and w.coin(0.6) else n]
        if len({o.color for o in chosen}) < len(chosen):
            return None
        parts = [f"the {_noun(o, w)} is {_color(o, w)}" for o in chosen]
        return join_list(parts)
    if kind == "colored_one":
        obj = one_of(w.rng, [o for o in objects if colors.count(o.color) == 1])
        if w.coin(0.5):
            return f"the {w.say(F.COLOR_WORDS[obj.color])} {thing} is " \
                   f"{with_article(_noun(obj, w))}"
        return f"the only {w.say(F.COLOR_WORDS[obj.color])} {thing} is " \
               f"{with_article(_noun(obj, w))}{_rest(scene, [obj], w)}"
    shape = one_of(w.rng, [s for s in shapes if shapes.count(s) >= 2])
    k = shapes.count(shape)
    noun = plural(w.say(F.SHAPE_NOUNS[shape]))
    if k == n:
        return f"{'all the' if n > 2 else 'both'} {plural(thing)} are {noun}"
    return f"{F.NUMBERS[k]} of the {plural(thing)} are {noun}"


EXTREMES = ("leftmost", "rightmost", "topmost", "bottommost")


def extreme_frame(scene: Scene, w: Wording) -> str | None:
    """"the leftmost shape is a red circle", "on the far right is a box", "the highest ..."."""
    for which in shuffled(w.rng, EXTREMES):
        obj = extreme(scene.objects, which, scene.size)
        if obj is None:
            continue
        np_ = indefinite(obj, w)
        word = w.say(F.EXTREME_WORDS[which])
        if word.startswith("far "):
            return f"on the {word} {w.say(F.FRONTED_VERB)} {np_}" if w.coin(0.5) else \
                f"{np_} is on the {word}"
        the = f"the {word} {w.say(F.GENERIC_NOUN)}"
        if word in ("left", "right", "top", "bottom"):
            the = f"the {w.say(F.GENERIC_NOUN)} on the {word}" if w.coin(0.5) else the
        return f"{the} is {np_}" if w.coin(0.6) else f"{np_} is {the}"
    return None


def single_frame(scene: Scene, w: Wording) -> str | None:
    """One object: "a red circle on its own", "just a box in the middle"."""
    if len(scene.objects) != 1:
        return None
    obj = scene.objects[0]
    form = w.rng.random()
    if form < 0.3:
        return f"{indefinite(obj, w)} {w.say(F.ALONE)} {background(scene, w)}"
    if form < 0.55:
        return f"{one_of(w.rng, ('just', 'only'))} {indefinite(obj, w)} {place(obj, scene, w)}"
    if form < 0.8:
        return f"the only {w.say(F.GENERIC_NOUN)} is {indefinite(obj, w, size_p=0.6)}"
    return f"{w.say(F.SINGLE)} {describe(obj, w)} {_verb(w, 1)} {place(obj, scene, w)}"


Frame = Callable[[Scene, Wording], "str | None"]

FRAMES_ONE: Weighted[Frame] = Weighted.of({
    single_frame: 3.0, place_frame: 2.5, list_frame: 2.0, count_frame: 1.2,
})
FRAMES_MANY: Weighted[Frame] = Weighted.of({
    pair_frame: 3.2, list_frame: 3.0, place_frame: 1.4, count_frame: 1.0, compare_frame: 0.7,
    attribute_frame: 0.8, extreme_frame: 0.6,
})


def free_captions_for(scene: Scene, rng: np.random.Generator,
                      n: int = CAPTIONS_PER_IMAGE) -> list[str]:
    """``n`` different free captions of ``scene``, drawn from ``rng`` alone."""
    frames = FRAMES_ONE if len(scene.objects) == 1 else FRAMES_MANY
    return draw_captions(scene, rng, frames, n, _finish)


def _finish(text: str) -> str | None:
    """The caption of a draw; None (drop it) where it runs past ``MAX_WORDS``."""
    return None if len(text.split()) > MAX_WORDS else sentence(text.replace(" ,", ","))
