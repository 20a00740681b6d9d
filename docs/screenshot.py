"""A screenshot of a report's page in headless Chromium, for the docs.

    python docs/screenshot.py reports/compare/index.html docs/images/compare-page.png \
        [--size 1200x1500] [--fragment 'q=circle&filter=a']

The page is loaded as a file (its #fragment sets the search, the filter and the ranking: see
trainer/evaluation/page/page.js) in a window of ``--size``, and the window written as a PNG.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer.evaluation.page.browser import screenshot  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("page", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", default="1200x1500", help="WIDTHxHEIGHT of the window")
    ap.add_argument("--fragment", default="", help="the page's state: q=WORD&filter=a|b|tie")
    args = ap.parse_args(argv)
    width, height = (int(x) for x in args.size.lower().split("x"))
    url = args.page.resolve().as_uri() + (f"#{args.fragment}" if args.fragment else "")
    with tempfile.TemporaryDirectory() as profile:
        print(f"-> {screenshot(url, args.out, Path(profile), size=(width, height))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
