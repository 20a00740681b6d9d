"""The words of the free captions (``capstack shapes --captions free``).

More synonyms than ``lexicon``'s and flatter odds, as several people describing
the same picture would use: "box", "block" and "square" all common, "disc" and
"dot" beside "circle", four ways of saying "to the left of". No word is rare on
purpose: every option is weighted so that it is seen more than five times on the
demo's 600 training images (only a few plurals of the rarer synonyms, "discs",
"dots", fall short), and the whole vocabulary stays under two hundred words.
Every word is true of what it names (a filled circle is no "ring"; the ellipse
lies flat; the star has five points; the triangle points up).
"""

from __future__ import annotations

from .chance import Weighted

W = Weighted.of

SHAPE_NOUNS: dict[str, Weighted[str]] = {
    "circle": W({"circle": 48, "disc": 16, "dot": 14, "round shape": 12, "ball": 10}),
    "ellipse": W({"oval": 55, "ellipse": 30, "oval shape": 15}),
    "square": W({"square": 46, "box": 22, "block": 16, "square shape": 16}),
    "diamond": W({"diamond": 62, "rhombus": 22, "diamond shape": 16}),
    "triangle": W({"triangle": 78, "triangular shape": 22}),
    "star": W({"star": 72, "star shape": 16, "five pointed star": 12}),
    "hexagon": W({"hexagon": 78, "six sided shape": 22}),
    "cross": W({"cross": 52, "plus sign": 32, "plus shape": 16}),
}

COLOR_WORDS: dict[str, Weighted[str]] = {
    "red": W({"red": 84, "scarlet": 16}),
    "orange": W({"orange": 1}),
    "yellow": W({"yellow": 82, "golden": 18}),
    "green": W({"green": 1}),
    "blue": W({"blue": 1}),
    "purple": W({"purple": 70, "violet": 30}),
    "pink": W({"pink": 1}),
    "brown": W({"brown": 1}),
    "black": W({"black": 1}),
    "gray": W({"gray": 60, "grey": 40}),
}
# Saturated colours that may be called "bright red", "vivid blue".
BRIGHT_COLORS = frozenset({"red", "orange", "yellow", "green", "blue", "purple", "pink"})
BRIGHT = W({"bright": 75, "vivid": 25})
BRIGHT_P = 0.12
COLORED_P = 0.06       # "a red colored circle"
COLOR_MENTION = 0.9

SIZE_WORDS: dict[str, Weighted[str]] = {
    "small": W({"small": 50, "little": 26, "tiny": 24}),
    "medium": W({"medium sized": 60, "medium": 40}),
    "large": W({"big": 48, "large": 40, "huge": 12}),
}
SIZE_MENTION = {"small": 0.4, "medium": 0.08, "large": 0.45}
BIGGER = W({"bigger": 55, "larger": 45})
SMALLER = W({"smaller": 1})

DEFINITE_P = 0.35      # "the red circle" where the phrase names one object of the scene
ONE_P = 0.1            # "one red circle" for "a red circle", as a subject

RELATION_WORDS: dict[str, Weighted[str]] = {
    "left of": W({"to the left of": 46, "left of": 20, "on the left of": 18,
                  "on the left side of": 16}),
    "right of": W({"to the right of": 46, "right of": 20, "on the right of": 18,
                   "on the right side of": 16}),
    "above": W({"above": 58, "over": 22, "higher than": 20}),
    "below": W({"below": 48, "under": 22, "beneath": 15, "lower than": 15}),
    "next to": W({"next to": 55, "beside": 45}),
    "near": W({"near": 55, "close to": 45}),
    "above and left of": W({"above and to the left of": 55, "to the upper left of": 45}),
    "above and right of": W({"above and to the right of": 55, "to the upper right of": 45}),
    "below and left of": W({"below and to the left of": 55, "to the lower left of": 45}),
    "below and right of": W({"below and to the right of": 55, "to the lower right of": 45}),
}
# The main relations as an adverb precedes them: "directly above", "well to the left of".
ADVERB_RELATION_WORDS: dict[str, Weighted[str]] = {
    "left of": W({"to the left of": 1}),
    "right of": W({"to the right of": 1}),
    "above": W({"above": 75, "over": 25}),
    "below": W({"below": 60, "under": 25, "beneath": 15}),
}
# The same relations said of "it": "a square with a circle to its left".
RELATION_TO_IT: dict[str, Weighted[str]] = {
    "left of": W({"to its left": 60, "on its left": 40}),
    "right of": W({"to its right": 60, "on its right": 40}),
    "above": W({"above it": 75, "over it": 25}),
    "below": W({"below it": 55, "under it": 25, "beneath it": 20}),
    "next to": W({"next to it": 55, "beside it": 45}),
    "near": W({"near it": 50, "close to it": 50}),
    "above and left of": W({"above and to the left of it": 50, "to its upper left": 50}),
    "above and right of": W({"above and to the right of it": 50, "to its upper right": 50}),
    "below and left of": W({"below and to the left of it": 50, "to its lower left": 50}),
    "below and right of": W({"below and to the right of it": 50, "to its lower right": 50}),
}
# Adverbs that sharpen a main relation where the geometry allows it.
ALIGNED = W({"directly": 75, "right": 25})     # "directly above": the other axis barely differs
FAR = W({"far": 55, "well": 45})               # "well to the left of": a wide gap
CLOSE = W({"just": 1})                         # "just above": a narrow gap

POSITION_WORDS: dict[str, Weighted[str]] = {
    "top left": W({"in the top left corner": 36, "in the upper left corner": 22,
                   "at the top left": 22, "in the upper left": 20}),
    "top right": W({"in the top right corner": 36, "in the upper right corner": 22,
                    "at the top right": 22, "in the upper right": 20}),
    "bottom left": W({"in the bottom left corner": 36, "in the lower left corner": 22,
                      "at the bottom left": 22, "in the lower left": 20}),
    "bottom right": W({"in the bottom right corner": 36, "in the lower right corner": 22,
                       "at the bottom right": 22, "in the lower right": 20}),
    "top": W({"at the top": 45, "near the top": 30, "along the top": 25}),
    "bottom": W({"at the bottom": 45, "near the bottom": 30, "along the bottom": 25}),
    "left": W({"on the left": 45, "on the left side": 30, "toward the left": 25}),
    "right": W({"on the right": 45, "on the right side": 30, "toward the right": 25}),
    "center": W({"in the center": 40, "in the middle": 40, "near the center": 20}),
}
# What "the leftmost shape" and the like are called.
EXTREME_WORDS: dict[str, Weighted[str]] = {
    "leftmost": W({"leftmost": 45, "left": 30, "far left": 25}),
    "rightmost": W({"rightmost": 45, "right": 30, "far right": 25}),
    "topmost": W({"top": 50, "highest": 50}),
    "bottommost": W({"bottom": 40, "lowest": 60}),
    "largest": W({"largest": 45, "biggest": 55}),
    "smallest": W({"smallest": 70, "tiniest": 30}),
}

GENERIC_NOUN = W({"shape": 46, "object": 28, "figure": 14, "item": 12})
PICTURE_NOUN = W({"image": 38, "picture": 34, "drawing": 16, "illustration": 12})
THIS = W({"this": 55, "the": 45})
SHOWS = W({"shows": 40, "contains": 22, "has": 16, "depicts": 12, "features": 10})
THERE_IS = W({"there is": 50, "we can see": 20, "you can see": 18, "we see": 12})
SHOWN = W({"shown": 45, "drawn": 30, "visible": 25})         # "... are shown in this image"
VERB_ONE = W({"is": 40, "sits": 16, "is placed": 10, "is located": 10, "lies": 8,
              "is positioned": 6, "appears": 5, "can be seen": 5})
VERB_MANY = W({"are": 45, "sit": 15, "are placed": 15, "are located": 13, "can be seen": 12})
FRONTED_VERB = W({"is": 45, "sits": 25, "there is": 20, "lies": 10})   # "to the left of X sits Y"
COLORFUL = W({"colorful": 60, "colored": 40})
DIFFERENT_COLORS = W({"of different colors": 45, "in different colors": 35,
                      "all in different colors": 20})
FEW = W({"a few": 40, "several": 40, "some": 20})         # three or four things
TWO = W({"two": 75, "a pair of": 13, "a couple of": 12})
SINGLE = W({"a single": 40, "one": 30, "just one": 18, "only one": 12})
ALONE = W({"on its own": 45, "by itself": 35, "alone": 20})
ALONG_WITH = W({"along with": 40, "with": 35, "and": 25})
INCLUDING = W({"including": 55, "among them": 45})

BACKGROUND_COLOR_WORDS: dict[str, Weighted[str]] = {
    "white": W({"white": 1}),
    "cream": W({"cream": 50, "beige": 50}),
    "light gray": W({"light gray": 60, "light grey": 40}),
    "light blue": W({"light blue": 70, "pale blue": 30}),
}
BACKGROUND_STYLE_WORDS: dict[str, Weighted[str]] = {
    "plain": W({"": 70, "plain": 30}),
    "noise": W({"noisy": 45, "grainy": 30, "speckled": 25}),
    "gradient": W({"gradient": 45, "shaded": 35, "fading": 20}),
}
BACKGROUND_NOUN = W({"background": 85, "backdrop": 15})
BACKGROUND_PREPOSITION = W({"on": 70, "against": 30})

NUMBERS = {1: "one", 2: "two", 3: "three", 4: "four"}
