"""``--arch bottom-up``: region features of the Visual Genome bottom-up detector.

The detector is :mod:`pipeline.features.detectors` (Anderson et al.'s Caffe
ResNet C4 with the attribute head): a VG checkpoint in one of the namings it
reads, or one ``capstack train-detector`` wrote. The checkpoint says the rest
(depth, class and attribute counts), so the settings here are the shared
region ones plus what to keep of the attributes and the vocabulary files that
name the classes. Its regions also carry the ``top_attributes`` best
attributes; the store's settings hold the checkpoint's naming and the
detector's whole config, its metadata the class and attribute names.

``reference`` picks whose test-time rules the detector follows
(:mod:`pipeline.features.detectors.rules`): ``caffe`` (generate_tsv.py, the BUTD
release) or ``mmf`` (MMF's / LXMERT's frcnn extractor). The default adds nothing
to the store's settings, so the stores made before the choice keep their names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import cast

from pipeline.core.hashing import md5_of_file
from pipeline.features.detectors.checkpoints import load_detector, missing_checkpoint
from pipeline.features.detectors.regions import BottomUpRegions
from pipeline.features.detectors.rules import DEFAULT as DEFAULT_RULES
from pipeline.features.detectors.rules import RULES
from pipeline.features.detectors.selection import RegionExtractor
from pipeline.features.detectors.vocabulary import label_names
from pipeline.features.extract.kinds import EXTRACTORS
from pipeline.features.extract.kinds.region_base import RegionKind, SharedRegionSettings
from pipeline.vision.backbones import RANDOM


@dataclass
class BottomUpSettings(SharedRegionSettings):
    """``--arch bottom-up``: the shared region settings (``weights``: the checkpoint) and
    what to keep of the attributes and how to name the labels."""

    top_attributes: int = 1  # attributes kept per region, best first
    reference: str = DEFAULT_RULES  # whose test-time rules: caffe | mmf (RULES)
    objects_vocab: str | None = None  # objects_vocab.txt (a name per class)
    attributes_vocab: str | None = None  # attributes_vocab.txt


class BottomUp(RegionKind):
    """the Visual Genome bottom-up detector (Caffe ResNet C4 with attributes; --weights a VG
    checkpoint in MILVLG's or airsplay's naming, or one `capstack train-detector` wrote)"""

    Settings = BottomUpSettings

    def weights_file(self, s: BottomUpSettings) -> tuple[str, str]:
        if not s.weights or s.weights == RANDOM:
            raise missing_checkpoint(Path(s.weights or "--weights"))
        path = Path(s.weights).expanduser().resolve()
        if not path.is_file():
            raise missing_checkpoint(path)
        return str(path), md5_of_file(path)

    def build(self, s: BottomUpSettings, weights_path: str,
              weights_md5: str | None = None) -> BottomUpRegions:
        RULES.get(s.reference)  # an unknown name is refused, naming the known ones
        loaded = load_detector(weights_path, min_size=s.min_size, max_size=s.max_size,
                               md5=weights_md5, rules=s.reference)
        return BottomUpRegions(loaded.detector, min_boxes=s.min_boxes, max_boxes=s.max_boxes,
                               conf_thresh=s.conf_thresh, nms_thresh=s.nms_thresh,
                               top_attributes=s.top_attributes, loaded=loaded)

    def detector_settings(self, s: BottomUpSettings,
                          probe: RegionExtractor) -> tuple[str, dict, dict]:
        probe = cast(BottomUpRegions, probe)  # what this kind's build() made
        loaded = probe.loaded
        assert loaded is not None, "build() gives the extractor the checkpoint it loaded"
        config = loaded.detector.config
        depth = 2 + 3 * sum(config.resnet.blocks)
        objects, attributes = label_names(loaded, s.objects_vocab, s.attributes_vocab)
        settings = {"naming": loaded.naming, "detector": config.to_dict(),
                    "top_attributes": probe.top_attributes}
        if s.reference != DEFAULT_RULES:
            settings["reference"] = s.reference
        about = {**loaded.about(), "objects": objects, "attributes": attributes}
        return f"bottom-up-r{depth}", settings, about


BOTTOM_UP = EXTRACTORS.register("bottom-up")(BottomUp("bottom-up"))
