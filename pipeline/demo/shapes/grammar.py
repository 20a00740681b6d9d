"""Small grammar helpers: "a" or "an", plurals, lists, and finishing a sentence."""

from __future__ import annotations

VOWELS = frozenset("aeiou")
# Words that start with a vowel letter but a consonant sound ("a one", "a unique").
CONSONANT_SOUND = frozenset({"one", "once", "unique", "uniform", "unit", "useful", "user"})


def article(phrase: str) -> str:
    """The indefinite article for ``phrase``: "an orange star", "a hexagon", "an oval"."""
    first = phrase.split(" ", 1)[0]
    return "an" if first[:1] in VOWELS and first not in CONSONANT_SOUND else "a"


def with_article(phrase: str) -> str:
    return f"{article(phrase)} {phrase}"


def plural(noun: str) -> str:
    """Plural of a (possibly two-word) noun: "box" -> "boxes", "plus sign" -> "plus signs"."""
    head, _, last = noun.rpartition(" ")
    if last.endswith(("s", "x", "z", "sh", "ch")):
        last += "es"
    elif last.endswith("y") and last[-2:-1] not in VOWELS:
        last = last[:-1] + "ies"
    else:
        last += "s"
    return f"{head} {last}" if head else last


def join_list(parts: list[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    if len(parts) <= 2:
        return " and ".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def sentence(text: str) -> str:
    """One space between words, a capital first letter, a full stop."""
    text = " ".join(text.split())
    return text[:1].upper() + text[1:] + "."
