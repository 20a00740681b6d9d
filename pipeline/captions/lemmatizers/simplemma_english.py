"""``simplemma``: the PyPI package's English dictionaries, word by word, offline."""

from __future__ import annotations

from pipeline.captions.lemmatizers import LEMMATIZERS, Lemmatizer, installed_version
from pipeline.core.errors import CapstackError
from pipeline.core.tokens import SPECIALS

# Installed distributions whose version is part of the code version of every stage whose code
# loads this module (read, not imported, by pipeline/engine/codeversion.py: keep it a literal).
CODE_DISTRIBUTIONS = ("simplemma",)
SIMPLEMMA_RANGE = "simplemma>=2.0,<3"  # pyproject.toml's range


@LEMMATIZERS.register("simplemma")
def simplemma_english() -> Lemmatizer:
    """simplemma's English dictionaries, word by word (PyPI simplemma, offline)."""
    how = (f"install it into capstack's environment: pip install '{SIMPLEMMA_RANGE}' "
           f"(or `make install`, which installs the pinned version)")
    try:
        import simplemma
    except ImportError:
        raise CapstackError(f"prepare --lemmatize: the simplemma package is not installed; "
                            f"{how}") from None
    version = installed_version("simplemma")
    if version is None:
        raise CapstackError(f"prepare --lemmatize: simplemma imports but has no installed "
                            f"version to record (not installed by pip?); {how}")

    def lemma(word: str) -> str:
        if not word or word in SPECIALS or not simplemma.is_known(word, lang="en"):
            return word
        return simplemma.lemmatize(word, lang="en").lower()

    return Lemmatizer("simplemma", version, lemma)
