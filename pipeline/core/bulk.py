"""Building millions of Python objects at once (a parsed dataset json, its captions).

CPython's cyclic garbage collector runs a full pass, over every object alive, each time
the objects it tracks have grown by a quarter since the last one. A parse that creates
millions of lists, dicts and tuples, none of them in a cycle, triggers pass after pass that
find nothing: COCO's 117 MB Karpathy json took 9.4 s to ``json.loads`` with the collector
on and 2.3 s with it off, and reading it into captions 18.5 s against 8.0 s
(benchmarks/scale.py). Reference counting frees such objects all the same.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def gc_paused():
    """The cyclic collector off for the block (on again after it, if it was on)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
