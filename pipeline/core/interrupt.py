"""Ctrl-C or SIGTERM at a batch boundary: long loops commit whole batches and stop between them.

The first request sets a flag the loop looks at between batches, so nothing
half-written is left. A loop blocked where it never reaches a boundary (an
``open`` of a FIFO, a read from a hung network disk) would then never stop, so
a second request stops it at once, as if no loop were watching: the signal's
usual handler runs (``KeyboardInterrupt``, or capstack's SIGTERM error), the
``with`` blocks unwind, and only the batch in progress is lost.
"""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager


@contextmanager
def stop_at_batch_boundary():
    """While active, a first Ctrl-C or SIGTERM sets ``state["stop"]``; a second one runs the
    handler that was in place before (it raises where the process is)."""
    state = {"stop": False}
    previous = {}

    def handler(signum, frame):
        if not state["stop"]:
            state["stop"] = True
            print(f"\n{signal.Signals(signum).name}: stopping after the batch in progress "
                  f"(send it again to stop at once)", file=sys.stderr, flush=True)
            return
        before = previous.get(signum)
        if callable(before):
            before(signum, frame)
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread: leave signals alone
            pass
    try:
        yield state
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
