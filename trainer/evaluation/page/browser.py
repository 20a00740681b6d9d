"""A page seen by a real browser: headless Chromium, run as a program (no driver, no Python
package). What the tests, the page's benchmark and the docs' screenshot use.

``chromium --headless=new --dump-dom URL`` prints the document once its scripts have run, which
the page marks (``data-render-ms``, ``data-matching``, ``data-shown`` on ``<html>``:
page.js); ``--enable-logging=stderr`` prints every console message as a ``CONSOLE`` line, so a
script error or a refused load is seen; ``--screenshot`` writes a PNG of the window.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import CapstackError

NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--no-first-run", "--disable-extensions", "--allow-file-access-from-files")
CONSOLE = re.compile(r":CONSOLE[^\]]*\] (.*)")
TIMEOUT = 120  # seconds: a page that takes longer is broken


def chromium() -> str | None:
    """The Chromium program: ``$CAPSTACK_CHROMIUM``, else the first of :data:`NAMES` on PATH;
    None when there is none."""
    given = os.environ.get("CAPSTACK_CHROMIUM")
    if given:
        return given if shutil.which(given) else None
    return next((found for name in NAMES if (found := shutil.which(name))), None)


@dataclass
class Loaded:
    """A page as the browser left it: the document after its scripts ran, the console's
    messages, and the browser's wall time, start to exit."""

    dom: str
    console: list[str]
    seconds: float

    def attribute(self, name: str) -> str | None:
        """``<html>``'s attribute ``name`` (``data-render-ms``), None when absent."""
        head = re.search(r"<html[^>]*>", self.dom)
        found = re.search(rf'\s{re.escape(name)}="([^"]*)"', head.group(0)) if head else None
        return found.group(1) if found else None


def _run(arguments: list[str], profile: Path) -> tuple[str, str, float]:
    import time

    program = chromium()
    if program is None:
        raise CapstackError(f"no Chromium found (tried {', '.join(NAMES)}, and "
                            f"$CAPSTACK_CHROMIUM): install Debian's chromium package")
    command = [program, *FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr",
               "--v=0", *arguments]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT,
                              check=False)
    except subprocess.TimeoutExpired:
        raise CapstackError(f"{arguments[-1]}: Chromium did not finish within {TIMEOUT} s") \
            from None
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise CapstackError(f"{arguments[-1]}: Chromium exited with status {done.returncode}: "
                            f"{done.stderr.strip()[-500:]}")
    return done.stdout, done.stderr, seconds


def load(url: str, profile: Path, *, size: tuple[int, int] = (1200, 900)) -> Loaded:
    """``url`` loaded in a fresh headless Chromium (its profile in ``profile``): the document
    after its scripts ran, and the console."""
    out, err, seconds = _run([f"--window-size={size[0]},{size[1]}", "--dump-dom", url], profile)
    return Loaded(out, [m.group(1) for m in CONSOLE.finditer(err)], seconds)


def screenshot(url: str, out: Path, profile: Path, *, size: tuple[int, int] = (1200, 900)
               ) -> Path:
    """A PNG of ``url`` in a ``size`` window, written to ``out``."""
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    _run([f"--window-size={size[0]},{size[1]}", f"--screenshot={out}", url], profile)
    if not out.is_file():
        raise CapstackError(f"{out}: Chromium wrote no screenshot of {url}")
    return out
