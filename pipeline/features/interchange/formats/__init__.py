"""The outside feature layouts capstack reads, by name (``capstack import-features FORMAT``).

Each module registers its format with ``@FORMATS.register(name)``, and the writer of a
layout capstack also exports with ``@WRITERS.register(name)``; importing this
package imports every module in it, so adding a format is one new file here
(``base.py`` says what a format is; ``tsv.py``, ``folder.py`` and ``lmdb_source.py``
hold what several share).
"""

from __future__ import annotations

from pipeline.core.registry import Registry, import_modules

FORMATS = Registry("feature format")  # layouts read (import-features)
WRITERS = Registry("export layout")  # layouts written (export-features): a class per layout

import_modules(__name__, __path__)  # each registers itself
