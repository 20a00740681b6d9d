"""Ctrl-C at a batch boundary: long loops commit whole batches and stop between them."""

from __future__ import annotations

import signal
from contextlib import contextmanager


@contextmanager
def stop_at_batch_boundary():
    """While active, Ctrl-C sets ``state["stop"]`` instead of raising inside a batch."""
    state = {"stop": False}

    def handler(signum, frame):
        state["stop"] = True

    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: leave signals alone
        previous = None
    try:
        yield state
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
