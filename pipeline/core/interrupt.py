"""Ctrl-C or SIGTERM at a batch boundary: long loops commit whole batches and stop between them."""

from __future__ import annotations

import signal
from contextlib import contextmanager


@contextmanager
def stop_at_batch_boundary():
    """While active, Ctrl-C or SIGTERM sets ``state["stop"]`` instead of raising inside a
    batch."""
    state = {"stop": False}

    def handler(signum, frame):
        state["stop"] = True

    previous = {}
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
