"""The words of the captions, each concept with its synonyms and their skewed odds.

Odds are skewed on purpose: one wording dominates, a few are common, and some
are rare (weights of a fraction of a percent: crimson, azure, orb, lozenge,
pentagram...). On a few thousand training images those rare words are seen
fewer than five times and become ``<unk>``, as a tail of COCO's words do, and
the word counts as a whole follow a long-tailed distribution.
"""

from __future__ import annotations

from .chance import Weighted

W = Weighted.of

SHAPE_NOUNS: dict[str, Weighted[str]] = {
    "circle": W({"circle": 70, "disc": 11, "ball": 10, "dot": 6, "orb": 0.3}),
    "ellipse": W({"oval": 62, "ellipse": 36, "egg": 0.4}),
    "square": W({"square": 70, "box": 14, "block": 13, "tile": 2.5, "quadrilateral": 0.2}),
    "diamond": W({"diamond": 86, "rhombus": 13, "lozenge": 0.3}),
    "triangle": W({"triangle": 97, "pyramid": 2.5, "wedge": 0.3}),
    "star": W({"star": 98, "starburst": 1.2, "pentagram": 0.25}),
    "hexagon": W({"hexagon": 99, "honeycomb": 0.25}),
    "cross": W({"cross": 78, "plus sign": 20, "plus": 2}),
}

COLOR_WORDS: dict[str, Weighted[str]] = {
    "red": W({"red": 95, "scarlet": 3, "crimson": 0.35, "ruby": 0.15}),
    "orange": W({"orange": 99, "tangerine": 0.3}),
    "yellow": W({"yellow": 94, "golden": 5, "mustard": 0.3}),
    "green": W({"green": 97, "lime": 2, "emerald": 0.35}),
    "blue": W({"blue": 96, "navy": 2.5, "azure": 0.35, "cobalt": 0.2}),
    "purple": W({"purple": 86, "violet": 13, "lilac": 0.3}),
    "pink": W({"pink": 96, "magenta": 3.5, "rose": 0.2}),
    "brown": W({"brown": 96, "chocolate": 3, "chestnut": 0.2}),
    "black": W({"black": 97, "dark": 2.5, "ebony": 0.2}),
    "gray": W({"gray": 72, "grey": 26, "silver": 2}),
}

SIZE_WORDS: dict[str, Weighted[str]] = {
    "small": W({"small": 55, "little": 22, "tiny": 17, "miniature": 0.3}),
    "medium": W({"medium sized": 55, "medium": 30, "mid sized": 12, "average sized": 0.4}),
    "large": W({"big": 46, "large": 38, "huge": 11, "giant": 3, "enormous": 0.3}),
}

# How often a noun phrase names the object's size class (medium is rarely worth saying).
SIZE_MENTION = {"small": 0.45, "medium": 0.12, "large": 0.5}
COLOR_MENTION = 0.93

BACKGROUND_COLOR_WORDS: dict[str, Weighted[str]] = {
    "white": W({"white": 88, "blank": 10, "snowy": 0.3}),
    "cream": W({"cream": 50, "beige": 45, "ivory": 0.3}),
    "light gray": W({"light gray": 55, "light grey": 25, "pale gray": 18}),
    "light blue": W({"light blue": 65, "pale blue": 30, "sky blue": 4}),
}
BACKGROUND_STYLE_WORDS: dict[str, Weighted[str]] = {
    "plain": W({"": 80, "plain": 18, "solid": 2}),
    "noise": W({"noisy": 50, "grainy": 32, "speckled": 14, "textured": 4}),
    "gradient": W({"gradient": 55, "shaded": 32, "fading": 12, "graduated": 0.3}),
}
BACKGROUND_NOUN = W({"background": 93, "backdrop": 6, "canvas": 0.3})
BACKGROUND_PREPOSITION = W({"on": 75, "against": 20, "over": 5})

RELATION_WORDS: dict[str, Weighted[str]] = {
    "left of": W({"to the left of": 55, "left of": 25, "on the left of": 17,
                  "on the left side of": 3}),
    "right of": W({"to the right of": 55, "right of": 25, "on the right of": 17,
                   "on the right side of": 3}),
    "above": W({"above": 72, "over": 22, "higher than": 5}),
    "below": W({"below": 56, "under": 30, "beneath": 10, "underneath": 4}),
    "next to": W({"next to": 62, "beside": 30, "alongside": 6, "abutting": 0.25}),
    "near": W({"near": 60, "close to": 36, "adjacent to": 3}),
    "above and left of": W({"above and to the left of": 80, "up and to the left of": 20}),
    "above and right of": W({"above and to the right of": 80, "up and to the right of": 20}),
    "below and left of": W({"below and to the left of": 80, "down and to the left of": 20}),
    "below and right of": W({"below and to the right of": 80, "down and to the right of": 20}),
}

POSITION_WORDS: dict[str, Weighted[str]] = {
    "top left": W({"in the top left corner": 50, "in the upper left corner": 22,
                   "at the top left": 22, "in the top left": 6}),
    "top right": W({"in the top right corner": 50, "in the upper right corner": 22,
                    "at the top right": 22, "in the top right": 6}),
    "bottom left": W({"in the bottom left corner": 50, "in the lower left corner": 22,
                      "at the bottom left": 22, "in the bottom left": 6}),
    "bottom right": W({"in the bottom right corner": 50, "in the lower right corner": 22,
                       "at the bottom right": 22, "in the bottom right": 6}),
    "top": W({"at the top": 60, "near the top": 25, "at the top of the image": 15}),
    "bottom": W({"at the bottom": 60, "near the bottom": 25, "at the bottom of the image": 15}),
    "left": W({"on the left": 60, "on the left side": 28, "at the left edge": 12}),
    "right": W({"on the right": 60, "on the right side": 28, "at the right edge": 12}),
    "center": W({"in the center": 46, "in the middle": 40, "in the centre": 10,
                 "in the center of the image": 4}),
}

EXTREME_WORDS: dict[str, Weighted[str]] = {
    "leftmost": W({"leftmost": 60, "left": 40}),
    "rightmost": W({"rightmost": 60, "right": 40}),
    "topmost": W({"top": 55, "topmost": 30, "uppermost": 15}),
    "bottommost": W({"bottom": 55, "lowest": 35, "bottommost": 10}),
    "largest": W({"largest": 45, "biggest": 50, "most prominent": 0.3}),
    "smallest": W({"smallest": 75, "tiniest": 25}),
}

GENERIC_NOUN = W({"shape": 52, "object": 30, "figure": 9, "item": 7, "form": 1.5, "glyph": 0.2})
PICTURE_NOUN = W({"picture": 46, "image": 36, "photo": 10, "drawing": 6, "illustration": 2,
                  "snapshot": 0.2})
PICTURE_VERB = W({"showing": 50, "with": 30, "containing": 15, "depicting": 5})
INTRO = W({"there is": 70, "we see": 15, "you can see": 12, "one can see": 3})
COLORFUL = W({"colorful": 58, "colored": 25, "colourful": 10, "different": 7,
              "multicolored": 0.3})
SINGLE = W({"a single": 55, "one": 30, "a lone": 12, "a solitary": 3})
PAIR = W({"two": 90, "a pair of": 10})
AMONG = W({"among": 45, "along with": 30, "together with": 20, "amid": 5})
ALONE = W({"by itself": 40, "on its own": 40, "alone": 20})

NUMBERS = {1: "one", 2: "two", 3: "three", 4: "four"}
