"""README.md stays a front door, and README and docs/ speak of the software only."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_LINES = 250
# Words that speak of how or when the project was made, not of what it does.
PROCESS_WORDS = re.compile(r"\b(sessions?|today|afternoon|lent|GPU\.md|issue \d+)\b", re.I)


def test_readme_keeps_to_its_length():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_LINES, (f"README.md has {lines} lines, more than {README_LINES}: "
                                   f"move detail to docs/ and link it")


def test_readme_and_docs_speak_of_the_software_only():
    found = [f"{page.relative_to(ROOT)}:{n}: {line.strip()}"
             for page in PAGES
             for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
             if PROCESS_WORDS.search(line)]
    assert not found, "\n".join(found)


def test_the_readme_says_which_papers_have_run_where():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "## The papers: what has run" in readme
    for paper in ("Show and Tell", "Show, Attend and Tell", "Bottom-up", "Stack-Cap", "GRU",
                  "HACap"):
        # not yet: its dataset, weights, GPU hours and disk (benchmarks/real_data_needs.py)
        needs = r"not yet: [^|]+, ~[\d.]+ GPU h, ~[\d.]+ GB"
        assert re.search(rf"^\| {re.escape(paper)}.*\| {needs} \|", readme, re.M), paper
