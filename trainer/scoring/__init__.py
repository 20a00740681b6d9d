"""Scoring captions, below everything that scores them: the rewards, validation, evaluation.

``text.py`` (one line per caption, the PTB and simple tokenizers), ``references.py``
(COCO results and reference files, checked) and ``metrics/`` (the metrics, a registry).
It imports nothing of ``trainer`` outside itself.
"""
