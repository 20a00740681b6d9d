"""Caption text as the metrics and rewards read it: one line per caption, tokenized.

Two tokenizers: the PTB tokenizer of pycocoevalcap (Java; what the evaluation stage
and the papers' tables use), and :func:`simple_tokenize` (Python; what validation
and the rewards use, so that an epoch never waits for a Java start-up), which drops
the punctuation PTB's post-filter drops.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Hashable, Mapping
from typing import TypeVar

Key = TypeVar("Key", bound=Hashable)

JAVA_MISSING = "java not found"

# Characters the simple tokenizer drops. PTB's post-filter removes quotes,
# brackets, sentence punctuation and dashes; in-word hyphens ("t-shirt") stay
# one token there, so they stay here too.
_PUNCT = re.compile(r"""[.,;:!?'"`()\[\]{}/\\]|(?<!\w)-+|-+(?!\w)""")


def java_missing() -> str | None:
    """``None`` when ``java`` is on PATH, else the reason ``"java not found"``."""
    return None if shutil.which("java") else JAVA_MISSING


def simple_tokenize(text: str) -> str:
    """Lowercase, drop punctuation (as PTB's post-filter does), collapse whitespace."""
    return " ".join(_PUNCT.sub(" ", text.lower()).split())


_END = object()  # the key of the end marker caption, never a caller's
_END_CAPTION = "capstackendofcaptions"


def _ptb_tokenize(captions: Mapping[Key, list[str]]) -> dict[Key, list[str]]:
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    wrapped: dict[object, list[dict]] = {k: [{"caption": c} for c in caps]
                                         for k, caps in captions.items()}
    wrapped[_END] = [{"caption": _END_CAPTION}]
    out = PTBTokenizer().tokenize(wrapped)
    # PTB pairs output lines with ids by position and drops lines past the last id (zip): a
    # lost line or an extra one shifts every later caption. The end marker, last in, must
    # come back whole and last.
    if out.pop(_END, None) != [_END_CAPTION] or any(
            len(out.get(k, ())) != len(caps) for k, caps in captions.items()):
        raise RuntimeError("PTB tokenizer's lines out do not match the captions' lines in")
    return out


def one_line(text: str) -> str:
    """``text`` with every run of whitespace as one space, and no ``|``.

    The PTB tokenizer and METEOR read one caption per line, and pair lines with images by
    position: a ``\\r``, U+2028 or U+2029 inside one caption (each of which Java or Python may
    end a line at) made an extra line and shifted every later caption onto another image's
    references (one ``\\r`` in 10 results took CIDEr from 318.9 to 35.3). METEOR's protocol
    separates fields with ``|||``."""
    return " ".join(text.replace("|", " ").split())


def tokenize_any(captions: Mapping[Key, list[str]]) -> tuple[dict[Key, list[str]], str]:
    """Every caption on one line, then tokenized by PTB (Java), or by the simple tokenizer
    when Java is missing or PTB fails; the captions and the tokenizer's name."""
    lines = {k: [one_line(c) for c in caps] for k, caps in captions.items()}
    if java_missing() is None:
        try:
            return _ptb_tokenize(lines), "ptb"
        except Exception as exc:  # noqa: BLE001 - fall back rather than lose the run
            name = f"simple (ptb failed: {type(exc).__name__}: {exc})"
    else:
        name = f"simple ({JAVA_MISSING})"
    return {k: [simple_tokenize(c) for c in caps] for k, caps in lines.items()}, name


def tokenize(captions: dict[int, list[str]]) -> tuple[dict[int, list[str]], str]:
    """PTB-tokenize (Java) or simple-tokenize captions; returns them and the tokenizer's name."""
    return tokenize_any(captions)
