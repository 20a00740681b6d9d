"""Whose test-time rules the bottom-up detector follows: one file per reference implementation.

The network is one (:class:`~pipeline.features.detectors.detector.BottomUpDetector`,
one set of weights); the implementations that published features from it do
different things around it at test time:

``caffe`` (the default)
    Anderson et al.'s ``generate_tsv.py`` on py-faster-rcnn, which made the BUTD
    release's features (and MILVLG's): Caffe's input scaling, anchors centred at
    7.5 with rounded sizes, inclusive-pixel boxes, the proposals kept as the
    regions by the per-class NMS rule. Right for features that must match that
    release.
``mmf``
    facebookresearch/mmf's ``tools/scripts/features/frcnn`` (HuggingFace's LXMERT
    demo extractor): detectron2's input scaling, anchors centred at 0 with
    unrounded sizes (a checkpoint's own anchors when it carries them), detectron2's
    box coding, and the regressed box of each proposal's best class, kept by one
    class-agnostic NMS. For new images beside features MMF or LXMERT made.

``--reference NAME`` picks one (``capstack extract-regions --arch bottom-up``).
"""

from pipeline.core.registry import Registry, import_modules

RULES = Registry("detector reference")
DEFAULT = "caffe"

import_modules(__name__, __path__)  # each file registers its rules
