"""The report's page in a browser: ``index.html`` beside the report's files, one self-contained,
offline page (inline script and style, the rows as JSON inside it, images as files beside it).

- sources.py: what an evaluation folder knows of its images (captions, references, image
  files, attention pictures);
- rows.py: one row per image, per-image scores, the words two captions differ in, the ranking;
- files.py: the thumbnails and copied pictures beside the page;
- render.py: the page from page.html, page.css and page.js;
- comparison.py: ``report --compare A B``'s page; report_page.py: ``report EVAL...``'s.
"""

from trainer.evaluation.page.comparison import Compared, compared, write_comparison_page
from trainer.evaluation.page.render import INDEX
from trainer.evaluation.page.report_page import write_report_page

__all__ = ["INDEX", "Compared", "compared", "write_comparison_page", "write_report_page"]
